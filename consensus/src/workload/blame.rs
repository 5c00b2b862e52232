//! Whose fault a gang's failure is: the job's own code, or a node of its
//! gang that died.
//!
//! A collective turns one node's death into every rank's error: when a node
//! of a PyTorch DDP gang is killed, the surviving ranks' next all-reduce
//! fails ("Connection closed by peer") within a fraction of a second and
//! their agents report a non-zero exit, while the failure detector takes
//! seconds to declare the node down. Taken at face value, the first report
//! blames the job, which is not restarted on its own failures. Slurm charges
//! such an end to `NODE_FAIL`, torchrun's agent restarts the worker group;
//! here the verdict waits for the evidence about the gang's nodes.
//!
//! The evidence, all of it in the ledger on every replica:
//! - a rank reported as lost with its node's agent;
//! - a gang node whose member record is not `alive` (suspect, down, left);
//! - a gang node `alive` again after a spell that ended no earlier than
//!   [`UNHEALTHY_LOOKBACK_MS`] before the failure (a partition that healed);
//! - a gang node whose ranks have not reported their exit: an agent that
//!   is alive reports its ranks' ends within its poll, so while such a node
//!   is neither alive-and-reported nor declared down, the verdict waits,
//!   at most [`super::STOP_DEADLINE_MS`] after the failure (far longer than
//!   the detector needs to declare a silent node down, even with its local
//!   health stretching every timeout).
//!
//! [`attribute`] is a pure function of the rank exits, the member records
//! and the ledger clock; `apply` asks it whenever the evidence changes
//! (a rank's report, a member's state, the stop deadline).

use shoal_sdk::MemberState;

use crate::ids::NodeId;

/// How long before a rank's failure an unhealthy spell of a gang node still
/// counts against the node: a collective can block on a peer that stopped
/// answering for up to its own timeout before it raises, and a partition
/// that heals just before the error still caused it.
pub const UNHEALTHY_LOOKBACK_MS: u64 = 10_000;

/// A gang node's member record, as far as health goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeHealth {
    pub state: MemberState,
    /// When the member entered `state`.
    pub since_ms: u64,
    pub joined_at_ms: u64,
}

/// What the ledger knows about one node of a failing gang.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GangNode {
    pub node: NodeId,
    /// Whether every rank of this node has reported its exit.
    pub reported: bool,
    /// Whether a rank of this node was lost with its agent.
    pub lost_with_agent: bool,
    /// `None`: the node is no longer a member at all.
    pub health: Option<NodeHealth>,
}

/// Why a node is blamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeFault {
    /// A rank died with the node's agent.
    LostWithAgent,
    /// The member record says suspect, down or left (or it is gone).
    NotAlive(Option<MemberState>),
    /// Alive again, but it was not around the failure.
    RecentlyUnhealthy,
}

/// The verdict on a gang's first rank failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attribution {
    /// Every node of the gang is known alive and healthy: the job's code
    /// failed on its own.
    OwnFailure,
    /// A node of the gang failed; the job is restarted as after node loss.
    NodeFailure { node: NodeId, fault: NodeFault },
    /// Some node's ranks have not reported and the node is not known to
    /// be dead: wait for its agent, or for the detector's verdict.
    Undecided,
}

/// The verdict on a gang whose first rank failure was recorded at
/// `failed_at_ms`, given what is known of its nodes (in rank order) at
/// `now_ms`. `deadline_ms` is when the ledger stops waiting for reports.
pub fn attribute(
    failed_at_ms: u64,
    gang: &[GangNode],
    now_ms: u64,
    deadline_ms: u64,
) -> Attribution {
    for node in gang {
        if let Some(fault) = node_fault(failed_at_ms, node) {
            return Attribution::NodeFailure {
                node: node.node,
                fault,
            };
        }
    }
    if gang.iter().any(|n| !n.reported) && now_ms < deadline_ms {
        Attribution::Undecided
    } else {
        Attribution::OwnFailure
    }
}

fn node_fault(failed_at_ms: u64, node: &GangNode) -> Option<NodeFault> {
    if node.lost_with_agent {
        return Some(NodeFault::LostWithAgent);
    }
    let Some(health) = node.health else {
        return Some(NodeFault::NotAlive(None));
    };
    if health.state != MemberState::Alive {
        return Some(NodeFault::NotAlive(Some(health.state)));
    }
    // Alive since a later moment than its join: it was not alive just
    // before `since_ms`.
    let recovered = health.since_ms > health.joined_at_ms;
    (recovered && health.since_ms.saturating_add(UNHEALTHY_LOOKBACK_MS) >= failed_at_ms)
        .then_some(NodeFault::RecentlyUnhealthy)
}

impl NodeFault {
    /// A short phrase for the job's reason.
    pub fn describe(self, name: &str) -> String {
        match self {
            NodeFault::LostWithAgent => format!("node {name} lost the gang's ranks with its agent"),
            NodeFault::NotAlive(Some(MemberState::Suspect)) => {
                format!("node {name} stopped answering heartbeats")
            }
            NodeFault::NotAlive(Some(MemberState::Left) | None) => {
                format!("node {name} left the cluster")
            }
            NodeFault::NotAlive(_) => format!("node {name} went down"),
            NodeFault::RecentlyUnhealthy => {
                format!("node {name} was unreachable around the failure")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DEADLINE: u64 = 70_000;

    fn healthy(node: NodeId) -> GangNode {
        GangNode {
            node,
            reported: true,
            lost_with_agent: false,
            health: Some(NodeHealth {
                state: MemberState::Alive,
                since_ms: 0,
                joined_at_ms: 0,
            }),
        }
    }

    fn with_state(node: NodeId, state: MemberState, since_ms: u64) -> GangNode {
        GangNode {
            health: Some(NodeHealth {
                state,
                since_ms,
                joined_at_ms: 0,
            }),
            ..healthy(node)
        }
    }

    #[test]
    fn a_failure_with_every_node_healthy_and_reported_is_the_jobs_own() {
        let gang = [healthy(1), healthy(2)];
        assert_eq!(
            attribute(10_000, &gang, 10_500, DEADLINE),
            Attribution::OwnFailure
        );
    }

    #[test]
    fn a_survivor_failing_before_its_peer_is_declared_down_waits_for_the_verdict() {
        // Node 2 was killed; its rank never reported and the detector has
        // not spoken yet.
        let dead = GangNode {
            reported: false,
            ..healthy(2)
        };
        let gang = [healthy(1), dead];
        assert_eq!(
            attribute(10_000, &gang, 10_400, DEADLINE),
            Attribution::Undecided
        );
        // Suspect, then down: the node is blamed either way.
        for state in [MemberState::Suspect, MemberState::Down] {
            let gang = [healthy(1), with_state(2, state, 11_000)];
            let gang = [
                gang[0],
                GangNode {
                    reported: false,
                    ..gang[1]
                },
            ];
            assert_eq!(
                attribute(10_000, &gang, 12_300, DEADLINE),
                Attribution::NodeFailure {
                    node: 2,
                    fault: NodeFault::NotAlive(Some(state))
                }
            );
        }
    }

    #[test]
    fn a_rank_lost_with_its_agent_blames_the_node_even_if_it_came_back() {
        let back = GangNode {
            lost_with_agent: true,
            ..healthy(2)
        };
        assert_eq!(
            attribute(10_000, &[healthy(1), back], 10_100, DEADLINE),
            Attribution::NodeFailure {
                node: 2,
                fault: NodeFault::LostWithAgent
            }
        );
    }

    #[test]
    fn a_partition_that_healed_around_the_failure_blames_the_node() {
        let failed_at = 30_000;
        let healed = with_state(2, MemberState::Alive, failed_at - 1_000);
        assert_eq!(
            attribute(failed_at, &[healthy(1), healed], failed_at + 100, DEADLINE),
            Attribution::NodeFailure {
                node: 2,
                fault: NodeFault::RecentlyUnhealthy
            }
        );
        // A spell long before the failure is history.
        let long_ago = with_state(2, MemberState::Alive, failed_at - UNHEALTHY_LOOKBACK_MS - 1);
        assert_eq!(
            attribute(
                failed_at,
                &[healthy(1), long_ago],
                failed_at + 100,
                DEADLINE
            ),
            Attribution::OwnFailure
        );
    }

    #[test]
    fn a_node_that_never_reports_and_never_goes_down_is_not_blamed_after_the_deadline() {
        let silent = GangNode {
            reported: false,
            ..healthy(2)
        };
        assert_eq!(
            attribute(10_000, &[healthy(1), silent], DEADLINE, DEADLINE),
            Attribution::OwnFailure
        );
    }

    fn any_state() -> impl Strategy<Value = MemberState> {
        prop_oneof![
            Just(MemberState::Alive),
            Just(MemberState::Suspect),
            Just(MemberState::Down),
            Just(MemberState::Left),
        ]
    }

    fn any_node() -> impl Strategy<Value = GangNode> {
        (
            Just(0),
            any::<bool>(),
            prop::bool::weighted(0.1),
            prop::option::weighted(0.9, (any_state(), 0u64..40_000, 0u64..20_000)),
        )
            .prop_map(|(node, reported, lost_with_agent, health)| GangNode {
                node,
                reported,
                lost_with_agent,
                health: health.map(|(state, since_ms, joined)| NodeHealth {
                    state,
                    since_ms: since_ms.max(joined),
                    joined_at_ms: joined,
                }),
            })
    }

    proptest! {
        /// The job is blamed only when every node is alive, was not
        /// unhealthy around the failure, lost nothing with its agent, and
        /// has reported (or the deadline passed); a node is blamed only
        /// with evidence against it; and it waits only before the deadline.
        #[test]
        fn blame_follows_the_evidence(
            gang in prop::collection::vec(any_node(), 1..6),
            failed_at in 0u64..40_000,
            wait in 0u64..80_000,
        ) {
            // A node holds one place in a gang.
            let gang: Vec<GangNode> = gang
                .into_iter()
                .enumerate()
                .map(|(i, n)| GangNode { node: i as NodeId + 1, ..n })
                .collect();
            let now = failed_at + wait;
            let deadline = failed_at + 60_000;
            match attribute(failed_at, &gang, now, deadline) {
                Attribution::OwnFailure => {
                    for n in &gang {
                        prop_assert!(node_fault(failed_at, n).is_none());
                        prop_assert!(n.reported || now >= deadline);
                    }
                }
                Attribution::NodeFailure { node, fault } => {
                    let blamed = gang.iter().find(|n| n.node == node);
                    prop_assert!(blamed.is_some_and(|n| node_fault(failed_at, n) == Some(fault)));
                    // Only the first node with evidence against it, so the
                    // verdict does not depend on anything else.
                    let first = gang.iter().find_map(|n| node_fault(failed_at, n).map(|_| n.node));
                    prop_assert_eq!(first, Some(node));
                }
                Attribution::Undecided => {
                    prop_assert!(now < deadline);
                    prop_assert!(gang.iter().any(|n| !n.reported));
                    prop_assert!(gang.iter().all(|n| node_fault(failed_at, n).is_none()));
                }
            }
        }
    }
}
