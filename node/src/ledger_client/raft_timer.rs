//! Raft's timer runs only on the nodes that act on it.
//!
//! openraft ticks every 1.5 heartbeat intervals on every node, and each tick
//! is a turn of its loop that publishes its metrics. A tick matters only to
//! a voter (its election timeout) and to a leader (its heartbeats, and its
//! step-down once a membership without it commits); to a learner or a
//! relayed member, the bulk of a large pool, it is four idle wake-ups a
//! second for nothing. So the timer runs while this node is a voter in its
//! effective membership or is not a plain follower, and stops otherwise.

use shoal_consensus::types::Raft;
use shoal_consensus::NodeId;

/// Whether node `me` needs Raft's timer: it votes in `voters`, or its Raft
/// `state` is anything but following (a leader stepping down after its own
/// removal still needs its ticks to do so).
pub fn needs_timer(
    me: NodeId,
    mut voters: impl Iterator<Item = NodeId>,
    state: openraft::ServerState,
) -> bool {
    let following = matches!(
        state,
        openraft::ServerState::Follower | openraft::ServerState::Learner
    );
    !following || voters.any(|id| id == me)
}

/// Turns the timer on and off as this node's role changes, until Raft shuts
/// down. The timer starts on: a node that becomes a voter turns it on
/// before it could have missed an election timeout, since the change
/// reaches this loop the moment Raft appends the membership entry.
pub async fn tick_only_where_needed(raft: Raft, me: NodeId) {
    let mut server = raft.server_metrics();
    let mut ticking = true;
    loop {
        let needed = {
            let m = server.borrow_and_update();
            needs_timer(me, m.membership_config.membership().voter_ids(), m.state)
        };
        if needed != ticking {
            raft.runtime_config().tick(needed);
            ticking = needed;
        }
        if server.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::ServerState;

    #[test]
    fn only_a_voter_or_a_node_in_office_needs_the_timer() {
        let voters = [1, 2, 3];
        assert!(needs_timer(2, voters.into_iter(), ServerState::Follower));
        assert!(!needs_timer(7, voters.into_iter(), ServerState::Learner));
        assert!(!needs_timer(7, voters.into_iter(), ServerState::Follower));
        // Removed from the voters while leading: it must still step down.
        assert!(needs_timer(7, voters.into_iter(), ServerState::Leader));
        assert!(needs_timer(7, voters.into_iter(), ServerState::Candidate));
    }
}
