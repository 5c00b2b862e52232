//! Which Unix user a rank runs as. A tenant's job is hostile input: it must
//! not run as root or as the agent's user, whose files hold the cluster's
//! keys and tokens, nor as another tenant's user, which could ptrace its
//! ranks, read their environment, signal them and read their files. Under
//! a root agent, ranks run as the tenant's user from `executor.users`, else
//! `executor.run_as` (one user the operator chose for every tenant), else
//! a uid of the tenant's own: a number from [`TENANT_UID_FIRST`] up, given
//! once per tenant on this host and never again, with no `passwd` entry
//! (as Kubernetes' `runAsUser` and systemd's `DynamicUser`). No user is
//! created, so nothing is written under `/etc` (read-only to the agent's
//! unit), and no uid is ever reused: a later tenant cannot inherit files an
//! earlier one left in `/tmp` or `/dev/shm`. An agent that is not root can
//! only run ranks as itself.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// The first uid given to a tenant: far above the uids distributions give
/// to users (1000 up), system users and the subordinate ranges of user
/// namespaces (100000 up, 65536 each), below 2^31 for tools that sign it.
pub const TENANT_UID_FIRST: u32 = 1_700_000_000;
/// The last one.
pub const TENANT_UID_LAST: u32 = 2_000_000_000;
/// Which uid each tenant of this host has, for every agent on it: one line
/// per tenant, `UID CLUSTER/TENANT/CREATED_MS`, appended under an exclusive
/// lock and never rewritten. A tenant removed and created again under the
/// same name is another tenant (another creation time): another uid.
pub const TENANT_UIDS_FILE: &str = "/var/lib/shoal-tenant-uids";
/// Longest user name `useradd` takes everywhere (the name ranks see in
/// `USER`).
const MAX_USER_NAME: usize = 32;
/// `run_as` value meaning the agent's own user.
pub const AGENT_USER: &str = "agent";

/// A Unix account a rank runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// Whom the configuration asks for; pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The agent's own user: no switch.
    Agent,
    /// The named user.
    Named(String),
    /// A uid of the tenant's own (its name, for `USER`).
    Tenant(String),
}

/// The name a tenant's ranks see in `USER` when no mapping is configured:
/// `shoal-t-<tenant>` when that is a portable user name (lower case, digits,
/// `-`, `_`, at most 32 characters), else `shoal-x-` and 16 hex digits of the
/// name's BLAKE3 hash. The two prefixes differ, so no tenant's plain name can
/// equal another's hashed one; distinct tenants get distinct users.
pub fn tenant_user_name(tenant: &str) -> String {
    let plain = format!("shoal-t-{tenant}");
    let portable = !tenant.is_empty()
        && tenant
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_'));
    if portable && plain.len() <= MAX_USER_NAME {
        return plain;
    }
    let hash = blake3::hash(tenant.as_bytes()).to_hex();
    format!("shoal-x-{}", &hash.as_str()[..16])
}

/// The executor's user settings.
#[derive(Clone, Debug, Default)]
pub struct RankUsers {
    pub run_as: Option<String>,
    pub users: BTreeMap<String, String>,
    pub allow_root: bool,
    /// Tenants' uids looked up in [`TENANT_UIDS_FILE`] so far.
    pub known: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u32>>>,
}

/// Who a tenant is on this host: its cluster, name and creation time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantKey {
    pub cluster: String,
    pub tenant: String,
    pub created_at_ms: u64,
}

impl TenantKey {
    fn line_key(&self) -> String {
        format!("{}/{}/{}", self.cluster, self.tenant, self.created_at_ms)
    }
}

/// The uid of `key` in `table` (a [`TENANT_UIDS_FILE`]), and the line to
/// append when it has none yet: the next uid after every one given, so none
/// is ever given twice. `None`: the range is used up. Pure.
pub fn assign_uid(table: &str, key: &str) -> Option<(u32, Option<String>)> {
    let mut highest = None;
    for line in table.lines() {
        let Some((uid, who)) = line.split_once(' ') else {
            continue;
        };
        let Ok(uid) = uid.parse::<u32>() else {
            continue;
        };
        if who == key {
            return Some((uid, None));
        }
        highest = highest.max(Some(uid));
    }
    let next = highest.map_or(TENANT_UID_FIRST, |h: u32| {
        h.saturating_add(1).max(TENANT_UID_FIRST)
    });
    (next <= TENANT_UID_LAST).then(|| (next, Some(format!("{next} {key}\n"))))
}

/// The uid of `key`, from `path` (given it there when it has none), under
/// an exclusive lock so that agents on one host agree.
fn uid_in_file(path: &std::path::Path, key: &str) -> Result<u32, String> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(fail)?;
    // SAFETY: flock on a descriptor we own; released when the file closes.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    let mut table = String::new();
    file.seek(std::io::SeekFrom::Start(0)).map_err(fail)?;
    file.read_to_string(&mut table).map_err(fail)?;
    let (uid, line) = assign_uid(&table, key).ok_or_else(|| {
        format!(
            "{}: every tenant uid from {TENANT_UID_FIRST} to {TENANT_UID_LAST} is given",
            path.display()
        )
    })?;
    if let Some(line) = line {
        file.write_all(line.as_bytes()).map_err(fail)?;
        file.sync_all().map_err(fail)?;
    }
    Ok(uid)
}

impl RankUsers {
    /// The user asked for `tenant`'s ranks, for an agent that is or is not root.
    pub fn choose(&self, tenant: &str, agent_is_root: bool) -> Choice {
        let name = self.users.get(tenant).or(self.run_as.as_ref());
        match name.map(String::as_str) {
            Some(AGENT_USER) => Choice::Agent,
            Some(name) => Choice::Named(name.to_string()),
            None if agent_is_root => Choice::Tenant(tenant_user_name(tenant)),
            None => Choice::Agent,
        }
    }

    /// The account `tenant`'s ranks run under, giving the tenant a uid of
    /// its own on this host when a root agent needs one; an error says why
    /// the rank cannot start.
    pub fn resolve(&self, tenant: &TenantKey) -> Result<Account, String> {
        self.resolve_in(tenant, std::path::Path::new(TENANT_UIDS_FILE))
    }

    /// [`Self::resolve`] with the uid table at `table`.
    pub fn resolve_in(
        &self,
        tenant: &TenantKey,
        table: &std::path::Path,
    ) -> Result<Account, String> {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let account = match self.choose(&tenant.tenant, me == 0) {
            Choice::Agent => by_uid(me)?,
            Choice::Named(name) => by_name(&name)?.ok_or_else(|| {
                format!("no Unix user '{name}' (executor.run_as / executor.users)")
            })?,
            Choice::Tenant(name) => {
                let key = tenant.line_key();
                let known = self.known.lock().ok().and_then(|k| k.get(&key).copied());
                let uid = match known {
                    Some(uid) => uid,
                    None => {
                        let uid = uid_in_file(table, &key)?;
                        if let Ok(mut k) = self.known.lock() {
                            k.insert(key, uid);
                        }
                        uid
                    }
                };
                Account {
                    name,
                    uid,
                    gid: uid,
                    home: PathBuf::from("/nonexistent"),
                }
            }
        };
        check(&account, me, self.allow_root)?;
        Ok(account)
    }
}

/// Refuses what the agent must not do: run a rank as root without
/// `allow_root`, or as another user without being root.
pub fn check(account: &Account, agent_uid: u32, allow_root: bool) -> Result<(), String> {
    if account.uid == 0 && !allow_root {
        return Err(format!(
            "refusing to run a rank as root ('{}'): set executor.run_as to an unprivileged user, or executor.allow_root = true",
            account.name
        ));
    }
    if account.uid != agent_uid && agent_uid != 0 {
        return Err(format!(
            "cannot run ranks as '{}': the agent is not root (set executor.run_as = \"agent\")",
            account.name
        ));
    }
    Ok(())
}

fn account(pw: &libc::passwd) -> Account {
    // SAFETY: getpw*_r filled `pw` with pointers into our buffer, which
    // outlives this call; the strings are NUL-terminated.
    let text = |p: *const libc::c_char| unsafe {
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Account {
        name: text(pw.pw_name),
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        home: PathBuf::from(text(pw.pw_dir)),
    }
}

fn by_name(name: &str) -> Result<Option<Account>, String> {
    let cname = CString::new(name).map_err(|_| format!("invalid user name '{name}'"))?;
    lookup(|pw, buf, out| {
        // SAFETY: valid pointers to our passwd, buffer and result slot.
        unsafe { libc::getpwnam_r(cname.as_ptr(), pw, buf.as_mut_ptr(), buf.len(), out) }
    })
}

fn by_uid(uid: u32) -> Result<Account, String> {
    lookup(|pw, buf, out| {
        // SAFETY: valid pointers to our passwd, buffer and result slot.
        unsafe { libc::getpwuid_r(uid, pw, buf.as_mut_ptr(), buf.len(), out) }
    })?
    .ok_or_else(|| format!("uid {uid} has no passwd entry"))
}

fn lookup(
    call: impl Fn(&mut libc::passwd, &mut [libc::c_char], &mut *mut libc::passwd) -> libc::c_int,
) -> Result<Option<Account>, String> {
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: passwd is plain data; all-zero is a valid (empty) value.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    let rc = call(&mut pw, &mut buf, &mut out);
    if rc != 0 {
        return Err(format!(
            "passwd lookup failed: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok((!out.is_null()).then(|| account(&pw)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(run_as: Option<&str>, per_tenant: &[(&str, &str)]) -> RankUsers {
        RankUsers {
            run_as: run_as.map(String::from),
            users: per_tenant
                .iter()
                .map(|(t, u)| (t.to_string(), u.to_string()))
                .collect(),
            allow_root: false,
            known: Default::default(),
        }
    }

    #[test]
    fn a_root_agent_runs_ranks_as_the_mapped_user_else_run_as_else_the_tenants_own() {
        let u = users(None, &[("vision", "vision")]);
        assert_eq!(u.choose("vision", true), Choice::Named("vision".into()));
        assert_eq!(
            u.choose("speech", true),
            Choice::Tenant("shoal-t-speech".into())
        );
        assert_eq!(u.choose("speech", false), Choice::Agent);
        let u = users(Some("jobs"), &[("dev", AGENT_USER)]);
        assert_eq!(u.choose("speech", true), Choice::Named("jobs".into()));
        assert_eq!(u.choose("dev", true), Choice::Agent);
    }

    #[test]
    fn every_tenant_gets_a_user_name_of_its_own_that_useradd_takes() {
        assert_eq!(tenant_user_name("vision"), "shoal-t-vision");
        assert_eq!(tenant_user_name("team_a-1"), "shoal-t-team_a-1");
        // Upper case, dots and long names are hashed; the prefix differs.
        for odd in ["Vision", "a.b", &"x".repeat(40)] {
            let name = tenant_user_name(odd);
            assert!(name.starts_with("shoal-x-"), "{name}");
            assert_eq!(name.len(), 24);
        }
        assert_ne!(tenant_user_name("Vision"), tenant_user_name("vision"));
        assert_ne!(tenant_user_name("a.b"), tenant_user_name("a-b"));
    }

    proptest::proptest! {
        #[test]
        fn distinct_tenants_never_share_a_user(a in "[a-zA-Z0-9._-]{1,63}", b in "[a-zA-Z0-9._-]{1,63}") {
            let (ua, ub) = (tenant_user_name(&a), tenant_user_name(&b));
            proptest::prop_assert!(ua.len() <= MAX_USER_NAME);
            proptest::prop_assert!(ua.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'));
            if a != b {
                proptest::prop_assert_ne!(ua, ub);
            }
        }
    }

    #[test]
    fn a_tenant_keeps_its_uid_and_no_uid_is_given_twice() {
        let (uid, line) = assign_uid("", "c/vision/1").expect("room");
        assert_eq!(uid, TENANT_UID_FIRST);
        let mut table = line.expect("a new line");
        let (again, none) = assign_uid(&table, "c/vision/1").expect("room");
        assert_eq!((again, none), (uid, None));
        let (speech, line) = assign_uid(&table, "c/speech/2").expect("room");
        assert_eq!(speech, uid + 1);
        table.push_str(&line.expect("a new line"));
        // Removed and created again: another tenant, another uid, never
        // the old one.
        let (vision_again, _) = assign_uid(&table, "c/vision/3").expect("room");
        assert_eq!(vision_again, uid + 2);
        // A damaged line is skipped; the range ends.
        assert_eq!(
            assign_uid("junk\n", "k").map(|(u, _)| u),
            Some(TENANT_UID_FIRST)
        );
        assert_eq!(assign_uid(&format!("{TENANT_UID_LAST} x\n"), "k"), None);
    }

    #[test]
    fn the_uid_table_is_shared_and_kept() {
        let dir = tempfile::tempdir().expect("tmp");
        let table = dir.path().join("uids");
        let key = |tenant: &str| TenantKey {
            cluster: "c".into(),
            tenant: tenant.into(),
            created_at_ms: 7,
        };
        let alpha = uid_in_file(&table, &key("alpha").line_key()).expect("alpha");
        let beta = uid_in_file(&table, &key("beta").line_key()).expect("beta");
        assert_ne!(alpha, beta);
        // Another agent on the host reads the same.
        assert_eq!(
            uid_in_file(&table, &key("alpha").line_key()).expect("alpha"),
            alpha
        );
        assert_eq!(
            uid_in_file(&table, "c/x/1").expect("x"),
            uid_in_file(&table, "c/x/1").expect("x")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&table)
            .expect("table")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn root_needs_allow_root_and_switching_needs_a_root_agent() {
        let root = Account {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
        };
        let job = Account {
            name: "job".into(),
            uid: 999,
            gid: 999,
            home: "/nonexistent".into(),
        };
        assert!(check(&root, 0, false)
            .unwrap_err()
            .contains("refusing to run a rank as root"));
        assert!(check(&root, 0, true).is_ok());
        assert!(check(&job, 0, false).is_ok());
        assert!(check(&job, 1000, false)
            .unwrap_err()
            .contains("the agent is not root"));
        assert!(check(&job, 999, false).is_ok());
    }

    #[test]
    fn the_agents_own_account_is_found() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let account = by_uid(me).expect("own passwd entry");
        assert_eq!(account.uid, me);
        assert_eq!(by_name(&account.name).expect("lookup"), Some(account));
        assert_eq!(by_name("no-such-user-here").expect("lookup"), None);
    }
}
