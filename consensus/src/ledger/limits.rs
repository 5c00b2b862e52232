//! How much of the ledger a tenant token may use. Every node holds the
//! whole ledger in memory and every joining node receives it, so a tenant's
//! metadata is a cost every member pays: a job spec, an object's manifest
//! and their counts are bounded per tenant. Checked in `apply`, for commands
//! a tenant token sent (`AsTenant`); admins are trusted with the cluster.
//! Pure: decided from the ledger and the command.
//!
//! [`Limits::DEFAULT`] holds the cluster defaults. An admin overrides four of
//! them per tenant (`shoal tenant set T --max-pending-jobs N --max-objects N
//! --max-manifest-bytes SIZE --max-priority P`, stored in
//! [`TenantLimits`]); the override, when there is one, is the tenant's limit,
//! lower or higher than the default. Each limit counts the tenant's own jobs
//! and objects, not those of the tenants below it.

use crate::ledger::{Command, Ledger};
use crate::workload::{JobSpec, TenantLimits};

/// The bounds; [`Limits::DEFAULT`] is what `apply` enforces unless a
/// tenant's [`TenantLimits`] overrides a bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Jobs waiting (pending or requeued) per tenant.
    pub waiting_jobs: usize,
    /// A job spec's variable parts in bytes: name, command, env, workdir, labels.
    pub job_spec_bytes: usize,
    /// Entries in a job's `env` and in its `required_labels`, each.
    pub job_map_entries: usize,
    /// `mesh:/` objects per tenant.
    pub objects: usize,
    /// One object's manifest.
    pub manifest_bytes: usize,
    /// All of a tenant's manifests together.
    pub tenant_manifest_bytes: usize,
    /// The highest `priority` a tenant token may give a job. Priority orders
    /// a tenant's own jobs only (and lets one of them preempt another of the
    /// same tenant), so the cap keeps room above every tenant-submitted job
    /// for an admin's.
    pub max_priority: i32,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        waiting_jobs: 1_000,
        job_spec_bytes: 64 << 10,
        job_map_entries: 128,
        objects: 10_000,
        manifest_bytes: 4 << 20,
        tenant_manifest_bytes: 64 << 20,
        max_priority: 1_000,
    };

    /// `self` with a tenant's overrides in place of the bounds they set.
    pub fn with_overrides(mut self, tenant: &TenantLimits) -> Limits {
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        if let Some(n) = tenant.max_pending_jobs {
            self.waiting_jobs = n as usize;
        }
        if let Some(n) = tenant.max_objects {
            self.objects = n as usize;
        }
        if let Some(n) = tenant.max_manifest_bytes {
            self.tenant_manifest_bytes = size(n);
        }
        if let Some(p) = tenant.max_priority {
            self.max_priority = p;
        }
        self
    }

    /// The limits of `tenant`: its overrides over [`Limits::DEFAULT`]
    /// (just the defaults for a tenant that does not exist).
    pub fn of(ledger: &Ledger, tenant: &str) -> Limits {
        let base = Limits::DEFAULT;
        match ledger.workload.tenants.get(tenant) {
            Some(t) => base.with_overrides(&t.limits),
            None => base,
        }
    }
}

/// The names (as `shoal tenant set` flags and API fields spell them, less
/// the dashes) of the ledger limits `tenant` overrides; the others are the
/// cluster defaults.
pub fn overridden(tenant: &TenantLimits) -> Vec<String> {
    [
        ("max_pending_jobs", tenant.max_pending_jobs.is_some()),
        ("max_objects", tenant.max_objects.is_some()),
        ("max_manifest_bytes", tenant.max_manifest_bytes.is_some()),
        ("max_priority", tenant.max_priority.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(name, _)| name.to_string())
    .collect()
}

/// What a tenant's own jobs and objects take of the ledger now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub waiting_jobs: usize,
    pub objects: usize,
    pub manifest_bytes: usize,
}

/// [`Usage`] of `tenant`.
pub fn usage(ledger: &Ledger, tenant: &str) -> Usage {
    let waiting_jobs = ledger
        .workload
        .jobs
        .values()
        .filter(|j| j.spec.tenant == tenant && j.state.is_waiting())
        .count();
    let (objects, manifest_bytes) = ledger
        .namespace
        .objects
        .values()
        .filter(|o| o.tenant == tenant)
        .fold((0, 0), |(n, b), o| (n + 1, b + o.manifest.len()));
    Usage {
        waiting_jobs,
        objects,
        manifest_bytes,
    }
}

/// The bytes of a spec's variable parts.
pub fn spec_bytes(spec: &JobSpec) -> usize {
    let map = |m: &std::collections::BTreeMap<String, String>| -> usize {
        m.iter().map(|(k, v)| k.len() + v.len()).sum()
    };
    spec.name.len()
        + spec.tenant.len()
        + spec.command.iter().map(String::len).sum::<usize>()
        + map(&spec.env)
        + spec.workdir.as_ref().map_or(0, String::len)
        + spec.gpu_model.as_ref().map_or(0, String::len)
        + map(&spec.required_labels)
}

/// `Ok` when applying `cmd` keeps the tenant it is for (the job's or the
/// object's, which `access::authorize` has checked the token covers) within
/// its limits; otherwise one line naming the limit and the current use.
pub fn check(ledger: &Ledger, cmd: &Command) -> Result<(), String> {
    check_with(ledger, cmd, &Limits::DEFAULT)
}

/// [`check`] with `base` in place of [`Limits::DEFAULT`] (the tenant's
/// overrides still apply on top).
pub fn check_with(ledger: &Ledger, cmd: &Command, base: &Limits) -> Result<(), String> {
    let limits_of = |tenant: &str| match ledger.workload.tenants.get(tenant) {
        Some(t) => base.with_overrides(&t.limits),
        None => *base,
    };
    match cmd {
        Command::SubmitJob { spec } => {
            let limits = limits_of(&spec.tenant);
            let bytes = spec_bytes(spec);
            let most = limits.job_spec_bytes;
            if bytes > most {
                return Err(format!(
                    "limit: the job spec is {bytes} bytes (name, command, env, workdir and labels together at most {most})"
                ));
            }
            let most = limits.job_map_entries;
            for (what, n) in [
                ("env", spec.env.len()),
                ("required_labels", spec.required_labels.len()),
            ] {
                if n > most {
                    return Err(format!(
                        "limit: the job has {n} {what} entries (at most {most})"
                    ));
                }
            }
            let most = limits.max_priority;
            if spec.priority > most {
                return Err(format!(
                    "limit: priority {} is above the cap of tenant '{}' (at most {most}, --max-priority)",
                    spec.priority, spec.tenant
                ));
            }
            let waiting = usage(ledger, &spec.tenant).waiting_jobs;
            let most = limits.waiting_jobs;
            if waiting >= most {
                return Err(format!(
                    "limit: tenant '{}' has {waiting} jobs waiting (at most {most}, --max-pending-jobs); cancel some or wait for them to start",
                    spec.tenant
                ));
            }
            Ok(())
        }
        Command::PutObject { object, .. } => {
            let limits = limits_of(&object.tenant);
            let size = object.manifest.len();
            let most = limits.manifest_bytes;
            if size > most {
                return Err(format!(
                    "limit: the manifest of mesh:{} is {size} bytes (at most {most})",
                    object.path
                ));
            }
            // A replaced object gives its own room back.
            let path = crate::namespace::normalize(&object.path)?;
            let (count, bytes) = ledger
                .namespace
                .objects
                .values()
                .filter(|o| o.tenant == object.tenant && o.path != path)
                .fold((0usize, 0usize), |(n, b), o| (n + 1, b + o.manifest.len()));
            let most = limits.objects;
            if count >= most {
                return Err(format!(
                    "limit: tenant '{}' has {count} objects (at most {most}, --max-objects)",
                    object.tenant
                ));
            }
            let most = limits.tenant_manifest_bytes;
            if bytes + size > most {
                return Err(format!(
                    "limit: tenant '{}' manifests take {bytes} bytes and this one {size} (at most {most} together, --max-manifest-bytes)",
                    object.tenant,
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{ApplyChecks, LedgerRequest, LedgerResponse, MemberSpec};
    use crate::namespace::MeshObject;
    use crate::workload::TenantUpdate;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const TENANTS: [&str; 3] = ["a", "a-sub", "b"];

    /// The manifest format of these tests: `MF`, a count, that many bytes.
    fn toy_manifest_check(bytes: &[u8]) -> Result<(), String> {
        match bytes {
            [b'M', b'F', n, rest @ ..] if rest.len() == usize::from(*n) => Ok(()),
            _ => Err("not a manifest".into()),
        }
    }

    const CHECKS: ApplyChecks = ApplyChecks {
        manifest: Some(toy_manifest_check),
        skip_plan_validation: false,
    };

    struct Cluster {
        ledger: Ledger,
        index: u64,
    }

    impl Cluster {
        fn new() -> Self {
            let mut c = Cluster {
                ledger: Ledger::new(),
                index: 0,
            };
            c.admin(Command::Bootstrap {
                cluster_id: "c".into(),
                region: "r".into(),
                ca_cert_pem: String::new(),
                admin_token_hash: "admin".into(),
                first_member: 1,
                spec: MemberSpec {
                    name: "n1".into(),
                    rpc_addr: "127.0.0.1:1".into(),
                    api_addr: "127.0.0.1:2".into(),
                    labels: BTreeMap::new(),
                    gpus: vec![shoal_sdk::GpuInfo {
                        index: 0,
                        model: "H100".into(),
                        memory_mb: 81_920,
                        uuid: "GPU-n1-0".into(),
                        allocated_to: None,
                        numa_node: None,
                        nvlink_peers: vec![],
                        mig_enabled: false,
                        health: String::new(),
                        health_reason: None,
                    }],
                    ..MemberSpec::default()
                },
            });
            for (name, parent) in [("a", None), ("a-sub", Some("a")), ("b", None)] {
                let r = c.admin(Command::CreateTenant {
                    name: name.into(),
                    limits: TenantLimits {
                        parent: parent.map(String::from),
                        ..TenantLimits::default()
                    },
                });
                assert_eq!(r, LedgerResponse::Ok);
            }
            c
        }

        fn admin(&mut self, cmd: Command) -> LedgerResponse {
            self.index += 1;
            let req = LedgerRequest {
                now_ms: self.index,
                cmd,
            };
            self.ledger.apply_with(self.index, &req, &CHECKS)
        }

        fn as_tenant(&mut self, tenant: &str, cmd: Command) -> LedgerResponse {
            self.admin(Command::AsTenant {
                tenant: tenant.into(),
                cmd: Box::new(cmd),
            })
        }
    }

    fn spec(tenant: &str) -> JobSpec {
        JobSpec {
            name: "j".into(),
            tenant: tenant.into(),
            nodes: 1,
            gpus_per_node: 1,
            gpu_model: None,
            time_limit_s: 60,
            priority: 0,
            preemptible: true,
            command: vec!["true".into()],
            max_restarts: 0,
            ..JobSpec::default()
        }
    }

    fn object(path: &str, tenant: &str, manifest: Vec<u8>) -> MeshObject {
        MeshObject {
            path: path.into(),
            is_dir: false,
            manifest,
            bytes: 1,
            files: 1,
            holders: vec![1],
            replica: 1,
            tenant: tenant.into(),
            mtime_ms: 0,
        }
    }

    fn manifest(n: u8) -> Vec<u8> {
        let mut m = vec![b'M', b'F', n];
        m.extend(std::iter::repeat_n(7, usize::from(n)));
        m
    }

    fn rejected(r: &LedgerResponse) -> &str {
        match r {
            LedgerResponse::Rejected(m) => m,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn an_admin_override_is_the_tenants_limit_and_the_refusal_names_it() {
        let mut c = Cluster::new();
        let lower = TenantUpdate {
            max_pending_jobs: Some(Some(2)),
            ..TenantUpdate::default()
        };
        let r = c.admin(Command::UpdateTenant {
            name: "a".into(),
            update: lower,
        });
        assert_eq!(r, LedgerResponse::Ok);
        for _ in 0..2 {
            let r = c.as_tenant("a", Command::SubmitJob { spec: spec("a") });
            assert!(matches!(r, LedgerResponse::JobId(_)), "{r:?}");
        }
        let r = c.as_tenant("a", Command::SubmitJob { spec: spec("a") });
        assert_eq!(
            rejected(&r),
            "limit: tenant 'a' has 2 jobs waiting (at most 2, --max-pending-jobs); cancel some or wait for them to start"
        );
        // Its child and the other tenant keep the default; an admin is not held.
        for (tenant, who) in [("a-sub", "a"), ("b", "b")] {
            let r = c.as_tenant(who, Command::SubmitJob { spec: spec(tenant) });
            assert!(matches!(r, LedgerResponse::JobId(_)), "{r:?}");
        }
        let r = c.admin(Command::SubmitJob { spec: spec("a") });
        assert!(matches!(r, LedgerResponse::JobId(_)), "{r:?}");
        // Raised above the default, and back to the default.
        let raise = TenantUpdate {
            max_objects: Some(Some(20_000)),
            max_manifest_bytes: Some(Some(10)),
            ..TenantUpdate::default()
        };
        c.admin(Command::UpdateTenant {
            name: "b".into(),
            update: raise,
        });
        let limits = Limits::of(&c.ledger, "b");
        assert_eq!((limits.objects, limits.tenant_manifest_bytes), (20_000, 10));
        let put = |path: &str, n: u8| Command::PutObject {
            object: object(path, "b", manifest(n)),
            replace: false,
        };
        assert_eq!(c.as_tenant("b", put("/b/x", 3)), LedgerResponse::Ok);
        let r = c.as_tenant("b", put("/b/y", 3));
        assert_eq!(
            rejected(&r),
            "limit: tenant 'b' manifests take 6 bytes and this one 6 (at most 10 together, --max-manifest-bytes)"
        );
        let reset = TenantUpdate {
            max_objects: Some(None),
            max_manifest_bytes: Some(None),
            ..TenantUpdate::default()
        };
        c.admin(Command::UpdateTenant {
            name: "b".into(),
            update: reset,
        });
        assert_eq!(Limits::of(&c.ledger, "b"), Limits::DEFAULT);
        assert_eq!(c.as_tenant("b", put("/b/y", 3)), LedgerResponse::Ok);
        assert_eq!(
            usage(&c.ledger, "b"),
            Usage {
                waiting_jobs: 1,
                objects: 2,
                manifest_bytes: 12,
            }
        );
    }

    #[test]
    fn a_tenant_token_cannot_raise_priority_past_its_cap_and_an_admin_can() {
        let mut c = Cluster::new();
        let at = |priority: i32| {
            let mut s = spec("a");
            s.priority = priority;
            Command::SubmitJob { spec: s }
        };
        let cap = Limits::DEFAULT.max_priority;
        assert!(matches!(
            c.as_tenant("a", at(cap)),
            LedgerResponse::JobId(_)
        ));
        assert!(matches!(
            c.as_tenant("a", at(i32::MIN)),
            LedgerResponse::JobId(_)
        ));
        let r = c.as_tenant("a", at(1_000_000));
        assert_eq!(
            rejected(&r),
            format!("limit: priority 1000000 is above the cap of tenant 'a' (at most {cap}, --max-priority)")
        );
        assert!(matches!(c.admin(at(1_000_000)), LedgerResponse::JobId(_)));
        c.admin(Command::UpdateTenant {
            name: "a".into(),
            update: TenantUpdate {
                max_priority: Some(Some(5)),
                ..TenantUpdate::default()
            },
        });
        assert!(matches!(c.as_tenant("a", at(5)), LedgerResponse::JobId(_)));
        let r = c.as_tenant("a", at(6));
        assert!(
            rejected(&r).contains("(at most 5, --max-priority)"),
            "{r:?}"
        );
        // The cap is the job's tenant's, whoever's token sends it.
        let mut sub = spec("a-sub");
        sub.priority = 6;
        let r = c.as_tenant("a", Command::SubmitJob { spec: sub });
        assert!(matches!(r, LedgerResponse::JobId(_)), "{r:?}");
    }

    #[test]
    fn a_manifest_that_does_not_decode_is_never_stored() {
        let mut c = Cluster::new();
        let garbage = Command::PutObject {
            object: object("/a/bad", "a", vec![0, 1, 2]),
            replace: false,
        };
        let r = c.as_tenant("a", garbage.clone());
        assert_eq!(
            rejected(&r),
            "invalid manifest for mesh:/a/bad: not a manifest"
        );
        // Admins too: a manifest nobody can read helps nobody.
        assert!(rejected(&c.admin(garbage)).starts_with("invalid manifest"));
        assert!(c.ledger.namespace.objects.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Submit {
            token: usize,
            tenant: usize,
            priority: i32,
            env: usize,
            command_bytes: usize,
        },
        Cancel {
            token: usize,
            job: u64,
        },
        Put {
            token: usize,
            tenant: usize,
            path: usize,
            manifest: Vec<u8>,
            replace: bool,
        },
        Remove {
            token: usize,
            path: usize,
        },
        /// An admin changes a tenant's ledger limits (`None`: the default).
        SetLimits {
            tenant: usize,
            pending: Option<u32>,
            objects: Option<u32>,
            bytes: Option<u64>,
            priority: Option<i32>,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        let who = 0..TENANTS.len();
        let manifest = prop_oneof![
            3 => (0u8..120).prop_map(manifest),
            1 => proptest::collection::vec(any::<u8>(), 0..40),
            1 => (1u8..120).prop_map(|n| manifest(n)[..usize::from(n)].to_vec()),
        ];
        let priority = prop_oneof![
            -3i32..4,
            Just(Limits::DEFAULT.max_priority),
            Just(Limits::DEFAULT.max_priority + 1),
            Just(1_000_000),
        ];
        let env = prop_oneof![4 => 0usize..4, 1 => Just(Limits::DEFAULT.job_map_entries + 1)];
        let command_bytes =
            prop_oneof![4 => 0usize..100, 1 => Just(Limits::DEFAULT.job_spec_bytes)];
        prop_oneof![
            4 => (who.clone(), who.clone(), priority, env, command_bytes).prop_map(
                |(token, tenant, priority, env, command_bytes)| Op::Submit {
                    token,
                    tenant,
                    priority,
                    env,
                    command_bytes,
                }
            ),
            2 => (who.clone(), 1u64..30).prop_map(|(token, job)| Op::Cancel { token, job }),
            4 => (who.clone(), who.clone(), 0usize..6, manifest, any::<bool>()).prop_map(
                |(token, tenant, path, manifest, replace)| Op::Put {
                    token,
                    tenant,
                    path,
                    manifest,
                    replace,
                }
            ),
            1 => (who.clone(), 0usize..6).prop_map(|(token, path)| Op::Remove { token, path }),
            1 => (
                who,
                proptest::option::of(0u32..6),
                proptest::option::of(0u32..5),
                proptest::option::of(0u64..400),
                proptest::option::of(-2i32..3),
            )
                .prop_map(|(tenant, pending, objects, bytes, priority)| Op::SetLimits {
                    tenant,
                    pending,
                    objects,
                    bytes,
                    priority,
                }),
        ]
    }

    /// Every tenant's use, by tenant.
    fn uses(l: &Ledger) -> Vec<Usage> {
        TENANTS.iter().map(|t| usage(l, t)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Arbitrary sequences of tenant commands, with an admin changing
        /// tenants' limits between them: no tenant command ever takes a
        /// tenant past its limit in force (a use above it, after an admin
        /// lowered it, only shrinks), every stored job spec is within the
        /// bounds and its priority within the cap in force when it was
        /// submitted, every stored manifest decodes, and every refusal is
        /// one line.
        #[test]
        fn tenant_commands_never_exceed_a_limit_nor_store_an_undecodable_manifest(
            ops in proptest::collection::vec(op(), 1..70)
        ) {
            let mut c = Cluster::new();
            // Paths a tenant's objects live under; the token may point
            // anywhere, including at another tenant's.
            let path = |tenant: &str, n: usize| format!("/{tenant}/o{n}");
            let paths: Vec<String> = (0..6).map(|n| path(TENANTS[n % 3], n)).collect();
            for op in ops {
                let before = uses(&c.ledger);
                let limits_before: Vec<Limits> =
                    TENANTS.iter().map(|t| Limits::of(&c.ledger, t)).collect();
                let (answer, submitted) = match op.clone() {
                    Op::Submit { token, tenant, priority, env, command_bytes } => {
                        let mut s = spec(TENANTS[tenant]);
                        s.priority = priority;
                        s.env = (0..env).map(|k| (format!("K{k}"), "v".into())).collect();
                        s.command = vec!["x".repeat(command_bytes)];
                        let answer = c.as_tenant(TENANTS[token], Command::SubmitJob { spec: s.clone() });
                        (answer, Some((tenant, s)))
                    }
                    Op::Cancel { token, job } => {
                        (c.as_tenant(TENANTS[token], Command::CancelJob { job }), None)
                    }
                    Op::Put { token, tenant, path, manifest, replace } => {
                        let o = object(&paths[path], TENANTS[tenant], manifest);
                        (c.as_tenant(TENANTS[token], Command::PutObject { object: o, replace }), None)
                    }
                    Op::Remove { token, path } => {
                        let cmd = Command::RemoveObject { path: paths[path].clone() };
                        (c.as_tenant(TENANTS[token], cmd), None)
                    }
                    Op::SetLimits { tenant, pending, objects, bytes, priority } => {
                        let update = TenantUpdate {
                            max_pending_jobs: Some(pending),
                            max_objects: Some(objects),
                            max_manifest_bytes: Some(bytes),
                            max_priority: Some(priority),
                            ..TenantUpdate::default()
                        };
                        let r = c.admin(Command::UpdateTenant { name: TENANTS[tenant].into(), update });
                        prop_assert_eq!(&r, &LedgerResponse::Ok);
                        (r, None)
                    }
                };
                if let LedgerResponse::Rejected(m) | LedgerResponse::Denied(m) | LedgerResponse::Hidden(m) = &answer {
                    prop_assert!(!m.is_empty() && !m.contains('\n'), "{:?}", m);
                }
                if let (LedgerResponse::JobId(_), Some((tenant, s))) = (&answer, &submitted) {
                    let limits = limits_before[*tenant];
                    prop_assert!(s.priority <= limits.max_priority, "{:?} above {:?}", s, limits);
                }
                let after = uses(&c.ledger);
                for (i, tenant) in TENANTS.iter().enumerate() {
                    let limits = Limits::of(&c.ledger, tenant);
                    let (b, a) = (before[i], after[i]);
                    prop_assert!(a.waiting_jobs <= b.waiting_jobs.max(limits.waiting_jobs),
                        "{}: {:?} -> {:?} under {:?} after {:?}", tenant, b, a, limits, op);
                    prop_assert!(a.objects <= b.objects.max(limits.objects),
                        "{}: {:?} -> {:?} under {:?} after {:?}", tenant, b, a, limits, op);
                    prop_assert!(a.manifest_bytes <= b.manifest_bytes.max(limits.tenant_manifest_bytes),
                        "{}: {:?} -> {:?} under {:?} after {:?}", tenant, b, a, limits, op);
                }
                for o in c.ledger.namespace.objects.values() {
                    prop_assert!(toy_manifest_check(&o.manifest).is_ok(), "stored {:?}", o);
                    prop_assert!(o.manifest.len() <= Limits::DEFAULT.manifest_bytes);
                }
                for j in c.ledger.workload.jobs.values() {
                    prop_assert!(spec_bytes(&j.spec) <= Limits::DEFAULT.job_spec_bytes);
                    prop_assert!(j.spec.env.len() <= Limits::DEFAULT.job_map_entries);
                }
            }
        }
    }

    #[test]
    fn overrides_replace_only_the_bounds_they_set() {
        let tenant = TenantLimits {
            max_pending_jobs: Some(3),
            max_priority: Some(-5),
            ..TenantLimits::default()
        };
        let limits = Limits::DEFAULT.with_overrides(&tenant);
        assert_eq!(limits.waiting_jobs, 3);
        assert_eq!(limits.max_priority, -5);
        assert_eq!(limits.objects, Limits::DEFAULT.objects);
        assert_eq!(
            limits.tenant_manifest_bytes,
            Limits::DEFAULT.tenant_manifest_bytes
        );
        assert_eq!(overridden(&tenant), ["max_pending_jobs", "max_priority"]);
        assert_eq!(
            Limits::DEFAULT.with_overrides(&TenantLimits::default()),
            Limits::DEFAULT
        );
    }
}
