use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

fn entry(client: u32, op: RegisterOp, at: (u64, u64), outcome: Outcome) -> Entry {
    Entry {
        client,
        op,
        invoked_ms: at.0,
        completed_ms: at.1,
        outcome,
    }
}

fn write_op(key: &str, value: &str) -> RegisterOp {
    RegisterOp::Write {
        key: key.into(),
        value: value.into(),
    }
}

fn write(client: u32, value: &str, at: (u64, u64)) -> Entry {
    entry(client, write_op("k", value), at, Outcome::Ok(None))
}

fn unknown_write(client: u32, value: &str, at: (u64, u64)) -> Entry {
    entry(
        client,
        write_op("k", value),
        at,
        Outcome::Unknown("timed out".into()),
    )
}

fn failed_write(client: u32, value: &str, at: (u64, u64)) -> Entry {
    entry(
        client,
        write_op("k", value),
        at,
        Outcome::Failed("not the leader".into()),
    )
}

fn read_key(key: &str, client: u32, value: Option<&str>, at: (u64, u64)) -> Entry {
    entry(
        client,
        RegisterOp::Read { key: key.into() },
        at,
        Outcome::Ok(value.map(String::from)),
    )
}

fn read(client: u32, value: Option<&str>, at: (u64, u64)) -> Entry {
    read_key("k", client, value, at)
}

fn assert_ok(history: &[Entry]) {
    let violations = check_registers(history);
    assert!(violations.is_empty(), "unexpected: {violations:#?}");
}

/// The single violation of `history`, which must be a `linearizable` one.
fn the_violation(history: &[Entry]) -> String {
    let violations = check_registers(history);
    assert_eq!(violations.len(), 1, "{violations:#?}");
    assert_eq!(violations[0].property, "linearizable");
    violations[0].detail.clone()
}

#[test]
fn empty_and_unset_histories_are_linearizable() {
    assert_ok(&[]);
    assert_ok(&[read(1, None, (0, 5)), read(2, None, (3, 9))]);
}

#[test]
fn sequential_history_is_linearizable() {
    assert_ok(&[
        read(1, None, (0, 5)),
        write(1, "a", (10, 20)),
        read(2, Some("a"), (30, 40)),
        write(2, "b", (50, 60)),
        read(1, Some("b"), (70, 80)),
        read(3, Some("b"), (90, 95)),
    ]);
}

#[test]
fn concurrent_history_is_linearizable() {
    // w(b), read b, w(a), read a is an order within every interval.
    assert_ok(&[
        write(1, "a", (0, 50)),
        write(2, "b", (10, 60)),
        read(3, Some("b"), (20, 70)),
        read(3, Some("a"), (75, 80)),
        read(4, None, (0, 12)),
    ]);
}

#[test]
fn equal_timestamps_are_concurrent() {
    assert_ok(&[write(1, "a", (0, 10)), read(2, None, (10, 20))]);
    let detail = the_violation(&[write(1, "a", (0, 10)), read(2, None, (11, 20))]);
    assert!(detail.contains("lost write"), "{detail}");
}

#[test]
fn stale_read_is_caught() {
    let detail = the_violation(&[
        write(1, "a", (0, 10)),
        write(2, "b", (20, 30)),
        read(3, Some("a"), (40, 50)),
    ]);
    assert!(detail.contains("stale read"), "{detail}");
    assert!(detail.contains("client 3's read [40, 50] ms"), "{detail}");
    assert!(detail.contains("write of \"b\" [20, 30] ms"), "{detail}");
}

#[test]
fn lost_acknowledged_write_is_caught() {
    let detail = the_violation(&[write(1, "a", (0, 10)), read(2, None, (20, 30))]);
    assert!(
        detail.contains("lost write: client 2's read [20, 30] ms returning no value"),
        "{detail}"
    );
    // The older value comes back after a newer write was acknowledged.
    let detail = the_violation(&[
        write(1, "a", (0, 10)),
        read(2, Some("a"), (12, 14)),
        write(1, "b", (20, 30)),
        read(2, Some("a"), (35, 40)),
    ]);
    assert!(detail.contains("stale read"), "{detail}");
}

#[test]
fn read_of_a_value_never_written_is_caught() {
    let detail = the_violation(&[write(1, "a", (0, 10)), read(2, Some("zz"), (20, 30))]);
    assert!(detail.contains("no write of the run wrote"), "{detail}");
}

#[test]
fn read_from_the_future_is_caught() {
    let detail = the_violation(&[read(2, Some("a"), (0, 10)), write(1, "a", (20, 30))]);
    assert!(detail.contains("invoked after the read"), "{detail}");
    let detail = the_violation(&[read(2, Some("a"), (0, 10)), unknown_write(1, "a", (20, 30))]);
    assert!(detail.contains("outcome unknown"), "{detail}");
}

#[test]
fn unknown_write_that_appears_later_is_accepted() {
    assert_ok(&[
        unknown_write(1, "a", (0, 10)),
        read(2, None, (20, 30)),
        // It took effect long after the client gave up.
        read(2, Some("a"), (100, 110)),
        read(3, Some("a"), (120, 130)),
    ]);
}

#[test]
fn unknown_write_that_never_appears_is_accepted() {
    assert_ok(&[
        write(1, "b", (0, 5)),
        unknown_write(1, "a", (10, 20)),
        read(2, Some("b"), (30, 40)),
        unknown_write(3, "c", (50, 60)),
    ]);
}

#[test]
fn unknown_write_cannot_take_effect_twice() {
    // Once overwritten by b, a cannot come back.
    let detail = the_violation(&[
        unknown_write(1, "a", (0, 10)),
        read(2, Some("a"), (20, 30)),
        write(3, "b", (40, 50)),
        read(2, Some("a"), (60, 70)),
    ]);
    assert!(detail.contains("stale read"), "{detail}");
}

#[test]
fn failed_write_that_is_read_is_caught() {
    assert_ok(&[failed_write(1, "a", (0, 10)), read(2, None, (20, 30))]);
    let detail = the_violation(&[failed_write(1, "a", (0, 10)), read(2, Some("a"), (20, 30))]);
    assert!(detail.contains("a failed write was observed"), "{detail}");
    assert!(detail.contains("not the leader"), "{detail}");
}

#[test]
fn unknown_and_failed_reads_are_ignored() {
    assert_ok(&[
        write(1, "a", (0, 10)),
        entry(
            2,
            RegisterOp::Read { key: "k".into() },
            (20, 30),
            Outcome::Unknown("timed out".into()),
        ),
        entry(
            2,
            RegisterOp::Read { key: "k".into() },
            (20, 30),
            Outcome::Failed("no quorum".into()),
        ),
    ]);
}

#[test]
fn reads_that_disagree_on_the_order_of_writes_are_caught_by_the_search() {
    // Real time allows either order of the two writes, but client 1 saw
    // a then b and client 2 saw a after that.
    let detail = the_violation(&[
        write(1, "a", (0, 100)),
        write(2, "b", (0, 100)),
        read(3, Some("a"), (10, 20)),
        read(3, Some("b"), (30, 40)),
        read(4, Some("a"), (50, 60)),
    ]);
    assert!(detail.contains("no order of its 5 operations"), "{detail}");
    assert!(detail.contains("client 4's read [50, 60] ms"), "{detail}");
}

#[test]
fn keys_are_checked_independently() {
    let history = [
        entry(1, write_op("x", "a"), (0, 10), Outcome::Ok(None)),
        entry(1, write_op("y", "b"), (20, 30), Outcome::Ok(None)),
        read_key("x", 2, Some("a"), (40, 50)),
        read_key("y", 2, Some("b"), (40, 50)),
        read_key("y", 3, None, (60, 70)),
    ];
    let violations = check_registers(&history);
    assert_eq!(violations.len(), 1, "{violations:#?}");
    assert!(
        violations[0].detail.starts_with("key \"y\""),
        "{violations:#?}"
    );
}

#[test]
fn exhausted_budget_is_undecided_not_a_pass() {
    let history = [
        write(1, "a", (0, 100)),
        write(2, "b", (0, 100)),
        read(3, Some("b"), (10, 20)),
    ];
    assert!(check_registers(&history).is_empty());
    let violations = check_registers_with_budget(&history, 1);
    assert_eq!(violations.len(), 1, "{violations:#?}");
    assert_eq!(violations[0].property, "linearizable-undecided");
}

/// A real register serving a planned sequence of operations: operation `i`
/// takes effect at `100 + 10 i` ms, inside an interval around that point.
/// Plan items are (kind, client, ms before the point, ms after it); kinds
/// 0-3 read, 4-6 write, 7 an unknown write that took effect, 8 an unknown
/// write that did not, 9 a failed write.
fn simulate(plan: &[(u8, u8, u8, u8)]) -> Vec<Entry> {
    let mut current: Option<String> = None;
    let mut history = Vec::new();
    for (i, &(kind, client, before, after)) in plan.iter().enumerate() {
        let point = 100 + 10 * i as u64;
        let invoked = point - u64::from(before);
        let around = (invoked, point + u64::from(after));
        // Whoever gave up may have done so before the write took effect.
        let gave_up = (invoked, invoked + u64::from(after));
        let value = format!("v{i}");
        let client = u32::from(client);
        history.push(match kind {
            0..=3 => read(client, current.as_deref(), around),
            4..=6 => {
                current = Some(value.clone());
                write(client, &value, around)
            }
            7 => {
                current = Some(value.clone());
                unknown_write(client, &value, gave_up)
            }
            8 => unknown_write(client, &value, gave_up),
            _ => failed_write(client, &value, gave_up),
        });
    }
    history
}

fn plan_strategy(max_len: usize) -> impl Strategy<Value = Vec<(u8, u8, u8, u8)>> {
    prop::collection::vec((0u8..10, 0u8..6, 0u8..40, 0u8..40), 1..max_len)
}

fn is_write(entry: &Entry, outcome: fn(&Outcome) -> bool) -> Option<&str> {
    match &entry.op {
        RegisterOp::Write { value, .. } if outcome(&entry.outcome) => Some(value),
        _ => None,
    }
}

fn acked(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Ok(_))
}

/// Values `read` cannot return in any linearization, by real time alone
/// (written independently of the checker's own reasoning).
fn impossible_values(history: &[Entry], read: &Entry) -> Vec<Option<String>> {
    let mut values = vec![Some("never-written".to_string())];
    let acked_writes = || history.iter().filter(|e| is_write(e, acked).is_some());
    for entry in history {
        if let Some(value) = is_write(entry, |o| matches!(o, Outcome::Failed(_))) {
            values.push(Some(value.into()));
        }
        if let Some(value) = is_write(entry, |o| !matches!(o, Outcome::Failed(_))) {
            if entry.invoked_ms > read.completed_ms {
                values.push(Some(value.into()));
            }
        }
        if let Some(value) = is_write(entry, acked) {
            let overwritten = acked_writes().any(|later| {
                entry.completed_ms < later.invoked_ms && later.completed_ms < read.invoked_ms
            });
            if overwritten {
                values.push(Some(value.into()));
            }
        }
    }
    if acked_writes().any(|w| w.completed_ms < read.invoked_ms) {
        values.push(None);
    }
    values
}

proptest! {
    #[test]
    fn histories_of_a_real_register_are_linearizable(plan in plan_strategy(80)) {
        let history = simulate(&plan);
        let violations = check_registers(&history);
        prop_assert!(violations.is_empty(), "{violations:#?}");
    }

    #[test]
    fn a_read_of_a_value_never_current_is_rejected(
        plan in plan_strategy(80),
        which_read in any::<Index>(),
        which_value in any::<Index>(),
    ) {
        let mut history = simulate(&plan);
        let reads: Vec<usize> = (0..history.len())
            .filter(|&i| matches!(history[i].op, RegisterOp::Read { .. }))
            .collect();
        prop_assume!(!reads.is_empty());
        let target = reads[which_read.index(reads.len())];
        let values = impossible_values(&history, &history[target]);
        let value = values[which_value.index(values.len())].clone();
        history[target].outcome = Outcome::Ok(value);
        let violations = check_registers(&history);
        prop_assert!(!violations.is_empty());
        prop_assert!(violations.iter().all(|v| v.property == "linearizable"), "{violations:#?}");
    }
}

/// Six clients, each with one operation in flight at a time, all
/// overlapping one another: the shape of a chaos run's register workload.
fn busy_history(ops: usize, seed: u64) -> Vec<Entry> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let plan: Vec<(u8, u8, u8, u8)> = (0..ops)
        .map(|_| {
            let kind = if rng.random_bool(0.1) {
                7
            } else {
                rng.random_range(0..7)
            };
            (
                kind,
                rng.random_range(0..6),
                rng.random_range(0..60),
                rng.random_range(0..60),
            )
        })
        .collect();
    simulate(&plan)
}

#[test]
fn a_busy_key_checks_quickly() {
    let history = busy_history(600, 7);
    let started = Instant::now();
    assert_ok(&history);
    // Generous for debug builds on a loaded machine; it takes milliseconds.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_busy_key_with_a_planted_stale_read_is_rejected_quickly() {
    let mut history = busy_history(600, 11);
    let last_read = history
        .iter()
        .rposition(|e| matches!(e.op, RegisterOp::Read { .. }))
        .expect("the history has reads");
    history[last_read].outcome = Outcome::Ok(Some("v0".into()));
    let started = Instant::now();
    let violations = check_registers(&history);
    assert!(!violations.is_empty());
    assert!(violations.iter().all(|v| v.property == "linearizable"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Brute force over every order of the operations (small histories only):
/// failed writes are left out, unknown writes may be left out or placed
/// anywhere after their invocation, everything else is placed within its
/// interval's real-time order.
fn linearizable_by_brute_force(history: &[Entry]) -> bool {
    let ops: Vec<&Entry> = history
        .iter()
        .filter(|e| !matches!(e.outcome, Outcome::Failed(_)))
        .collect();
    let mut placed = vec![false; ops.len()];
    place_rest(&ops, &mut placed, None)
}

fn place_rest(ops: &[&Entry], placed: &mut [bool], state: Option<&str>) -> bool {
    let required = |e: &Entry| matches!(e.outcome, Outcome::Ok(_));
    let completion = |e: &Entry| {
        if required(e) {
            e.completed_ms
        } else {
            u64::MAX
        }
    };
    if (0..ops.len()).all(|i| placed[i] || !required(ops[i])) {
        return true;
    }
    for i in 0..ops.len() {
        let blocked =
            (0..ops.len()).any(|j| !placed[j] && j != i && completion(ops[j]) < ops[i].invoked_ms);
        if placed[i] || blocked {
            continue;
        }
        let next = match (&ops[i].op, &ops[i].outcome) {
            (RegisterOp::Write { value, .. }, _) => Some(value.as_str()),
            (RegisterOp::Read { .. }, Outcome::Ok(read)) if read.as_deref() == state => state,
            _ => continue,
        };
        placed[i] = true;
        let found = place_rest(ops, placed, next);
        placed[i] = false;
        if found {
            return true;
        }
    }
    false
}

/// Small histories with heavily overlapping intervals, whose reads return
/// unset or the value of some write of the history (in any order):
/// (is a write, outcome 0-3, value index, start, length).
fn small_history() -> impl Strategy<Value = Vec<Entry>> {
    let op = (any::<bool>(), 0u8..4, 0usize..5, 0u64..40, 0u64..30);
    prop::collection::vec(op, 1..9).prop_map(|ops| {
        let writes: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].0).collect();
        ops.iter()
            .enumerate()
            .map(|(i, &(is_write, outcome, value, start, length))| {
                let at = (start, start + length);
                let client = i as u32;
                match (is_write, outcome) {
                    (true, 0) => unknown_write(client, &format!("v{i}"), at),
                    (true, 1) => failed_write(client, &format!("v{i}"), at),
                    (true, _) => write(client, &format!("v{i}"), at),
                    (false, _) if value == 0 || writes.is_empty() => read(client, None, at),
                    (false, _) => {
                        let writer = writes[(value - 1) % writes.len()];
                        read(client, Some(&format!("v{writer}")), at)
                    }
                }
            })
            .collect()
    })
}

/// Long overlapping writes and short reads between them, where only the
/// order the reads agree on decides: the histories the search (rather
/// than the real-time checks) must judge.
fn racing_writes() -> impl Strategy<Value = Vec<Entry>> {
    let writes = prop::collection::vec((0u64..30, 50u64..100, 0u8..4), 2..4);
    let reads = prop::collection::vec((0u64..100, 0u64..8, 0usize..4), 1..6);
    (writes, reads).prop_map(|(writes, reads)| {
        let mut history: Vec<Entry> = writes
            .iter()
            .enumerate()
            .map(|(i, &(start, end, outcome))| {
                let value = format!("v{i}");
                match outcome {
                    0 => unknown_write(i as u32, &value, (start, start + 5)),
                    _ => write(i as u32, &value, (start, end)),
                }
            })
            .collect();
        for (j, &(start, length, value)) in reads.iter().enumerate() {
            let value = (value < writes.len()).then(|| format!("v{value}"));
            history.push(read(
                10 + j as u32,
                value.as_deref(),
                (start, start + length),
            ));
        }
        history
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn the_checker_agrees_with_brute_force(
        history in prop_oneof![small_history(), racing_writes()]
    ) {
        let violations = check_registers(&history);
        prop_assert!(violations.iter().all(|v| v.property == "linearizable"));
        prop_assert_eq!(
            violations.is_empty(),
            linearizable_by_brute_force(&history),
            "{:#?}", violations
        );
    }
}
