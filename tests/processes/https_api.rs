//! The API over HTTPS, end to end through the CLI: `shoal login` records
//! the cluster CA, every later command (and every node `cp`, `logs` and
//! `ckpt restore` are sent to) is checked against it, and a node whose
//! certificate the cluster CA did not sign never sees a request, let alone
//! a token.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common::{one_at_a_time, sh_job, shoal_bin, start_cluster, wait_for};
use shoal_mesh::api_tls::ApiCertificate;
use shoal_mesh::CaBundle;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The CLI as a user who has run `shoal login` and nothing else: no
/// SHOAL_API, token, CA file or data dir of a node.
/// Runs the CLI; a `--token T` in `args` goes in `SHOAL_TOKEN` instead, as
/// users pass it (the CLI refuses a token in its arguments).
fn shoal(settings: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(shoal_bin());
    command
        .env_remove("SHOAL_API")
        .env_remove("SHOAL_TOKEN")
        .env_remove("SHOAL_CA_FILE")
        .env("SHOAL_CLI_CONFIG", settings)
        .env("SHOAL_DATA_DIR", settings.with_extension("no-data-dir"));
    crate::common::args_with_token_in(&mut command, args, "SHOAL_TOKEN");
    command.output().expect("run shoal")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{what} was not refused: {err}");
    assert!(err.starts_with("error: "), "{what}: {err}");
    err
}

/// An HTTPS server with a certificate from a CA of its own, counting the
/// bytes of plaintext it was sent after a handshake (none, if every client
/// refuses it).
async fn impostor() -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let ca = CaBundle::generate("impostor").expect("a CA");
    let cert = ApiCertificate::new(&ca.issue("n1", 1).expect("a certificate")).expect("cert");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cert.server_config().expect("tls")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("https://{}", listener.local_addr().expect("addr"));
    let (handshakes, plaintext) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (h, p) = (handshakes.clone(), plaintext.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, h, p) = (acceptor.clone(), h.clone(), p.clone());
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    h.fetch_add(1, Ordering::SeqCst);
                    let mut buf = vec![0u8; 4096];
                    while let Ok(n) = tls.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        p.fetch_add(n, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (url, handshakes, plaintext)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_talks_https_to_every_node_and_only_to_nodes_of_its_cluster_ca() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (nodes, token) = start_cluster(root.path(), &["n1", "n2", "n3"], |_| {
        vec![("SHOAL_API_TLS".to_string(), "on".to_string())]
    })
    .await;
    let url = nodes[0].api_url();
    assert!(url.starts_with("https://"), "{url}");
    let settings = root.path().join("cli.toml");

    // Plain HTTP on the HTTPS port gets nowhere.
    let plain = url.replacen("https://", "http://", 1);
    refused(
        &shoal(&settings, &["--api", &plain, "--token", &token, "status"]),
        "plain http to an https API",
    );

    // Without a login, an https node is not trusted (and no token is sent).
    let err = refused(
        &shoal(&settings, &["--api", &url, "--token", &token, "status"]),
        "an https node with no CA trusted",
    );
    assert!(err.contains("no cluster CA is trusted"), "{err}");

    // A wrong pin is refused and records nothing.
    let wrong = "0".repeat(64);
    refused(
        &shoal(
            &settings,
            &["login", &url, "--token", &token, "--ca-fingerprint", &wrong],
        ),
        "a login pinned to another CA",
    );
    assert!(!settings.exists(), "a refused login wrote its settings");

    // The right pin (what `shoal status` shows on a node) logs in.
    let status = nodes[0].client(&token).status().await.expect("status");
    assert_eq!(status.ca_fingerprint.len(), 64);
    let login = ok(
        &shoal(
            &settings,
            &[
                "login",
                &url,
                "--token",
                &token,
                "--ca-fingerprint",
                &status.ca_fingerprint,
                "--json",
            ],
        ),
        "login",
    );
    let login: serde_json::Value = serde_json::from_str(&login).expect("login JSON");
    assert_eq!(login["cluster_id"], status.cluster_id);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&settings)
        .expect("settings")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the settings hold a token");

    // From here on the settings alone are enough: status, and a replicated
    // copy that goes to (and comes back from) the other nodes' HTTPS APIs.
    ok(&shoal(&settings, &["status"]), "status after login");
    let src = root.path().join("weights.bin");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&src, &data).expect("write");
    let src_s = src.display().to_string();
    let copied = ok(
        &shoal(
            &settings,
            &["cp", "--replica", "3", "--json", &src_s, "mesh:/w.bin"],
        ),
        "cp up",
    );
    let copied: serde_json::Value = serde_json::from_str(&copied).expect("cp JSON");
    assert_eq!(copied["bytes"], 3_000_000);
    let back = root.path().join("back.bin");
    let back_s = back.display().to_string();
    ok(
        &shoal(&settings, &["cp", "mesh:/w.bin", &back_s]),
        "cp down",
    );
    assert_eq!(std::fs::read(&back).expect("read back"), data);

    // A rank on another node: its log comes from that node's HTTPS API.
    let admin = nodes[0].client(&token);
    let id = admin
        .submit_job(&sh_job(3, 1, "echo hello-from-rank-$RANK; sleep 600"))
        .await
        .expect("submit")
        .id;
    let placed = wait_for("the gang running", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let job = admin.job(id).await.ok()?;
            (job.state == "running").then_some(job.nodes)
        }
    })
    .await;
    let rank = placed
        .iter()
        .position(|n| n != "n1")
        .expect("a rank off n1");
    let want = format!("hello-from-rank-{rank}");
    wait_for("the remote rank's log through n1", TIMEOUT, || {
        let out = shoal(
            &settings,
            &["logs", &id.to_string(), "--rank", &rank.to_string()],
        );
        let seen = out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&want);
        async move { seen.then_some(()) }
    })
    .await;

    // Prometheus is told to scrape over https.
    let sd = ok(&shoal(&settings, &["prometheus-sd"]), "prometheus-sd");
    let sd: serde_json::Value = serde_json::from_str(&sd).expect("sd JSON");
    assert_eq!(sd[0]["labels"]["__scheme__"], "https", "{sd}");
    assert_eq!(sd[0]["targets"].as_array().map(Vec::len), Some(3), "{sd}");

    // A node of another CA: the CLI refuses it during the handshake, so it
    // never receives a byte of a request, token included.
    let (fake, handshakes, plaintext) = impostor().await;
    let err = refused(
        &shoal(&settings, &["--api", &fake, "--token", &token, "status"]),
        "a node signed by another CA",
    );
    assert!(err.contains("cannot reach"), "{err}");
    let err = refused(
        &shoal(&settings, &["login", &fake, "--token", &token]),
        "a login to another cluster's CA over the recorded one",
    );
    assert!(err.contains("not signed by the cluster CA"), "{err}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 0);
    assert_eq!(plaintext.load(Ordering::SeqCst), 0);
    admin.cancel_job(id).await.expect("cancel");
}
