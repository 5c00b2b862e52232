//! Panics on the threads of a run's nodes. A node that panics while it
//! runs has a bug, and the run reports it; a node being crashed on purpose
//! may panic as its runtime goes away under a blocking task (tokio refuses
//! new timers once shutting down), which a real `kill -9` would not show,
//! and those are ignored.

use std::collections::BTreeSet;
use std::sync::{Mutex, Once, PoisonError};

/// Prefix of every thread of a chaos node's runtime; the node's name follows.
pub const THREAD_PREFIX: &str = "chaos-";

#[derive(Default)]
struct State {
    crashing: BTreeSet<String>,
    panics: Vec<String>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut guard = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(State::default))
}

/// Installs the hook once per process; threads of other names keep the
/// previous hook.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            // A node's runtime threads carry its name; plain threads a node
            // starts (replication's) have none. Named threads of anything
            // else (test threads) keep the previous hook.
            let node = match thread.name() {
                Some(name) => match name.strip_prefix(THREAD_PREFIX) {
                    Some(node) => node.to_string(),
                    None => {
                        previous(info);
                        return;
                    }
                },
                None => "(a thread without a name)".to_string(),
            };
            let message = info.to_string();
            let recorded = with(|s| {
                // A plain thread cannot say whose it is: while a node is
                // being crashed, or when it met a runtime shut down under
                // it (only crashed nodes' runtimes are), it was the
                // crashed node's.
                let unnamed = thread.name().is_none();
                let shut_down = message.contains("being shutdown")
                    || message.contains("runtime has been shut down");
                if s.crashing.contains(&node) || (unnamed && (shut_down || !s.crashing.is_empty()))
                {
                    return false;
                }
                s.panics.push(format!("node {node}: {message}"));
                true
            });
            if recorded {
                previous(info);
            }
        }));
    });
}

/// Marks `node` as being crashed on purpose (or no longer).
pub fn set_crashing(node: &str, crashing: bool) {
    with(|s| {
        if crashing {
            s.crashing.insert(node.to_string());
        } else {
            s.crashing.remove(node);
        }
    });
}

/// The panics recorded since the last call.
pub fn take() -> Vec<String> {
    with(|s| std::mem::take(&mut s.panics))
}
