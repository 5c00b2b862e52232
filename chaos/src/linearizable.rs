//! A linearizability checker for the register workload: one register per
//! key, initially unset, where a write sets the value and a read returns it.
//!
//! Linearizability is compositional (P-compositionality, Herlihy & Wing), so
//! every key is checked on its own, which keeps each search small. Per key:
//!
//! 1. The history is normalised. Failed operations did not take effect and
//!    are dropped; so are reads whose outcome is unknown, since they observed
//!    nothing. A write whose outcome is unknown may take effect at any time
//!    after its invocation, or never. If no read returned its value, taking
//!    effect "never" explains everything "sometime" does, so it is dropped;
//!    otherwise it must have taken effect before every read of its value, so
//!    it becomes an ordinary write that completes when the first of those
//!    reads completed. Values are unique per run, so a value names its write.
//! 2. Cheap necessary conditions are checked read by read: the value was
//!    written (and not only by a failed write), not by a write invoked after
//!    the read completed, and not overwritten before the read was invoked.
//!    These catch the usual bugs (stale reads, lost writes) with a precise
//!    message, without any search.
//! 3. The rest is decided by the search of Wing & Gong with Lowe's
//!    memoisation of (set of linearized operations, register value), as in
//!    Porcupine. It is exponential in the worst case, so it has a budget of
//!    states; past it the key is reported as undecided, never as a pass.
//!
//! Times are milliseconds, so operations may share a timestamp: `a` precedes
//! `b` only if `a` completed strictly before `b` was invoked.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{Entry, Outcome, RegisterOp};
use crate::Violation;

/// States the search may visit per key before it gives up: about a second
/// of work and a few hundred MB at worst, and far more than a correct
/// history of a few thousand operations from a handful of clients needs.
pub const STATE_BUDGET: usize = 2_000_000;

/// Checks every key of the history with the default [`STATE_BUDGET`].
/// Violations have property `linearizable`, or `linearizable-undecided`
/// where the search ran out of budget.
pub fn check_registers(entries: &[Entry]) -> Vec<Violation> {
    check_registers_with_budget(entries, STATE_BUDGET)
}

/// [`check_registers`] with a budget of `max_states` search states per key.
pub fn check_registers_with_budget(entries: &[Entry], max_states: usize) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    for entry in entries {
        by_key.entry(entry.op.key()).or_default().push(entry);
    }
    by_key
        .into_iter()
        .flat_map(|(key, entries)| check_key(key, &entries, max_states))
        .collect()
}

/// Register values as small integers; [`UNSET`] is the initial state.
type Value = u32;
const UNSET: Value = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write(Value),
    Read(Value),
}

/// One operation of the normalised history of a key.
struct Op<'a> {
    entry: &'a Entry,
    invoked: u64,
    completed: u64,
    kind: Kind,
}

impl Op<'_> {
    fn precedes(&self, other: &Op) -> bool {
        self.completed < other.invoked
    }

    fn overlaps(&self, other: &Op) -> bool {
        !self.precedes(other) && !other.precedes(self)
    }
}

/// The history of one key, normalised, with its values interned.
struct KeyHistory<'a> {
    key: &'a str,
    ops: Vec<Op<'a>>,
    /// Interned value -> its text; index 0 ([`UNSET`]) is unused.
    names: Vec<&'a str>,
    /// Value -> index in `ops` of the write that wrote it.
    writer: HashMap<Value, usize>,
}

fn check_key(key: &str, entries: &[&Entry], max_states: usize) -> Vec<Violation> {
    let (history, unexplained) = KeyHistory::new(key, entries);
    if !unexplained.is_empty() {
        return unexplained;
    }
    let stale = history.real_time_violations();
    if !stale.is_empty() {
        return stale;
    }
    match search(&history.ops, max_states) {
        Search::Linearizable => Vec::new(),
        Search::Stuck(stuck) => vec![history.describe_stuck(&stuck)],
        Search::OutOfBudget => vec![Violation::new(
            "linearizable-undecided",
            format!(
                "key {key:?}: gave up after {max_states} search states over {} operations \
                 (at most {} concurrent); the history was neither confirmed nor refuted",
                history.ops.len(),
                max_concurrency(&history.ops),
            ),
        )],
    }
}

impl<'a> KeyHistory<'a> {
    /// Normalises the entries of one key (see the module documentation).
    /// Also returns the reads no write can explain at all: of a value
    /// never written, or written only by a write that failed.
    fn new(key: &'a str, entries: &[&'a Entry]) -> (KeyHistory<'a>, Vec<Violation>) {
        let mut history = KeyHistory {
            key,
            ops: Vec::new(),
            names: vec![""],
            writer: HashMap::new(),
        };
        let mut ids: HashMap<&'a str, Value> = HashMap::new();
        let mut failed: HashMap<&'a str, &'a Entry> = HashMap::new();
        let mut unknown: Vec<(Value, &'a Entry)> = Vec::new();
        for &entry in entries {
            let RegisterOp::Write { value, .. } = &entry.op else {
                continue;
            };
            match entry.outcome {
                Outcome::Failed(_) => {
                    failed.insert(value, entry);
                }
                Outcome::Ok(_) => {
                    let id = history.intern(&mut ids, value);
                    history.writer.insert(id, history.ops.len());
                    history.ops.push(Op {
                        entry,
                        invoked: entry.invoked_ms,
                        completed: entry.completed_ms.max(entry.invoked_ms),
                        kind: Kind::Write(id),
                    });
                }
                Outcome::Unknown(_) => unknown.push((history.intern(&mut ids, value), entry)),
            }
        }
        // Reads: the first completion of a read of each value bounds when an
        // unknown write of it must have taken effect.
        let mut first_read: HashMap<Value, u64> = HashMap::new();
        let mut unexplained = Vec::new();
        for &entry in entries {
            let (RegisterOp::Read { .. }, Outcome::Ok(read)) = (&entry.op, &entry.outcome) else {
                continue;
            };
            let value = match read.as_deref() {
                None => UNSET,
                Some(text) => match ids.get(text) {
                    Some(&id) => id,
                    None => {
                        unexplained.push(history.never_written(entry, failed.get(text)));
                        continue;
                    }
                },
            };
            let completed = entry.completed_ms.max(entry.invoked_ms);
            let first = first_read.entry(value).or_insert(completed);
            *first = (*first).min(completed);
            history.ops.push(Op {
                entry,
                invoked: entry.invoked_ms,
                completed,
                kind: Kind::Read(value),
            });
        }
        for (id, entry) in unknown {
            let Some(&deadline) = first_read.get(&id) else {
                continue;
            };
            history.writer.insert(id, history.ops.len());
            history.ops.push(Op {
                entry,
                invoked: entry.invoked_ms,
                completed: deadline.max(entry.invoked_ms),
                kind: Kind::Write(id),
            });
        }
        (history, unexplained)
    }

    fn intern(&mut self, ids: &mut HashMap<&'a str, Value>, text: &'a str) -> Value {
        *ids.entry(text).or_insert_with(|| {
            self.names.push(text);
            (self.names.len() - 1) as Value
        })
    }

    fn never_written(&self, read: &Entry, failed: Option<&&Entry>) -> Violation {
        let detail = match failed {
            Some(write) => format!(
                "key {:?}: {}: only {} wrote that value, and it failed ({}): a failed write \
                 was observed",
                self.key,
                describe_entry(read),
                describe_entry(write),
                failure_reason(write),
            ),
            None => format!(
                "key {:?}: {}: no write of the run wrote that value",
                self.key,
                describe_entry(read)
            ),
        };
        Violation::new("linearizable", detail)
    }

    /// Reads that real-time order alone rules out, each reported with the
    /// writes that rule it out.
    fn real_time_violations(&self) -> Vec<Violation> {
        let overwrites = Overwrites::new(&self.ops);
        self.ops
            .iter()
            .filter_map(|read| match read.kind {
                Kind::Read(value) => self.check_read(read, value, &overwrites),
                Kind::Write(_) => None,
            })
            .map(|detail| Violation::new("linearizable", detail))
            .collect()
    }

    fn check_read(&self, read: &Op, value: Value, overwrites: &Overwrites) -> Option<String> {
        let key = self.key;
        if value == UNSET {
            let write = &self.ops[overwrites.first_completed()?];
            return write.precedes(read).then(|| {
                format!(
                    "key {key:?}: lost write: {}, but {} had completed before the read was \
                     invoked",
                    describe(read),
                    describe(write)
                )
            });
        }
        let write = &self.ops[*self.writer.get(&value)?];
        if write.invoked > read.completed {
            return Some(format!(
                "key {key:?}: {}: only {} wrote that value, invoked after the read completed",
                describe(read),
                describe(write)
            ));
        }
        let later = &self.ops[overwrites.after(&self.ops, write)?];
        later.precedes(read).then(|| {
            format!(
                "key {key:?}: stale read: {}: {} wrote that value, but {} overwrote it before \
                 the read was invoked",
                describe(read),
                describe(write),
                describe(later)
            )
        })
    }

    fn describe_stuck(&self, stuck: &Stuck) -> Violation {
        let op = &self.ops[stuck.op];
        let mut concurrent: Vec<String> = self
            .ops
            .iter()
            .enumerate()
            .filter(|(i, other)| {
                *i != stuck.op && matches!(other.kind, Kind::Write(_)) && other.overlaps(op)
            })
            .map(|(_, other)| describe(other))
            .collect();
        const SHOWN: usize = 8;
        if concurrent.len() > SHOWN {
            let more = concurrent.len() - SHOWN;
            concurrent.truncate(SHOWN);
            concurrent.push(format!("{more} more"));
        }
        let concurrent = if concurrent.is_empty() {
            "no write overlaps it".to_string()
        } else {
            format!("writes overlapping it: {}", concurrent.join("; "))
        };
        Violation::new(
            "linearizable",
            format!(
                "key {:?}: no order of its {} operations explains every read; the longest \
                 explained prefix orders {} of them, after which {} cannot be placed (the \
                 register then holds {}); {concurrent}",
                self.key,
                self.ops.len(),
                stuck.depth,
                describe(op),
                self.value_text(stuck.state),
            ),
        )
    }

    fn value_text(&self, value: Value) -> String {
        match value {
            UNSET => "no value".to_string(),
            v => format!("{:?}", self.names[v as usize]),
        }
    }
}

fn describe(op: &Op) -> String {
    describe_entry(op.entry)
}

/// An operation for a human, as recorded: `client 2's read [20, 30] ms
/// returning "a"`, `client 1's write of "a" [0, 10] ms`.
fn describe_entry(entry: &Entry) -> String {
    let at = format!("[{}, {}] ms", entry.invoked_ms, entry.completed_ms);
    match (&entry.op, &entry.outcome) {
        (RegisterOp::Read { .. }, Outcome::Ok(Some(value))) => {
            format!("client {}'s read {at} returning {value:?}", entry.client)
        }
        (RegisterOp::Read { .. }, _) => {
            format!("client {}'s read {at} returning no value", entry.client)
        }
        (RegisterOp::Write { value, .. }, Outcome::Unknown(_)) => format!(
            "client {}'s write of {value:?} (outcome unknown: invoked at {} ms, given up at {} ms)",
            entry.client, entry.invoked_ms, entry.completed_ms
        ),
        (RegisterOp::Write { value, .. }, _) => {
            format!("client {}'s write of {value:?} {at}", entry.client)
        }
    }
}

fn failure_reason(entry: &Entry) -> &str {
    match &entry.outcome {
        Outcome::Failed(reason) | Outcome::Unknown(reason) => reason,
        Outcome::Ok(_) => "",
    }
}

/// Answers "which write completed first among those invoked after `t`",
/// for every write, in O(log n) after an O(n log n) setup.
struct Overwrites {
    /// Writes (indices into the ops) by invocation time.
    by_invocation: Vec<usize>,
    /// `first[i]`: among `by_invocation[i..]`, the one completing first.
    first: Vec<usize>,
}

impl Overwrites {
    fn new(ops: &[Op]) -> Overwrites {
        let mut by_invocation: Vec<usize> = (0..ops.len())
            .filter(|&i| matches!(ops[i].kind, Kind::Write(_)))
            .collect();
        by_invocation.sort_by_key(|&i| ops[i].invoked);
        let mut first = by_invocation.clone();
        for i in (0..first.len().saturating_sub(1)).rev() {
            if ops[first[i + 1]].completed < ops[first[i]].completed {
                first[i] = first[i + 1];
            }
        }
        Overwrites {
            by_invocation,
            first,
        }
    }

    /// The write completing first of all.
    fn first_completed(&self) -> Option<usize> {
        self.first.first().copied()
    }

    /// The write completing first among those invoked after `write`
    /// completed: if any write overwrote it before some time, this one did.
    fn after(&self, ops: &[Op], write: &Op) -> Option<usize> {
        let start = self
            .by_invocation
            .partition_point(|&i| ops[i].invoked <= write.completed);
        self.first.get(start).copied()
    }
}

/// The most operations whose intervals overlap at one instant.
fn max_concurrency(ops: &[Op]) -> usize {
    let mut edges: Vec<(u64, bool)> = ops
        .iter()
        .flat_map(|op| [(op.invoked, false), (op.completed, true)])
        .collect();
    // At equal times invocations come first: intervals are closed.
    edges.sort_unstable();
    let (mut open, mut most) = (0usize, 0usize);
    for (_, is_end) in edges {
        if is_end {
            open = open.saturating_sub(1);
        } else {
            open += 1;
            most = most.max(open);
        }
    }
    most
}

/// What the search found.
enum Search {
    Linearizable,
    Stuck(Stuck),
    OutOfBudget,
}

/// Where the search got furthest before every order failed.
#[derive(Default)]
struct Stuck {
    /// Operations ordered at that point.
    depth: usize,
    /// The operation whose completion came with it still unplaced.
    op: usize,
    state: Value,
}

const NIL: usize = usize::MAX;

/// The invocation and completion events of the operations, in time order,
/// as a doubly linked list from which an operation's two events are
/// removed when it is linearized and put back when the search backtracks.
struct Events {
    next: Vec<usize>,
    prev: Vec<usize>,
    /// The operation of each event, and whether the event is its invocation.
    op: Vec<usize>,
    is_call: Vec<bool>,
    /// Each operation's invocation and completion event.
    call: Vec<usize>,
    ret: Vec<usize>,
}

impl Events {
    /// Event `len` (one past the last) is the list head.
    fn new(ops: &[Op]) -> Events {
        let mut order: Vec<(u64, bool, usize)> = ops
            .iter()
            .enumerate()
            .flat_map(|(i, op)| [(op.invoked, false, i), (op.completed, true, i)])
            .collect();
        // Invocations before completions at equal times: equal timestamps
        // are concurrent, never ordered.
        order.sort_unstable();
        let len = order.len();
        let head = len;
        let mut next: Vec<usize> = (1..=len).collect();
        if let Some(last) = next.last_mut() {
            *last = NIL;
        }
        next.push(if len == 0 { NIL } else { 0 });
        let mut prev: Vec<usize> = (0..len).map(|i| i.checked_sub(1).unwrap_or(head)).collect();
        prev.push(NIL);
        let mut call = vec![0; ops.len()];
        let mut ret = vec![0; ops.len()];
        for (event, &(_, is_ret, op)) in order.iter().enumerate() {
            if is_ret {
                ret[op] = event;
            } else {
                call[op] = event;
            }
        }
        Events {
            next,
            prev,
            op: order.iter().map(|&(_, _, op)| op).collect(),
            is_call: order.iter().map(|&(_, is_ret, _)| !is_ret).collect(),
            call,
            ret,
        }
    }

    fn head(&self) -> usize {
        self.op.len()
    }

    fn first(&self) -> usize {
        self.next[self.head()]
    }

    fn unlink(&mut self, event: usize) {
        let (prev, next) = (self.prev[event], self.next[event]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    fn relink(&mut self, event: usize) {
        let (prev, next) = (self.prev[event], self.next[event]);
        self.next[prev] = event;
        if next != NIL {
            self.prev[next] = event;
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call[op]);
        self.unlink(self.ret[op]);
    }

    /// Undoes [`Events::lift`]; links go back in the reverse order.
    fn unlift(&mut self, op: usize) {
        self.relink(self.ret[op]);
        self.relink(self.call[op]);
    }
}

/// The register model: the state after `kind`, if `kind` is possible.
fn step(state: Value, kind: Kind) -> Option<Value> {
    match kind {
        Kind::Write(value) => Some(value),
        Kind::Read(value) => (value == state).then_some(state),
    }
}

/// Wing & Gong's search with Lowe's memoisation (the algorithm of
/// Porcupine): walk the events in time order; at an invocation, try to
/// linearize that operation now; at a completion, the operation it belongs
/// to had to be linearized already, so undo the last choice and try the
/// next candidate instead. A (linearized set, state) pair seen before is
/// not explored again, which makes the search polynomial for histories
/// with bounded concurrency.
fn search(ops: &[Op], max_states: usize) -> Search {
    let mut events = Events::new(ops);
    let words = ops.len().div_ceil(64);
    // The linearized set as a bitset, then the register value: the memo key.
    let mut key = vec![0u64; words + 1];
    let mut seen: HashSet<Box<[u64]>> = HashSet::new();
    let mut stack: Vec<(usize, Value)> = Vec::new();
    let mut state = UNSET;
    let mut stuck = Stuck::default();
    let mut event = events.first();
    while events.first() != NIL {
        if event != NIL && events.is_call[event] {
            let op = events.op[event];
            if let Some(next) = step(state, ops[op].kind) {
                key[op / 64] |= 1 << (op % 64);
                key[words] = u64::from(next);
                if !seen.contains(&key[..]) {
                    if seen.len() >= max_states {
                        return Search::OutOfBudget;
                    }
                    seen.insert(key.clone().into_boxed_slice());
                    stack.push((op, state));
                    state = next;
                    events.lift(op);
                    event = events.first();
                    continue;
                }
                key[op / 64] &= !(1 << (op % 64));
            }
            event = events.next[event];
            continue;
        }
        if event != NIL && stack.len() >= stuck.depth {
            stuck = Stuck {
                depth: stack.len(),
                op: events.op[event],
                state,
            };
        }
        let Some((op, previous)) = stack.pop() else {
            return Search::Stuck(stuck);
        };
        key[op / 64] &= !(1 << (op % 64));
        state = previous;
        events.unlift(op);
        event = events.next[events.call[op]];
    }
    Search::Linearizable
}

#[cfg(test)]
mod tests;
