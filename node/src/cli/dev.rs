//! `shoal dev`: a one-node cluster in a temporary data dir, for trying Shoal
//! on a laptop with no configuration.

use crate::agent::{Agent, StartMode};
use crate::config::Config;
use std::net::SocketAddr;

pub async fn run(api_addr: Option<SocketAddr>, sim_gpus: Option<String>) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("shoal-dev-").tempdir()?;
    let preferred = api_addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7070)));
    // Fall back to a free port when the default one is taken, so `shoal dev`
    // always comes up.
    let api = if api_addr.is_none() && std::net::TcpListener::bind(preferred).is_err() {
        SocketAddr::from(([127, 0, 0, 1], 0))
    } else {
        preferred
    };
    let mut cfg = Config {
        name: Some("dev".into()),
        data_dir: Some(dir.path().join("data")),
        api_addr: api,
        rpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        gossip_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        sim_gpus: Some(sim_gpus.unwrap_or_else(|| "8xH100-80GB".into())),
        ..Config::default()
    };
    // One user's machine: jobs run as that user, root included.
    cfg.executor.jobs_dir = Some(dir.path().join("jobs"));
    cfg.executor.run_as = Some(crate::executor::account::AGENT_USER.into());
    cfg.executor.allow_root = true;
    let agent = Agent::start(cfg, StartMode::Bootstrap).await?;
    let boot = agent
        .bootstrap
        .clone()
        .ok_or_else(|| anyhow::anyhow!("the dev node did not bootstrap"))?;
    println!("Shoal dev cluster is up: one node, 8 simulated H100 GPUs.");
    println!();
    println!("  API       {}", agent.api_url());
    // The token rides in the fragment, which the browser never sends.
    println!(
        "  dashboard {}/#token={}",
        agent.api_url().trim_end_matches('/'),
        boot.admin_token
    );
    println!("  data dir  {} (removed on exit)", dir.path().display());
    println!("  jobs run as you: a single-user node, not for a shared pool");
    println!();
    println!("Point the CLI at it from another terminal:");
    println!();
    println!(
        "  export SHOAL_API={} SHOAL_TOKEN={}",
        agent.api_url(),
        boot.admin_token
    );
    println!("  shoal status");
    println!("  shoal nodes");
    println!();
    println!("Add a node to this cluster (the token is single use and admits a voter; `shoal token create --uses N [--voter]` makes more):");
    println!(
        "  SHOAL_JOIN_TOKEN={} shoal agent --data-dir /tmp/shoal-n2 --name n2 --api-addr 127.0.0.1:0 --rpc-addr 127.0.0.1:0 --gossip-addr 127.0.0.1:0 --join {}",
        boot.join_token,
        agent.rpc_addr()
    );
    println!();
    println!("Press Ctrl-C to stop.");
    crate::cli::wait_for_signal().await;
    agent.shutdown().await;
    drop(dir);
    Ok(())
}
