//! What the executor decides on a tick, sans-IO: which ranks to kill, stop,
//! signal for a checkpoint or launch, which exits to record without a
//! launch, which checkpoint step to hand to replication, and which waiting
//! exits to report or forget. The loop in `mod.rs` reads the ledger, the
//! peer view, the processes and the files, passes what it saw and the time,
//! and carries out what comes back; nothing here touches a process, a file or
//! a clock.

use super::{RankKey, LOST_WITH_AGENT_EXIT};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// What the ledger asks of one rank it assigned to this node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Assigned {
    /// The allocation asks its ranks to stop.
    pub stop: bool,
    /// The ledger already has this rank's exit.
    pub reported_exit: bool,
    /// Send SIGUSR1 this often to ask for a checkpoint.
    pub ckpt_interval: Option<Duration>,
    /// A previous run of this agent launched the rank (its marker file
    /// exists), and it died with that run.
    pub launch_marker: bool,
    /// The signal to send once before the time limit, and when
    /// (`--signal SIG@SECS`).
    pub warn: Option<(i32, Instant)>,
}

/// A rank this node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Running {
    /// When it was sent SIGTERM, if it was.
    pub term_sent: Option<Instant>,
    /// When it was last sent SIGUSR1 (or started).
    pub last_usr1: Instant,
    /// It was sent the job's `--signal` already.
    pub warned: bool,
}

/// Everything a tick's decisions depend on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Inputs<'a> {
    /// The ranks the ledger assigns to this node.
    pub assigned: &'a BTreeMap<RankKey, Assigned>,
    /// The ranks this node runs.
    pub running: &'a BTreeMap<RankKey, Running>,
    /// Ranks that exited (or never started) whose exit is not reported yet.
    pub exited: &'a BTreeSet<RankKey>,
    /// This node's ledger is not known to be current (see [`super::freshness::fenced`]).
    pub fenced: bool,
    /// SIGTERM → SIGKILL grace of a stopping rank.
    pub grace: Duration,
    pub now: Instant,
}

/// Why a rank is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KillWhy {
    /// This node is self-fenced.
    Fenced,
    /// The rank is no longer assigned to this node (the allocation moved on).
    Moved,
    /// The rank was asked to stop and its grace is over.
    GraceOver,
}

/// Why a rank's exit is recorded without launching it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NotLaunched {
    /// Asked to stop before it was started: a clean stop.
    StoppedBeforeStart,
    /// Launched by a previous run of this agent and died with it.
    LostWithAgent,
}

impl NotLaunched {
    /// The exit code reported for it.
    pub fn code(self) -> i32 {
        match self {
            NotLaunched::StoppedBeforeStart => 0,
            NotLaunched::LostWithAgent => LOST_WITH_AGENT_EXIT,
        }
    }
}

/// One thing to do, in the order [`plan`] returns them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// SIGKILL to the rank's process group.
    Kill { key: RankKey, why: KillWhy },
    /// SIGTERM to the rank's process group; its grace starts now.
    Term { key: RankKey },
    /// SIGUSR1 to the rank's process group: write a checkpoint.
    Usr1 { key: RankKey },
    /// The job's `--signal` to the rank's process group, once, before its
    /// time limit.
    Warn { key: RankKey, signal: i32 },
    /// Restore the checkpoint to resume from, if any, and start the rank.
    Launch { key: RankKey },
    /// Queue the rank's exit for reporting, without launching it.
    ReportExit { key: RankKey, why: NotLaunched },
}

/// The tick's signals, launches and exits without a launch, in order:
///
/// 1. fenced: every running rank is killed;
/// 2. every running rank no longer assigned is killed (a fenced node kills
///    those twice, the second time saying that the allocation moved on);
/// 3. then each assigned rank, in key order, unless this node is fenced, the
///    ledger has its exit, or its exit waits to be reported:
///    - not running and asked to stop: its clean exit is recorded;
///    - not running, launched by a previous agent run: reported lost;
///    - not running: launched;
///    - running: SIGTERM once when asked to stop; SIGKILL once the grace
///      since the SIGTERM is over (in the same tick for a zero grace), and
///      again on every later tick until it is reaped; SIGUSR1 every
///      checkpoint interval until it is sent SIGTERM.
pub(super) fn plan(input: &Inputs) -> Vec<Action> {
    let Inputs {
        assigned,
        running,
        exited,
        fenced,
        grace,
        now,
    } = *input;
    let mut out = Vec::new();
    if fenced {
        for key in running.keys() {
            out.push(Action::Kill {
                key: key.clone(),
                why: KillWhy::Fenced,
            });
        }
    }
    for key in running.keys() {
        if !assigned.contains_key(key) {
            out.push(Action::Kill {
                key: key.clone(),
                why: KillWhy::Moved,
            });
        }
    }
    for (key, a) in assigned {
        if fenced || a.reported_exit || exited.contains(key) {
            continue;
        }
        let key = key.clone();
        match running.get(&key) {
            None if a.stop => out.push(Action::ReportExit {
                key,
                why: NotLaunched::StoppedBeforeStart,
            }),
            None if a.launch_marker => out.push(Action::ReportExit {
                key,
                why: NotLaunched::LostWithAgent,
            }),
            None => out.push(Action::Launch { key }),
            Some(r) => {
                let mut term_sent = r.term_sent;
                if a.stop && term_sent.is_none() {
                    out.push(Action::Term { key: key.clone() });
                    term_sent = Some(now);
                }
                if term_sent.is_some_and(|t| now.saturating_duration_since(t) >= grace) {
                    out.push(Action::Kill {
                        key: key.clone(),
                        why: KillWhy::GraceOver,
                    });
                }
                if let Some((signal, at)) = a.warn {
                    if term_sent.is_none() && !r.warned && now >= at {
                        out.push(Action::Warn {
                            key: key.clone(),
                            signal,
                        });
                    }
                }
                if let Some(every) = a.ckpt_interval {
                    if term_sent.is_none() && now.saturating_duration_since(r.last_usr1) >= every {
                        out.push(Action::Usr1 { key });
                    }
                }
            }
        }
    }
    out
}

/// The checkpoint step of a running rank to hand to replication now: the
/// newest completed step (`done_step`), when it is newer than the step last
/// handed off, the rank is still assigned, no replication is in flight (one
/// step at a time; a later tick takes the newest), and no retry wait after a
/// failure is running.
pub(super) fn checkpoint_to_hand_off(
    done_step: Option<u64>,
    handed_step: Option<u64>,
    assigned: bool,
    replicating: bool,
    retry_after: Option<Instant>,
    now: Instant,
) -> Option<u64> {
    let step = done_step?;
    if handed_step.is_some_and(|s| step <= s) || !assigned {
        return None;
    }
    if replicating || retry_after.is_some_and(|t| now < t) {
        return None;
    }
    Some(step)
}

/// What to do once a rank's process has exited (after its replication in
/// flight settled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AfterExit {
    /// A checkpoint written during the grace period, to record before the
    /// exit releases the allocation.
    pub record_step: Option<u64>,
    /// Queue the exit for reporting; the exit of a rank no longer assigned
    /// is not reported (the ledger moved on from its epoch).
    pub queue_exit: bool,
}

pub(super) fn after_exit(
    assigned: bool,
    done_step: Option<u64>,
    handed_step: Option<u64>,
) -> AfterExit {
    AfterExit {
        record_step: done_step.filter(|step| assigned && handed_step.is_none_or(|s| *step > s)),
        queue_exit: assigned,
    }
}

/// The waiting exits, split into those to report, in key order, and those
/// to forget: the allocation is gone or this node's ledger has the exit.
/// An exit already `sent` (the leader applied it) is neither sent again nor
/// forgotten until this node's ledger shows it: a follower's ledger may lag
/// the leader's, and forgetting the exit earlier would let the next tick
/// take the rank for one that died with a previous agent (its launch marker
/// is there) and report it lost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ExitReports {
    pub report: Vec<(RankKey, i32)>,
    pub forget: Vec<RankKey>,
}

pub(super) fn exit_reports(
    exited: &BTreeMap<RankKey, i32>,
    sent: &BTreeSet<RankKey>,
    assigned: &BTreeMap<RankKey, Assigned>,
) -> ExitReports {
    let mut out = ExitReports::default();
    for (key, code) in exited {
        match assigned.get(key) {
            Some(a) if !a.reported_exit => {
                if !sent.contains(key) {
                    out.report.push((key.clone(), *code));
                }
            }
            _ => out.forget.push(key.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GRACE: Duration = Duration::from_secs(10);

    fn key(job: u64, rank: u32) -> RankKey {
        RankKey {
            job,
            epoch: 1,
            rank,
        }
    }

    /// A time well after the process started, so that instants before it
    /// can be formed.
    fn base() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn running_since(t: Instant) -> Running {
        Running {
            term_sent: None,
            last_usr1: t,
            warned: false,
        }
    }

    struct World {
        assigned: BTreeMap<RankKey, Assigned>,
        running: BTreeMap<RankKey, Running>,
        exited: BTreeSet<RankKey>,
        fenced: bool,
        grace: Duration,
    }

    impl World {
        fn new() -> Self {
            World {
                assigned: BTreeMap::new(),
                running: BTreeMap::new(),
                exited: BTreeSet::new(),
                fenced: false,
                grace: GRACE,
            }
        }

        fn assign(mut self, key: RankKey, a: Assigned) -> Self {
            self.assigned.insert(key, a);
            self
        }

        fn run(mut self, key: RankKey, r: Running) -> Self {
            self.running.insert(key, r);
            self
        }

        fn plan(&self, now: Instant) -> Vec<Action> {
            plan(&Inputs {
                assigned: &self.assigned,
                running: &self.running,
                exited: &self.exited,
                fenced: self.fenced,
                grace: self.grace,
                now,
            })
        }
    }

    fn stopping() -> Assigned {
        Assigned {
            stop: true,
            ..Assigned::default()
        }
    }

    // --- the plan ---

    #[test]
    fn fenced_kills_every_running_rank_and_launches_nothing() {
        let now = base();
        let mut w = World::new()
            .assign(key(1, 0), Assigned::default())
            .assign(key(2, 0), Assigned::default())
            .assign(key(3, 0), stopping())
            .run(key(2, 0), running_since(now - secs(100)));
        w.fenced = true;
        assert_eq!(
            w.plan(now),
            vec![Action::Kill {
                key: key(2, 0),
                why: KillWhy::Fenced
            }]
        );
    }

    #[test]
    fn fenced_and_moved_is_killed_for_both_reasons() {
        let now = base();
        let mut w = World::new()
            .run(key(1, 0), running_since(now))
            .run(key(2, 0), running_since(now))
            .assign(key(2, 0), Assigned::default());
        w.fenced = true;
        assert_eq!(
            w.plan(now),
            vec![
                Action::Kill {
                    key: key(1, 0),
                    why: KillWhy::Fenced
                },
                Action::Kill {
                    key: key(2, 0),
                    why: KillWhy::Fenced
                },
                Action::Kill {
                    key: key(1, 0),
                    why: KillWhy::Moved
                },
            ]
        );
    }

    #[test]
    fn a_rank_no_longer_assigned_is_killed() {
        let now = base();
        let w = World::new()
            .run(key(1, 0), running_since(now))
            // Same job and rank, another epoch: a different allocation.
            .assign(
                RankKey {
                    epoch: 2,
                    ..key(1, 0)
                },
                Assigned::default(),
            );
        assert_eq!(
            w.plan(now),
            vec![
                Action::Kill {
                    key: key(1, 0),
                    why: KillWhy::Moved
                },
                Action::Launch {
                    key: RankKey {
                        epoch: 2,
                        ..key(1, 0)
                    }
                },
            ]
        );
    }

    #[test]
    fn an_assigned_rank_not_running_is_launched_once_running_nothing_happens() {
        let now = base();
        let w = World::new().assign(key(1, 0), Assigned::default());
        assert_eq!(w.plan(now), vec![Action::Launch { key: key(1, 0) }]);
        let w = w.run(key(1, 0), running_since(now));
        assert_eq!(w.plan(now + secs(1000)), vec![]);
    }

    #[test]
    fn the_job_signal_goes_once_before_the_time_limit() {
        let t0 = base();
        let mut warned = Assigned {
            stop: false,
            reported_exit: false,
            ckpt_interval: None,
            launch_marker: false,
            warn: Some((libc::SIGUSR2, t0 + secs(10))),
        };
        let mut w = World::new()
            .assign(key(1, 0), warned)
            .run(key(1, 0), running_since(t0));
        assert_eq!(w.plan(t0 + secs(9)), vec![]);
        let warn = vec![Action::Warn {
            key: key(1, 0),
            signal: libc::SIGUSR2,
        }];
        assert_eq!(w.plan(t0 + secs(10)), warn);
        w.running.get_mut(&key(1, 0)).unwrap().warned = true;
        assert_eq!(w.plan(t0 + secs(11)), vec![]);
        // Not once the rank is stopping.
        warned.stop = true;
        let w = World::new()
            .assign(key(1, 0), warned)
            .run(key(1, 0), running_since(t0));
        assert_eq!(w.plan(t0 + secs(10)), vec![Action::Term { key: key(1, 0) }]);
    }

    #[test]
    fn stop_sends_sigterm_once() {
        let t0 = base();
        let mut w = World::new()
            .assign(key(1, 0), stopping())
            .run(key(1, 0), running_since(t0));
        assert_eq!(w.plan(t0), vec![Action::Term { key: key(1, 0) }]);
        w.running.get_mut(&key(1, 0)).unwrap().term_sent = Some(t0);
        assert_eq!(w.plan(t0 + Duration::from_millis(100)), vec![]);
    }

    #[test]
    fn sigkill_only_once_the_grace_is_over() {
        let t0 = base();
        let w = World::new().assign(key(1, 0), stopping()).run(
            key(1, 0),
            Running {
                term_sent: Some(t0),
                last_usr1: t0 - secs(100),
                warned: false,
            },
        );
        let kill = vec![Action::Kill {
            key: key(1, 0),
            why: KillWhy::GraceOver,
        }];
        assert_eq!(w.plan(t0 + GRACE - Duration::from_nanos(1)), vec![]);
        assert_eq!(w.plan(t0 + GRACE), kill);
        assert_eq!(w.plan(t0 + GRACE + secs(1)), kill);
        // Every tick until it is reaped.
        assert_eq!(w.plan(t0 + GRACE + secs(2)), kill);
    }

    #[test]
    fn a_zero_grace_kills_in_the_tick_of_the_sigterm() {
        let now = base();
        let mut w = World::new()
            .assign(key(1, 0), stopping())
            .run(key(1, 0), running_since(now));
        w.grace = Duration::ZERO;
        assert_eq!(
            w.plan(now),
            vec![
                Action::Term { key: key(1, 0) },
                Action::Kill {
                    key: key(1, 0),
                    why: KillWhy::GraceOver
                }
            ]
        );
    }

    #[test]
    fn sigusr1_every_interval() {
        let t0 = base();
        let every = Assigned {
            ckpt_interval: Some(secs(60)),
            ..Assigned::default()
        };
        let mut w = World::new()
            .assign(key(1, 0), every)
            .run(key(1, 0), running_since(t0));
        assert_eq!(w.plan(t0 + secs(59)), vec![]);
        assert_eq!(w.plan(t0 + secs(60)), vec![Action::Usr1 { key: key(1, 0) }]);
        w.running.get_mut(&key(1, 0)).unwrap().last_usr1 = t0 + secs(60);
        assert_eq!(w.plan(t0 + secs(61)), vec![]);
        assert_eq!(
            w.plan(t0 + secs(120)),
            vec![Action::Usr1 { key: key(1, 0) }]
        );
        // Without an interval, never.
        w.assigned.insert(key(1, 0), Assigned::default());
        assert_eq!(w.plan(t0 + secs(10_000)), vec![]);
    }

    #[test]
    fn no_sigusr1_after_sigterm() {
        let t0 = base();
        let stop_every = Assigned {
            stop: true,
            ckpt_interval: Some(secs(60)),
            ..Assigned::default()
        };
        let mut w = World::new()
            .assign(key(1, 0), stop_every)
            .run(key(1, 0), running_since(t0));
        // Not in the tick of the SIGTERM either.
        assert_eq!(w.plan(t0 + secs(61)), vec![Action::Term { key: key(1, 0) }]);
        w.running.get_mut(&key(1, 0)).unwrap().term_sent = Some(t0 + secs(61));
        assert_eq!(w.plan(t0 + secs(65)), vec![]);
        // A SIGTERM already sent counts even if the stop request went away.
        w.assigned.insert(
            key(1, 0),
            Assigned {
                ckpt_interval: Some(secs(60)),
                ..Assigned::default()
            },
        );
        assert_eq!(w.plan(t0 + secs(66)), vec![]);
    }

    #[test]
    fn asked_to_stop_before_it_started_reports_a_clean_exit() {
        let w = World::new().assign(key(1, 0), stopping());
        let plan = w.plan(base());
        assert_eq!(
            plan,
            vec![Action::ReportExit {
                key: key(1, 0),
                why: NotLaunched::StoppedBeforeStart
            }]
        );
        assert_eq!(NotLaunched::StoppedBeforeStart.code(), 0);
    }

    #[test]
    fn a_launch_marker_from_a_previous_run_reports_it_lost() {
        let marked = Assigned {
            launch_marker: true,
            warn: None,
            ..Assigned::default()
        };
        let w = World::new().assign(key(1, 0), marked);
        assert_eq!(
            w.plan(base()),
            vec![Action::ReportExit {
                key: key(1, 0),
                why: NotLaunched::LostWithAgent
            }]
        );
        assert_eq!(NotLaunched::LostWithAgent.code(), 137);
    }

    #[test]
    fn a_stop_request_wins_over_a_launch_marker() {
        let both = Assigned {
            stop: true,
            launch_marker: true,
            warn: None,
            ..Assigned::default()
        };
        let w = World::new().assign(key(1, 0), both);
        assert_eq!(
            w.plan(base()),
            vec![Action::ReportExit {
                key: key(1, 0),
                why: NotLaunched::StoppedBeforeStart
            }]
        );
    }

    #[test]
    fn an_exit_waiting_to_be_reported_is_not_launched_again() {
        let mut w = World::new().assign(key(1, 0), Assigned::default());
        w.exited.insert(key(1, 0));
        assert_eq!(w.plan(base()), vec![]);
    }

    #[test]
    fn an_exit_the_ledger_has_is_not_launched() {
        let reported = Assigned {
            reported_exit: true,
            ..Assigned::default()
        };
        let w = World::new().assign(key(1, 0), reported);
        assert_eq!(w.plan(base()), vec![]);
        let w = World::new().assign(
            key(1, 0),
            Assigned {
                launch_marker: true,
                warn: None,
                stop: true,
                ..reported
            },
        );
        assert_eq!(w.plan(base()), vec![]);
    }

    #[test]
    fn order_kills_first_then_the_assigned_ranks_in_key_order() {
        let now = base();
        let w = World::new()
            .assign(key(3, 0), Assigned::default())
            .assign(key(1, 1), stopping())
            .assign(key(1, 0), stopping())
            .run(key(1, 1), running_since(now))
            .run(key(0, 0), running_since(now))
            .run(key(9, 0), running_since(now));
        assert_eq!(
            w.plan(now),
            vec![
                Action::Kill {
                    key: key(0, 0),
                    why: KillWhy::Moved
                },
                Action::Kill {
                    key: key(9, 0),
                    why: KillWhy::Moved
                },
                Action::ReportExit {
                    key: key(1, 0),
                    why: NotLaunched::StoppedBeforeStart
                },
                Action::Term { key: key(1, 1) },
                Action::Launch { key: key(3, 0) },
            ]
        );
    }

    // --- checkpoints and exits ---

    #[test]
    fn a_new_checkpoint_is_handed_off_one_at_a_time() {
        let now = base();
        let hand = |done, handed, assigned, replicating, retry| {
            checkpoint_to_hand_off(done, handed, assigned, replicating, retry, now)
        };
        assert_eq!(hand(None, None, true, false, None), None);
        assert_eq!(hand(Some(5), None, true, false, None), Some(5));
        assert_eq!(hand(Some(5), Some(4), true, false, None), Some(5));
        assert_eq!(hand(Some(5), Some(5), true, false, None), None);
        assert_eq!(hand(Some(5), Some(6), true, false, None), None);
        // Not for a rank whose allocation moved on.
        assert_eq!(hand(Some(5), None, false, false, None), None);
        // Not while one is in flight.
        assert_eq!(hand(Some(5), Some(4), true, true, None), None);
        // Not before the retry wait is over; at its end, yes.
        assert_eq!(hand(Some(5), None, true, false, Some(now + secs(1))), None);
        assert_eq!(hand(Some(5), None, true, false, Some(now)), Some(5));
    }

    #[test]
    fn after_an_exit_a_newer_checkpoint_is_recorded_and_the_exit_queued() {
        assert_eq!(
            after_exit(true, Some(7), Some(6)),
            AfterExit {
                record_step: Some(7),
                queue_exit: true
            }
        );
        assert_eq!(after_exit(true, Some(7), None).record_step, Some(7));
        assert_eq!(after_exit(true, Some(7), Some(7)).record_step, None);
        assert_eq!(after_exit(true, None, None).record_step, None);
        // Moved on: neither.
        assert_eq!(
            after_exit(false, Some(7), None),
            AfterExit {
                record_step: None,
                queue_exit: false
            }
        );
    }

    #[test]
    fn exits_are_reported_unless_the_ledger_has_them_or_the_allocation_is_gone() {
        let assigned: BTreeMap<_, _> = [
            (key(1, 0), Assigned::default()),
            (
                key(1, 1),
                Assigned {
                    reported_exit: true,
                    ..Assigned::default()
                },
            ),
        ]
        .into();
        let exited: BTreeMap<_, _> = [(key(1, 1), 0), (key(1, 0), 3), (key(2, 0), 137)].into();
        assert_eq!(
            exit_reports(&exited, &BTreeSet::new(), &assigned),
            ExitReports {
                report: vec![(key(1, 0), 3)],
                forget: vec![key(1, 1), key(2, 0)],
            }
        );
    }

    /// A follower's ledger may not show an exit the leader has applied: the
    /// exit stays waiting (so the rank is neither launched again nor taken
    /// for one lost with a previous agent) without being sent twice, and is
    /// forgotten once this node's ledger has it.
    #[test]
    fn a_sent_exit_waits_for_this_nodes_ledger_without_being_sent_again() {
        let lagging: BTreeMap<_, _> = [(
            key(1, 0),
            Assigned {
                launch_marker: true,
                warn: None,
                ..Assigned::default()
            },
        )]
        .into();
        let exited: BTreeMap<_, _> = [(key(1, 0), 0)].into();
        let sent: BTreeSet<_> = [key(1, 0)].into();
        assert_eq!(
            exit_reports(&exited, &sent, &lagging),
            ExitReports::default()
        );
        let waiting: BTreeSet<_> = exited.keys().cloned().collect();
        let running = BTreeMap::new();
        let actions = plan(&Inputs {
            assigned: &lagging,
            running: &running,
            exited: &waiting,
            fenced: false,
            grace: GRACE,
            now: base(),
        });
        assert!(actions.is_empty(), "{actions:?}");
        let caught_up: BTreeMap<_, _> = [(
            key(1, 0),
            Assigned {
                reported_exit: true,
                launch_marker: true,
                warn: None,
                ..Assigned::default()
            },
        )]
        .into();
        assert_eq!(
            exit_reports(&exited, &sent, &caught_up).forget,
            vec![key(1, 0)]
        );
    }

    // --- properties ---

    /// A small key space, so that assigned, running and exited overlap.
    fn any_key() -> impl Strategy<Value = RankKey> {
        (0u64..3, 0u64..2, 0u32..2).prop_map(|(job, epoch, rank)| RankKey { job, epoch, rank })
    }

    fn any_assigned() -> impl Strategy<Value = Assigned> {
        (
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0u64..20_000),
            any::<bool>(),
        )
            .prop_map(|(stop, reported_exit, every, launch_marker)| Assigned {
                stop,
                reported_exit,
                ckpt_interval: every.map(Duration::from_millis),
                launch_marker,
                warn: None,
            })
    }

    /// Offsets in milliseconds before (and a little after) `now`.
    fn any_running() -> impl Strategy<Value = (Option<i64>, i64)> {
        (proptest::option::of(-1_000i64..30_000), -1_000i64..30_000)
    }

    fn at(now: Instant, ms_ago: i64) -> Instant {
        if ms_ago >= 0 {
            now - Duration::from_millis(ms_ago as u64)
        } else {
            now + Duration::from_millis(ms_ago.unsigned_abs())
        }
    }

    impl Action {
        fn key(&self) -> &RankKey {
            match self {
                Action::Kill { key, .. }
                | Action::Term { key }
                | Action::Usr1 { key }
                | Action::Warn { key, .. }
                | Action::Launch { key }
                | Action::ReportExit { key, .. } => key,
            }
        }
    }

    fn is_kill(a: &Action) -> bool {
        matches!(a, Action::Kill { .. })
    }

    fn is_term(a: &Action) -> bool {
        matches!(a, Action::Term { .. })
    }

    proptest! {
        #[test]
        fn plan_invariants(
            assigned in proptest::collection::btree_map(any_key(), any_assigned(), 0..8),
            running in proptest::collection::btree_map(any_key(), any_running(), 0..8),
            exited in proptest::collection::btree_set(any_key(), 0..4),
            fenced in any::<bool>(),
            grace_ms in 0u64..20_000,
        ) {
            let now = base();
            let running: BTreeMap<RankKey, Running> = running
                .into_iter()
                .map(|(k, (term, usr1))| {
                    (k, Running { term_sent: term.map(|t| at(now, t)), last_usr1: at(now, usr1), warned: false })
                })
                .collect();
            let grace = Duration::from_millis(grace_ms);
            let plan = plan(&Inputs {
                assigned: &assigned,
                running: &running,
                exited: &exited,
                fenced,
                grace,
                now,
            });
            let has = |key: &RankKey, f: &dyn Fn(&Action) -> bool| {
                plan.iter().any(|a| a.key() == key && f(a))
            };
            for action in &plan {
                let key = action.key();
                match action {
                    Action::Launch { .. } => {
                        prop_assert!(!fenced, "launch while fenced");
                        prop_assert!(assigned.contains_key(key) && !running.contains_key(key));
                        prop_assert!(!exited.contains(key) && !assigned[key].reported_exit);
                        let killed = has(key, &is_kill);
                        prop_assert!(!killed, "launched and killed");
                    }
                    Action::ReportExit { why, .. } => {
                        prop_assert!(!fenced);
                        prop_assert!(assigned.contains_key(key) && !running.contains_key(key));
                        prop_assert!(!exited.contains(key) && !assigned[key].reported_exit);
                        prop_assert_eq!(
                            *why == NotLaunched::StoppedBeforeStart,
                            assigned[key].stop
                        );
                    }
                    Action::Kill { why, .. } => {
                        prop_assert!(running.contains_key(key));
                        match why {
                            KillWhy::Fenced => prop_assert!(fenced),
                            KillWhy::Moved => prop_assert!(!assigned.contains_key(key)),
                            KillWhy::GraceOver => {
                                let sent_long_ago = running[key]
                                    .term_sent
                                    .is_some_and(|t| now.saturating_duration_since(t) >= grace);
                                let sent_now_no_grace = grace.is_zero() && has(key, &is_term);
                                prop_assert!(sent_long_ago || sent_now_no_grace);
                            }
                        }
                    }
                    Action::Term { .. } => {
                        prop_assert!(running[key].term_sent.is_none());
                        prop_assert!(assigned[key].stop && !fenced);
                    }
                    Action::Warn { .. } => {
                        prop_assert!(running[key].term_sent.is_none() && !running[key].warned);
                    }
                    Action::Usr1 { .. } => {
                        prop_assert!(running[key].term_sent.is_none());
                        let termed = has(key, &is_term);
                        prop_assert!(!termed, "SIGUSR1 in the tick of the SIGTERM");
                        let every = assigned[key].ckpt_interval;
                        let since = now.saturating_duration_since(running[key].last_usr1);
                        let due = every.is_some_and(|e| since >= e);
                        prop_assert!(due, "SIGUSR1 before its interval");
                    }
                }
            }
            // Fenced: every running rank is killed first.
            if fenced {
                let fenced_kills: Vec<_> = plan
                    .iter()
                    .take(running.len())
                    .map(Action::key)
                    .collect();
                prop_assert_eq!(fenced_kills, running.keys().collect::<Vec<_>>());
            }
            // Each assigned, runnable rank not running gets exactly one of
            // launch or exit report.
            for (key, a) in &assigned {
                let decided = plan
                    .iter()
                    .filter(|x| {
                        x.key() == key
                            && matches!(x, Action::Launch { .. } | Action::ReportExit { .. })
                    })
                    .count();
                let runnable = !fenced
                    && !a.reported_exit
                    && !exited.contains(key)
                    && !running.contains_key(key);
                prop_assert_eq!(decided, usize::from(runnable));
            }
        }
    }
}
