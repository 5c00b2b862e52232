//! A graceful stop (`agent.shutdown = "drain"`): the node drains itself, so
//! its gangs checkpoint, stop and are placed elsewhere, and waits until it
//! runs no rank; a marker in the data dir makes it undrain itself at its
//! next start. An operator's drain (no marker) is left alone.

use crate::identity::write_private;
use crate::node::Node;
use shoal_consensus::Command;
use std::path::Path;
use std::time::{Duration, Instant};

const MARKER: &str = "drained-on-stop";

/// Whether any allocation still has a rank on this node.
fn runs_ranks(node: &Node) -> bool {
    node.ledger().read().is_ok_and(|d| {
        d.ledger
            .workload
            .holding()
            .any(|(_, alloc)| alloc.nodes.iter().any(|(n, _)| *n == node.id()))
    })
}

/// Drains this node and waits (at most `limit`) until its ranks are gone.
pub async fn drain_before_stop(node: &Node, limit: Duration) {
    let marker = node.data_dir().join(MARKER);
    if let Err(e) = write_private(&marker, b"", 0o600) {
        tracing::warn!(error = %e, "cannot mark the drain; the node will stay drained after its restart");
    }
    let started = Instant::now();
    let drained_at = loop {
        match node
            .ledger()
            .write(Command::SetDrain {
                id: node.id(),
                drain: true,
            })
            .await
        {
            Ok((_, index)) => break index,
            Err(e) if started.elapsed() < limit => {
                tracing::debug!(error = %e.message, "cannot drain this node yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e.message, "stopping without draining: the ledger is unreachable");
                return;
            }
        }
    };
    tracing::info!("draining this node before it stops");
    // The drain was committed through the leader; until this node has
    // applied it, its own ledger may not yet hold a gang placed here just
    // before (placed, committed, not applied here), and "runs no rank"
    // would be read from a ledger that is behind.
    let left = limit.saturating_sub(started.elapsed());
    if let Err(e) = node
        .ledger()
        .raft()
        .wait(Some(left))
        .applied_index_at_least(Some(drained_at), "this node's own drain")
        .await
    {
        tracing::warn!(error = %e, "stopping without draining: this node did not apply its own drain in time");
        return;
    }
    while runs_ranks(node) && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if runs_ranks(node) {
        tracing::warn!("stopping with ranks still placed here: the drain took too long");
    } else {
        tracing::info!("drained: no rank runs here any more");
    }
}

/// At start: undrains the node if its own graceful stop drained it.
pub async fn undrain_after_restart(node: &Node) {
    let marker = node.data_dir().join(MARKER);
    if !Path::new(&marker).exists() {
        return;
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(300) {
        let cmd = Command::SetDrain {
            id: node.id(),
            drain: false,
        };
        if node.ledger().write(cmd).await.is_ok() {
            let _ = std::fs::remove_file(&marker);
            tracing::info!("back in service after a graceful stop");
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tracing::warn!("could not undrain this node after its graceful stop: `shoal undrain` it");
}
