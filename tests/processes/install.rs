//! `shoal install` into a directory standing in for a new machine's root
//! (no systemd runs there, so nothing is started): what it writes and with
//! which modes, the unit checked by `systemd-analyze verify` where that tool
//! exists, refusals that write nothing, the installed binary starting a
//! node from the installed settings alone and telling systemd it is ready
//! over `$NOTIFY_SOCKET`, and `shoal uninstall` keeping the data unless
//! `--purge`.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common::{free_port, one_at_a_time, shoal_bin};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn shoal(args: &[&str]) -> Output {
    Command::new(shoal_bin())
        .args(args)
        .output()
        .expect("run shoal")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn files_under(root: &Path) -> usize {
    std::fs::read_dir(root).map(|d| d.count()).unwrap_or(0)
}

/// Waits for one datagram on `sock` that contains `want`.
fn wait_notify(sock: &UnixDatagram, want: &str, timeout: Duration) -> String {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let start = Instant::now();
    let mut buf = [0u8; 512];
    while start.elapsed() < timeout {
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg.contains(want) {
                return msg;
            }
        }
    }
    panic!("no {want:?} from the agent within {timeout:?}");
}

/// Starts the agent installed under `root` from its installed settings,
/// with its data dir there, on loopback `port` (API over TCP, RPC over UDP).
fn run_installed_at(
    root: &Path,
    bin: &Path,
    notify: &Path,
    port: u16,
    env: &[(&str, String)],
) -> std::process::Child {
    Command::new(bin)
        .args(["agent", "--config"])
        .arg(root.join("etc/shoal/node.toml"))
        .arg("--data-dir")
        .arg(root.join("var/lib/shoal"))
        .env("SHOAL_API_ADDR", format!("127.0.0.1:{port}"))
        .env("SHOAL_RPC_ADDR", format!("127.0.0.1:{port}"))
        .env("SHOAL_GOSSIP_ADDR", "127.0.0.1:0")
        .env("SHOAL_SIM_GPUS", "2xH100-80GB")
        .env("SHOAL_EXECUTOR__RUN_AS", "agent")
        .env("SHOAL_EXECUTOR__ALLOW_ROOT", "true")
        .env("SHOAL_EXECUTOR__JOBS_DIR", root.join("var/lib/shoal-jobs"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("NOTIFY_SOCKET", notify)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the installed agent")
}

#[test]
fn install_writes_a_node_that_starts_from_its_settings_and_uninstall_takes_it_back() {
    let _serial = one_at_a_time();
    let tmp = tempfile::tempdir().expect("tempdir");

    // Refusals write nothing: no start mode, settings that do not load.
    let empty = tmp.path().join("refused");
    std::fs::create_dir(&empty).expect("mkdir");
    let root_s = empty.display().to_string();
    let out = shoal(&["install", "--root", &root_s]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: say how this node starts"));
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "raft = { heartbeat_ms = 1000 }\n").expect("write");
    let out = shoal(&[
        "install",
        "--root",
        &root_s,
        "--bootstrap",
        "--config",
        &bad.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let shallow = tmp.path().join("shallow.toml");
    std::fs::write(&shallow, "data_dir = \"/var\"\n").expect("write");
    let out = shoal(&[
        "install",
        "--root",
        &root_s,
        "--bootstrap",
        "--config",
        &shallow.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be a node's directory"));
    assert_eq!(files_under(&empty), 0, "a refused install wrote files");

    // A purge deletes only what is a node's, whatever the settings name.
    let other = tmp.path().join("other");
    std::fs::create_dir_all(other.join("etc/shoal")).expect("mkdir");
    std::fs::create_dir_all(other.join("srv/data")).expect("mkdir");
    std::fs::write(other.join("srv/data/precious"), b"not shoal's").expect("write");
    std::fs::write(
        other.join("etc/shoal/node.toml"),
        "data_dir = \"/srv/data\"\n",
    )
    .expect("write");
    let out = shoal(&[
        "uninstall",
        "--root",
        &other.display().to_string(),
        "--purge",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        other.join("srv/data/precious").exists(),
        "a purge deleted foreign data"
    );

    // A joiner: the token is kept 0600 in the data dir (the agent's, where
    // it may delete it once spent) and named by the settings.
    let joiner = tmp.path().join("joiner");
    let out = shoal(&[
        "install",
        "--root",
        &joiner.display().to_string(),
        "--join",
        "10.0.0.1:7071",
        "--join-token-file",
        &secret_file(tmp.path(), "sj1.secret.pin"),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(summary["started"], false);
    let token_file = joiner.join("var/lib/shoal/join.token");
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(mode(&joiner.join("var/lib/shoal")), 0o700);
    assert_eq!(
        std::fs::read_to_string(&token_file).expect("token"),
        "sj1.secret.pin"
    );
    assert!(!joiner.join("etc/shoal/join.token").exists());
    let settings = std::fs::read_to_string(joiner.join("etc/shoal/node.toml")).expect("settings");
    let cfg: shoal_node::Config = toml::from_str(&settings).expect("the settings load");
    assert_eq!(
        cfg.first_start.join,
        Some("10.0.0.1:7071".parse().expect("addr"))
    );
    assert_eq!(
        cfg.first_start.join_token_file.as_deref(),
        Some(Path::new("/var/lib/shoal/join.token"))
    );
    // Installing again before the first start: the token is no stranger.
    let again = shoal(&[
        "install",
        "--root",
        &joiner.display().to_string(),
        "--join",
        "10.0.0.1:7071",
        "--join-token-file",
        &secret_file(tmp.path(), "sj1.secret.pin"),
    ]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // An unused token goes with the uninstall, even when the data stays.
    let out = shoal(&["uninstall", "--root", &joiner.display().to_string()]);
    assert!(out.status.success(), "{out:?}");
    assert!(!token_file.exists(), "uninstall left an unused join token");

    // The first node of a cluster.
    let root = tmp.path().join("node");
    let root_s = root.display().to_string();
    let out = shoal(&["install", "--root", &root_s, "--bootstrap"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = root.join("usr/local/bin/shoal");
    assert_eq!(mode(&bin), 0o755);
    assert_eq!(
        std::fs::read(&bin).expect("installed binary"),
        std::fs::read(shoal_bin()).expect("this binary")
    );
    let data = root.join("var/lib/shoal");
    assert_eq!(mode(&data), 0o700);
    assert_eq!(
        mode(&root.join("var/lib")),
        0o755,
        "parents stay traversable"
    );
    let unit =
        std::fs::read_to_string(root.join("etc/systemd/system/shoal.service")).expect("unit");
    assert_eq!(unit, shoal_node::cli::install::UNIT);
    for line in [
        "Type=notify",
        "Restart=on-failure",
        "LimitNOFILE=",
        "ProtectSystem=",
        "Delegate=yes",
        "ExecStart=/usr/local/bin/shoal agent --config /etc/shoal/node.toml",
    ] {
        assert!(unit.contains(line), "the unit lacks {line}");
    }
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        // Verified with ExecStart pointing at a binary that exists here;
        // every other line as installed. Warnings count as failures.
        let copy = tmp.path().join("shoal.service");
        let here = unit.replace(
            "ExecStart=/usr/local/bin/shoal",
            &format!("ExecStart={}", bin.display()),
        );
        std::fs::write(&copy, here).expect("write");
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&copy)
            .output()
            .expect("systemd-analyze");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && said.trim().is_empty(), "{said}");
    }

    // The installed binary starts a node from the installed settings alone
    // ([first_start] bootstraps it) and says READY=1 to systemd.
    let run_installed = |notify: &Path| run_installed_at(&root, &bin, notify, free_port(), &[]);
    let notify = tmp.path().join("notify");
    let sock = UnixDatagram::bind(&notify).expect("bind");
    let mut agent = run_installed(&notify);
    let ready = wait_notify(&sock, "READY=1", Duration::from_secs(60));
    assert!(ready.contains("STATUS=serving; leader"), "{ready}");
    assert!(
        data.join("admin.token").exists(),
        "[first_start] did not bootstrap"
    );
    let _ = agent.kill();
    let _ = agent.wait();
    // From then on it restarts from its data dir: first_start is ignored.
    let port = free_port();
    let mut agent = run_installed_at(&root, &bin, &notify, port, &[]);
    wait_notify(&sock, "READY=1", Duration::from_secs(60));

    // A second machine joins it from its own install: the token, spent at
    // the first start, is deleted from disk once the node has joined, and
    // the node restarts without it.
    let admin = std::fs::read_to_string(data.join("admin.token")).expect("admin token");
    let created = Command::new(shoal_bin())
        .args(["token", "create", "--json"])
        .env("SHOAL_API", format!("http://127.0.0.1:{port}"))
        .env("SHOAL_TOKEN", admin.trim())
        .output()
        .expect("shoal token create");
    assert!(created.status.success(), "{created:?}");
    let created: serde_json::Value = serde_json::from_slice(&created.stdout).expect("json");
    let token = created["token"].as_str().expect("a join token").to_string();
    let second = tmp.path().join("second");
    let out = shoal(&[
        "install",
        "--root",
        &second.display().to_string(),
        "--join",
        &format!("127.0.0.1:{port}"),
        "--join-token-file",
        &secret_file(tmp.path(), &token),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second_data = second.join("var/lib/shoal");
    let spent = second_data.join("join.token");
    assert_eq!(std::fs::read_to_string(&spent).expect("token"), token);
    let second_bin = second.join("usr/local/bin/shoal");
    // The settings name /var/lib/shoal/join.token; here it is under `second`.
    let moved = [
        (
            "SHOAL_FIRST_START__JOIN_TOKEN_FILE",
            spent.display().to_string(),
        ),
        ("SHOAL_NAME", "second".to_string()),
    ];
    let notify2 = tmp.path().join("notify2");
    let sock2 = UnixDatagram::bind(&notify2).expect("bind");
    let mut joined = run_installed_at(&second, &second_bin, &notify2, free_port(), &moved);
    let ready = wait_notify(&sock2, "READY=1", Duration::from_secs(60));
    assert!(ready.contains("STATUS=serving; leader"), "{ready}");
    assert!(second_data.join("identity.json").exists(), "did not join");
    assert!(!spent.exists(), "the spent join token stayed on disk");
    let _ = joined.kill();
    let _ = joined.wait();
    let mut joined = run_installed_at(&second, &second_bin, &notify2, free_port(), &moved);
    let ready = wait_notify(&sock2, "READY=1", Duration::from_secs(60));
    assert!(ready.contains("STATUS=serving; leader"), "{ready}");
    let _ = joined.kill();
    let _ = joined.wait();
    let _ = agent.kill();
    let _ = agent.wait();

    // A second install with a start mode would clobber a node: refused.
    let out = shoal(&["install", "--root", &root_s, "--bootstrap"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds a node identity"));
    // Without one it upgrades in place, keeping the node's settings.
    let settings_path = root.join("etc/shoal/node.toml");
    let mut custom = std::fs::read_to_string(&settings_path).expect("settings");
    custom.push_str("\n[scheduler]\ninterval_ms = 250\n");
    std::fs::write(&settings_path, &custom).expect("write");
    let out = shoal(&["install", "--root", &root_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&settings_path).expect("settings"),
        custom
    );

    // Uninstall keeps the data; --purge deletes it.
    let out = shoal(&["uninstall", "--root", &root_s, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!bin.exists() && !root.join("etc/systemd/system/shoal.service").exists());
    assert!(!root.join("etc/shoal").exists());
    assert!(
        data.join("identity.json").exists(),
        "uninstall lost the node's data"
    );
    let out = shoal(&["uninstall", "--root", &root_s, "--purge"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!data.exists());
}

/// A join token in a file only its owner reads, for `--join-token-file`.
fn secret_file(dir: &Path, token: &str) -> String {
    let path = dir.join(format!("token-{}", token.len()));
    std::fs::write(&path, token).expect("write the token");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path.display().to_string()
}
