//! `shoal doctor` on a node: one line per check, exit 1 when one fails.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{one_at_a_time, shoal_bin, start_cluster, wait_for};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// `shoal doctor --data-dir DIR [--json]`: (exit code, stdout, stderr).
async fn doctor(dir: &Path, json: bool) -> (i32, String, String) {
    let dir: PathBuf = dir.to_path_buf();
    let settings = dir.with_extension("cli.toml");
    tokio::task::spawn_blocking(move || {
        let mut c = Command::new(shoal_bin());
        c.arg("doctor").arg("--data-dir").arg(&dir);
        if json {
            c.arg("--json");
        }
        let out = c
            .env_remove("SHOAL_API")
            .env_remove("SHOAL_TOKEN")
            .env_remove("SHOAL_DATA_DIR")
            .env_remove("SHOAL_CA_FILE")
            .env("SHOAL_CLI_CONFIG", settings)
            .output()
            .expect("run shoal doctor");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("doctor thread")
}

fn line<'a>(stdout: &'a str, check: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(check))
        .unwrap_or_else(|| panic!("no {check} line in:\n{stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_on_a_healthy_node_and_names_a_bad_mode_and_a_dead_peer() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("tmp");
    let tls = |_: &str| vec![("SHOAL_API_TLS".to_string(), "on".to_string())];
    let (mut nodes, _token) = start_cluster(dir.path(), &["n1", "n2"], tls).await;
    let n1 = nodes[0].data_dir.clone();

    let (code, stdout, stderr) = doctor(&n1, false).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    for check in [
        "data-dir", "agent", "reach:n1", "reach:n2", "clock", "nvml", "disk", "cgroups",
    ] {
        let l = line(&stdout, check);
        assert!(l.starts_with("ok "), "{l}");
    }
    assert!(stdout.lines().all(|l| l.starts_with("ok ")), "{stdout}");
    let reach = line(&stdout, "reach:n2");
    assert!(
        reach.contains("https://") && reach.contains("rpc") && reach.contains("gossip alive"),
        "{reach}"
    );
    assert!(line(&stdout, "nvml").contains("simulated"), "{stdout}");

    let (code, stdout, stderr) = doctor(&n1, true).await;
    assert_eq!(code, 0, "{stderr}");
    let checks: Vec<serde_json::Value> = serde_json::from_str(&stdout).expect("--json parses");
    assert!(checks.len() >= 8, "{stdout}");
    for c in &checks {
        assert_eq!(c["ok"], true, "{c}");
        assert!(c["check"].is_string() && c["detail"].is_string(), "{c}");
    }

    std::fs::set_permissions(&n1, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (code, stdout, _) = doctor(&n1, false).await;
    std::fs::set_permissions(&n1, std::fs::Permissions::from_mode(0o700)).expect("chmod back");
    assert_eq!(code, 1, "{stdout}");
    let l = line(&stdout, "data-dir");
    assert!(l.starts_with("FAIL") && l.contains("0755"), "{l}");
    assert!(line(&stdout, "agent").starts_with("ok "), "{stdout}");

    nodes[1].kill9();
    let stdout = wait_for(
        "doctor to find n2 unreachable",
        Duration::from_secs(60),
        || async {
            let (code, stdout, _) = doctor(&n1, false).await;
            (code == 1 && line(&stdout, "reach:n2").starts_with("FAIL")).then_some(stdout)
        },
    )
    .await;
    assert!(line(&stdout, "reach:n1").starts_with("ok "), "{stdout}");
    assert!(line(&stdout, "data-dir").starts_with("ok "), "{stdout}");
}
