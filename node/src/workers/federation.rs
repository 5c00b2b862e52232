//! The summary pull loop: every `federation.summary_interval_ms` this node
//! asks each peer region for its summary, all peers at once, each bounded
//! by `federation.request_timeout_ms`, so one lost region delays nobody.

use crate::node::Node;
use crate::worker::Worker;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

pub struct SummaryPull {
    pub node: Arc<Node>,
}

impl Worker for SummaryPull {
    fn period(&self) -> Duration {
        Duration::from_millis(self.node.config().federation.summary_interval_ms)
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let peers = crate::regions::peers(&self.node);
        let names: Vec<String> = peers.iter().map(|p| p.name.clone()).collect();
        self.node.federation().update(|t| t.retain(&names));
        let pulls = peers.iter().map(|peer| {
            let node = self.node.clone();
            async move {
                if let Err(e) = crate::regions::refresh_peer(&node, peer).await {
                    tracing::debug!(region = %peer.name, error = %e, "no summary from a peer region");
                }
            }
        });
        futures::future::join_all(pulls).await;
        ControlFlow::Continue(())
    }
}
