//! A ledger snapshot written by an earlier build restores in this one.
//!
//! `data/ledger-snapshot-v14.bin` was written by the build before the
//! ledger became a tree of modules (commit 4ff0eb9), from the ledger that
//! [`populated`] builds: members, tokens of both kinds, attributes, tenants,
//! a held job, an event, a `mesh:/` object, a peer region and an
//! exactly-once write. This build must decode it to the ledger it builds
//! from the same commands, field for field. Regenerate only when the
//! snapshot format version changes on purpose (and keep the old file, with
//! its decoder, for as long as that version is read):
//! `SHOAL_WRITE_SNAPSHOT_FIXTURE=consensus/tests/data/ledger-snapshot-vN.bin
//! cargo test -p shoal-consensus --test snapshot_compat`.

use shoal_consensus::events::{EventSpec, Severity};
use shoal_consensus::federation::PeerRegion;
use shoal_consensus::ledger::{Command, Ledger, LedgerRequest, LedgerResponse, MemberSpec};
use shoal_consensus::namespace::MeshObject;
use shoal_consensus::once::WriteId;
use shoal_consensus::store::{decode_snapshot, encode_snapshot, StateMachineData};
use shoal_consensus::workload::{JobSpec, TenantLimits};
use shoal_sdk::GpuInfo;

fn member(name: &str, port: u16) -> MemberSpec {
    MemberSpec {
        name: name.into(),
        rpc_addr: format!("127.0.0.1:{port}"),
        api_addr: format!("127.0.0.1:{}", port + 1),
        gpus: (0..2)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-{name}-{index}"),
                model: "H100".into(),
                memory_mb: 81_920,
                allocated_to: None,
                numa_node: Some(index / 2),
                nvlink_peers: vec![1 - index],
                mig_enabled: false,
                health: "ok".into(),
                health_reason: None,
            })
            .collect(),
        protocol_min: 1,
        protocol_max: 6,
        ..Default::default()
    }
}

/// Applies `cmd` at `index`, stamped `now_ms`, and fails on a refusal.
fn apply(l: &mut Ledger, index: u64, now_ms: u64, cmd: Command) -> LedgerResponse {
    let answer = l.apply(index, &LedgerRequest { now_ms, cmd });
    assert!(
        !matches!(
            answer,
            LedgerResponse::Rejected(_) | LedgerResponse::Denied(_) | LedgerResponse::Hidden(_)
        ),
        "entry {index} refused: {answer:?}"
    );
    answer
}

fn populated() -> Ledger {
    let mut l = Ledger::new();
    let t = 1_700_000_000_000;
    let mut i = 0;
    let mut next = |l: &mut Ledger, cmd: Command| {
        i += 1;
        apply(l, i, t + i * 1_000, cmd)
    };
    next(
        &mut l,
        Command::Bootstrap {
            cluster_id: "c-golden".into(),
            region: "eu-1".into(),
            ca_cert_pem: "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----".into(),
            admin_token_hash: "a".repeat(64),
            first_member: 1,
            spec: member("n1", 7000),
        },
    );
    next(
        &mut l,
        Command::CreateJoinToken {
            hash: "b".repeat(64),
            expires_at_ms: t + 86_400_000,
            uses: 2,
        },
    );
    next(
        &mut l,
        Command::AddMember {
            spec: member("n2", 7010),
            token_hash: "b".repeat(64),
        },
    );
    next(
        &mut l,
        Command::PutAttr {
            key: "site".into(),
            value: "hall-b".into(),
        },
    );
    next(
        &mut l,
        Command::CreateTenant {
            name: "lab".into(),
            limits: TenantLimits {
                max_gpus: Some(4),
                ..TenantLimits::default()
            },
        },
    );
    next(
        &mut l,
        Command::CreateApiToken {
            hash: "c".repeat(64),
            name: "lab-ci".into(),
            tenant: Some("lab".into()),
            expires_at_ms: None,
        },
    );
    let job = match next(
        &mut l,
        Command::SubmitJob {
            spec: JobSpec {
                name: "train".into(),
                tenant: "lab".into(),
                nodes: 2,
                gpus_per_node: 2,
                time_limit_s: 3_600,
                command: vec!["python".into(), "train.py".into()],
                max_restarts: 3,
                ..JobSpec::default()
            },
        },
    ) {
        LedgerResponse::JobId(job) => job,
        other => panic!("submit answered {other:?}"),
    };
    next(&mut l, Command::HoldJob { job, hold: true });
    next(
        &mut l,
        Command::RecordEvent(EventSpec {
            severity: Severity::Warning,
            kind: "gpu_ecc_sbe".into(),
            node: Some(2),
            gpu: Some(1),
            job: None,
            message: "correctable ECC errors".into(),
            resource: None,
        }),
    );
    next(
        &mut l,
        Command::PutObject {
            object: MeshObject {
                path: "/data/shard-0".into(),
                is_dir: false,
                manifest: vec![1, 2, 3],
                bytes: 3,
                files: 1,
                holders: vec![1, 2],
                replica: 2,
                tenant: "default".into(),
                mtime_ms: t,
            },
            replace: false,
        },
    );
    next(
        &mut l,
        Command::AddPeerRegion {
            peer: PeerRegion {
                name: "us-1".into(),
                cluster_id: "c-peer".into(),
                ca_cert_pem: "-----BEGIN CERTIFICATE-----\npeer\n-----END CERTIFICATE-----".into(),
                api_urls: vec!["https://10.0.0.1:7070".into()],
                outbound_secret_hash: "d".repeat(64),
                inbound_token_hash: "e".repeat(64),
                joined_at_ms: t,
            },
        },
    );
    next(
        &mut l,
        Command::Once {
            id: WriteId {
                origin: 2,
                nonce: 42,
            },
            cmd: Box::new(Command::PutAttr {
                key: "owner".into(),
                value: "ops".into(),
            }),
        },
    );
    l
}

#[test]
fn a_snapshot_of_the_earlier_build_restores_to_the_same_ledger() {
    let built = populated();
    if let Ok(path) = std::env::var("SHOAL_WRITE_SNAPSHOT_FIXTURE") {
        let data = StateMachineData {
            ledger: built.clone(),
            ..StateMachineData::default()
        };
        let bytes = encode_snapshot(&data).expect("encode");
        std::fs::write(&path, bytes).expect("write the fixture");
    }
    let fixture = include_bytes!("data/ledger-snapshot-v14.bin");
    let restored = decode_snapshot(fixture).expect("the earlier build's snapshot decodes");
    assert_eq!(restored.ledger, built);
    let again = decode_snapshot(&encode_snapshot(&restored).expect("encode")).expect("decode");
    assert_eq!(again.ledger, built, "a restored ledger encodes to itself");
}
