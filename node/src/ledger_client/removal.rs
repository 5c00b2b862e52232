//! Word that this node was removed from the cluster, and the mark that
//! keeps its data dir from starting again.
//!
//! A node that is connected when the others remove it applies its own
//! removal. One that was cut off (or paused) at the time never does: the
//! others take it out of the Raft membership and stop sending to it. It
//! learns it from the first peer that refuses its certificate with
//! [`ErrorCode::Removed`] (its election campaign asks every voter within an
//! election timeout) and stops for good, as etcd's removed member does.
//! Its id, certificate and ranks belong to a member that is gone: it can
//! come back only as a new member, from an empty data dir.

use crate::proto::{ErrorCode, WireError};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;

/// In the data dir of a node that was removed: why, for the next start to
/// refuse with.
pub const MARKER_FILE: &str = "removed";

/// Exit status of an agent that stopped because it was removed (the
/// systemd unit does not restart it: `RestartPreventExitStatus`).
pub const EXIT_STATUS: i32 = 3;

/// Set once, by whichever part of the node first hears of the removal.
#[derive(Clone)]
pub struct RemovalNotice {
    tx: Arc<watch::Sender<Option<String>>>,
}

impl Default for RemovalNotice {
    fn default() -> Self {
        RemovalNotice {
            tx: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl RemovalNotice {
    /// Records the removal if `e` is a peer's refusal of a removed member.
    /// Only an authenticated member sends one, and only once it applied the
    /// removal, which the cluster had committed.
    pub fn note_refusal(&self, peer: impl std::fmt::Display, e: &WireError) {
        if e.code == ErrorCode::Removed {
            self.record(format!("node {peer} refused this node: {}", e.message));
        }
    }

    /// Records the removal; the first reason is kept.
    pub fn record(&self, why: String) {
        self.tx.send_if_modified(|slot| match slot {
            Some(_) => false,
            None => {
                tracing::error!(reason = %why, "this node was removed from the cluster");
                *slot = Some(why);
                true
            }
        });
    }

    /// Why this node was removed, once it heard.
    pub fn get(&self) -> Option<String> {
        self.tx.borrow().clone()
    }

    /// Waits until this node hears of its removal.
    pub async fn wait(&self) -> String {
        let mut rx = self.tx.subscribe();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Marks `data_dir` as a removed node's, so that it never starts again,
/// and deletes the secrets it held for the region's peers: a removed
/// node keeps no credential that acts as the region.
pub fn mark(data_dir: &Path, why: &str) -> std::io::Result<()> {
    crate::identity::write_private(
        &data_dir.join(MARKER_FILE),
        format!("{why}\n").as_bytes(),
        0o600,
    )?;
    crate::federation::secrets::forget_all(data_dir)
}

/// Why `data_dir` belongs to a removed node, if it does.
pub fn marked(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join(MARKER_FILE)).ok()?;
    Some(text.trim().to_string())
}

/// The error a removed node's data dir starts with.
pub fn refusal(data_dir: &Path, why: &str) -> String {
    format!(
        "{} belongs to a node that was removed from the cluster ({why}); it never starts again: start with an empty --data-dir and --join to come back as a new member",
        data_dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_removal_refusal_is_recorded_and_the_first_reason_stays() {
        let notice = RemovalNotice::default();
        notice.note_refusal(2, &WireError::new(ErrorCode::Forbidden, "not a voter"));
        assert_eq!(notice.get(), None, "another refusal is no removal");
        notice.note_refusal(2, &WireError::new(ErrorCode::Removed, "node 3 has left"));
        notice.note_refusal(1, &WireError::new(ErrorCode::Removed, "again"));
        let why = notice.wait().await;
        assert!(why.starts_with("node 2 refused"), "{why}");
        assert_eq!(notice.get(), Some(why));
    }

    #[test]
    fn a_marked_data_dir_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(marked(dir.path()), None);
        mark(dir.path(), "node 2 refused this node").expect("mark");
        assert_eq!(
            marked(dir.path()).as_deref(),
            Some("node 2 refused this node")
        );
    }
}
