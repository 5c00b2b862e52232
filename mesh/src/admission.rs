//! Who may open how much on the RPC port. Pure bookkeeping with the clock
//! passed in, so the rules are tested without sockets: the endpoint asks
//! before it keeps a connection or reads a request.
//!
//! A client without a certificate gets one door (the join RPC, checked by
//! the handler) and a small one: a few connections per source address, a
//! token bucket of requests per source, small frames, short timeouts. A
//! member's certificate earns more, but still a bounded number of
//! connections, so no peer can exhaust the endpoint.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The limits of one endpoint.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request from a client without a certificate (a join is a
    /// CSR and a member spec: a few kilobytes).
    pub anonymous_frame: usize,
    /// Concurrent streams on a connection without a certificate.
    pub anonymous_streams: u32,
    /// Connections without a certificate from one source address.
    pub anonymous_connections_per_source: usize,
    /// Requests without a certificate per source: a bucket of `burst`
    /// refilled at `per_second`.
    pub anonymous_burst: f64,
    pub anonymous_per_second: f64,
    /// How long a client without a certificate may take to send its request.
    pub anonymous_read_timeout: Duration,
    /// Connections one member may hold open to this endpoint.
    pub member_connections: usize,
    /// How long a member may take to send one request (up to a full frame).
    pub member_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            anonymous_frame: 64 * 1024,
            anonymous_streams: 2,
            anonymous_connections_per_source: 8,
            anonymous_burst: 20.0,
            anonymous_per_second: 5.0,
            anonymous_read_timeout: Duration::from_secs(5),
            member_connections: 16,
            member_read_timeout: Duration::from_secs(60),
        }
    }
}

/// Who holds a connection slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    Anonymous(IpAddr),
    /// A member by the id its certificate names (0: a CA-signed certificate
    /// that names no member, counted together).
    Member(u64),
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Connection slots and request buckets of one endpoint.
#[derive(Debug, Default)]
pub struct Admission {
    limits: Limits,
    open: HashMap<Holder, usize>,
    buckets: HashMap<IpAddr, Bucket>,
}

impl Admission {
    pub fn new(limits: Limits) -> Self {
        Admission {
            limits,
            ..Default::default()
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Takes a connection slot for `holder`, or says why not. Every slot
    /// taken is given back with [`Admission::close`].
    pub fn open(&mut self, holder: Holder) -> Result<(), String> {
        let cap = match holder {
            Holder::Anonymous(_) => self.limits.anonymous_connections_per_source,
            Holder::Member(_) => self.limits.member_connections,
        };
        let open = self.open.entry(holder).or_default();
        if *open >= cap {
            return Err(match holder {
                Holder::Anonymous(ip) => {
                    format!("{ip} already has {cap} connections without a certificate")
                }
                Holder::Member(id) => format!("member {id} already has {cap} connections"),
            });
        }
        *open += 1;
        Ok(())
    }

    pub fn close(&mut self, holder: Holder) {
        if let Some(open) = self.open.get_mut(&holder) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                self.open.remove(&holder);
            }
        }
    }

    /// Whether a request without a certificate from `source` may be read
    /// now; takes one token from its bucket if so.
    pub fn anonymous_request(&mut self, source: IpAddr, now: Instant) -> bool {
        let (burst, rate) = (
            self.limits.anonymous_burst,
            self.limits.anonymous_per_second,
        );
        // Forget full buckets now and then so the map stays small.
        if self.buckets.len() > 4096 {
            self.buckets.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < burst
            });
        }
        let bucket = self.buckets.entry(source).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64() * rate;
        bucket.tokens = (bucket.tokens + refill).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Open connections, for tests and metrics.
    pub fn open_connections(&self) -> usize {
        self.open.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn connections_are_capped_per_source_and_per_member() {
        let mut a = Admission::new(Limits {
            anonymous_connections_per_source: 2,
            member_connections: 3,
            ..Limits::default()
        });
        assert!(a.open(Holder::Anonymous(ip(1))).is_ok());
        assert!(a.open(Holder::Anonymous(ip(1))).is_ok());
        let refused = a.open(Holder::Anonymous(ip(1))).expect_err("third");
        assert!(refused.contains("10.0.0.1"), "{refused}");
        // Another source, and members, have their own slots.
        assert!(a.open(Holder::Anonymous(ip(2))).is_ok());
        for _ in 0..3 {
            assert!(a.open(Holder::Member(7)).is_ok());
        }
        assert!(a.open(Holder::Member(7)).is_err());
        assert!(a.open(Holder::Member(8)).is_ok());
        a.close(Holder::Anonymous(ip(1)));
        assert!(a.open(Holder::Anonymous(ip(1))).is_ok());
    }

    #[test]
    fn anonymous_requests_drain_a_bucket_that_refills() {
        let mut a = Admission::new(Limits {
            anonymous_burst: 3.0,
            anonymous_per_second: 2.0,
            ..Limits::default()
        });
        let t0 = Instant::now();
        assert!((0..3).all(|_| a.anonymous_request(ip(1), t0)));
        assert!(!a.anonymous_request(ip(1), t0), "the burst is spent");
        assert!(a.anonymous_request(ip(2), t0), "another source has its own");
        assert!(!a.anonymous_request(ip(1), t0 + Duration::from_millis(400)));
        assert!(a.anonymous_request(ip(1), t0 + Duration::from_millis(600)));
    }

    proptest! {
        /// Whatever the order of opens and closes, no holder ever exceeds its
        /// cap and the count returns to zero once everything is closed.
        #[test]
        fn slots_never_exceed_the_cap(ops in prop::collection::vec((any::<bool>(), 0u8..4, any::<bool>()), 1..300)) {
            let limits = Limits { anonymous_connections_per_source: 3, member_connections: 2, ..Limits::default() };
            let mut a = Admission::new(limits);
            let mut held: HashMap<Holder, usize> = HashMap::new();
            for (member, who, open) in ops {
                let holder = if member { Holder::Member(u64::from(who)) } else { Holder::Anonymous(ip(who)) };
                let cap = if member { 2 } else { 3 };
                let count = held.entry(holder).or_default();
                if open {
                    let ok = a.open(holder).is_ok();
                    prop_assert_eq!(ok, *count < cap);
                    if ok { *count += 1; }
                } else if *count > 0 {
                    a.close(holder);
                    *count -= 1;
                }
            }
            for (holder, count) in held {
                for _ in 0..count { a.close(holder); }
            }
            prop_assert_eq!(a.open_connections(), 0);
        }
    }
}
