//! Wire format of the gossip payloads.
//!
//! Every payload is `[WIRE_VERSION] ++ bincode(body)`. The version byte lets a
//! future format coexist on the same topic names during a rolling upgrade: a
//! node rejects versions it does not understand instead of misreading them.
//! Decoding is bounded ([`MAX_MESSAGE_BYTES`], enforced both on the input
//! length and inside bincode's allocator limit) so a hostile length prefix
//! cannot make us allocate gigabytes.

use std::collections::BTreeMap;

use bincode::Options;
use serde::{Deserialize, Serialize};

/// Version byte prefixed to every payload.
pub const WIRE_VERSION: u8 = 2;

/// Upper bound for an encoded payload (version byte included). Adverts are a
/// few hundred bytes; 64 KiB leaves room for large model maps and coordinates
/// while keeping a hostile message cheap to discard.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// What a node currently offers to the mesh, published on the capacity topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityAdvert {
    /// Ledger-assigned node id of the publisher.
    pub node_id: u64,
    /// Monotonic per node; receivers keep only the highest seq they have seen.
    pub seq: u64,
    /// Free GPUs per model name (e.g. "H100-80G" -> 3).
    pub gpus_free_by_model: BTreeMap<String, u32>,
    /// Total GPUs on the node, free or not.
    pub gpus_total: u32,
    /// The node's own health verdict.
    pub healthy: bool,
    /// Load in [0, 1] by convention; must be finite.
    pub load: f32,
    /// Mean utilization (percent) of the GPUs each job holds on this node,
    /// by job id: lets any node compare the ranks of a gang.
    pub job_util: BTreeMap<u64, f32>,
    /// Opaque Vivaldi coordinate, encoded by the caller.
    pub coordinate: Option<Vec<u8>>,
    /// Publisher's wall clock at send time, milliseconds since the Unix epoch.
    pub sent_at_ms: u64,
}

/// Liveness beacon published on the heartbeat topic; kept tiny on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatPayload {
    /// Ledger-assigned node id of the publisher.
    pub node_id: u64,
    /// Monotonic per node.
    pub seq: u64,
    /// Publisher's wall clock at send time, milliseconds since the Unix epoch.
    pub sent_at_ms: u64,
}

/// Why a payload could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    /// Zero-length payload (not even a version byte).
    #[error("empty payload")]
    Empty,
    /// Payload exceeds [`MAX_MESSAGE_BYTES`].
    #[error("payload of {len} bytes exceeds the {max} byte limit")]
    TooLarge {
        /// Actual length.
        len: usize,
        /// Limit that was exceeded.
        max: usize,
    },
    /// Version byte we do not understand.
    #[error("unsupported wire version {found} (expected {expected})")]
    UnsupportedVersion {
        /// Version byte found in the payload.
        found: u8,
        /// Version this build speaks.
        expected: u8,
    },
    /// bincode refused the body (truncated, trailing bytes, over the limit...).
    #[error("malformed {what} body: {detail}")]
    Malformed {
        /// Which message kind was being decoded.
        what: &'static str,
        /// bincode's description.
        detail: String,
    },
    /// A field is outside its domain (e.g. non-finite load).
    #[error("invalid field {field}: {detail}")]
    InvalidField {
        /// Offending field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

fn bincode_options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_limit(MAX_MESSAGE_BYTES as u64)
        .reject_trailing_bytes()
}

fn encode<T: Serialize>(what: &'static str, body: &T) -> Result<Vec<u8>, WireError> {
    let encoded = bincode_options()
        .serialize(body)
        .map_err(|e| WireError::Malformed {
            what,
            detail: e.to_string(),
        })?;
    let mut out = Vec::with_capacity(encoded.len() + 1);
    out.push(WIRE_VERSION);
    out.extend_from_slice(&encoded);
    if out.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge {
            len: out.len(),
            max: MAX_MESSAGE_BYTES,
        });
    }
    Ok(out)
}

fn decode<T: for<'de> Deserialize<'de>>(what: &'static str, bytes: &[u8]) -> Result<T, WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            max: MAX_MESSAGE_BYTES,
        });
    }
    let (&version, body) = bytes.split_first().ok_or(WireError::Empty)?;
    if version != WIRE_VERSION {
        return Err(WireError::UnsupportedVersion {
            found: version,
            expected: WIRE_VERSION,
        });
    }
    bincode_options()
        .deserialize(body)
        .map_err(|e| WireError::Malformed {
            what,
            detail: e.to_string(),
        })
}

impl CapacityAdvert {
    /// Encodes the advert for the capacity topic.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        self.check_fields()?;
        encode("capacity advert", self)
    }

    /// Decodes and sanity-checks an advert received from the network.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let advert: Self = decode("capacity advert", bytes)?;
        advert.check_fields()?;
        Ok(advert)
    }

    fn check_fields(&self) -> Result<(), WireError> {
        if !self.load.is_finite() {
            return Err(WireError::InvalidField {
                field: "load",
                detail: format!("{} is not finite", self.load),
            });
        }
        if let Some((job, util)) = self
            .job_util
            .iter()
            .find(|(_, u)| !(0.0..=100.0).contains(*u))
        {
            return Err(WireError::InvalidField {
                field: "job_util",
                detail: format!("{util} for job {job} is not a percentage"),
            });
        }
        Ok(())
    }
}

impl HeartbeatPayload {
    /// Encodes the heartbeat for the heartbeat topic.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        encode("heartbeat", self)
    }

    /// Decodes a heartbeat received from the network.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        decode("heartbeat", bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert() -> CapacityAdvert {
        CapacityAdvert {
            node_id: 7,
            seq: 42,
            gpus_free_by_model: BTreeMap::from([("H100".to_string(), 3), ("A10".to_string(), 1)]),
            gpus_total: 8,
            healthy: true,
            load: 0.25,
            job_util: BTreeMap::new(),
            coordinate: Some(vec![1, 2, 3, 4]),
            sent_at_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn capacity_round_trips() {
        let bytes = advert().encode().expect("encode");
        assert_eq!(bytes[0], WIRE_VERSION);
        assert_eq!(CapacityAdvert::decode(&bytes), Ok(advert()));
    }

    #[test]
    fn heartbeat_round_trips() {
        let hb = HeartbeatPayload {
            node_id: 1,
            seq: 2,
            sent_at_ms: 3,
        };
        let bytes = hb.encode().expect("encode");
        assert_eq!(HeartbeatPayload::decode(&bytes), Ok(hb));
    }

    #[test]
    fn rejects_wrong_version_empty_truncated_and_trailing() {
        let mut bytes = advert().encode().expect("encode");
        assert_eq!(CapacityAdvert::decode(&[]), Err(WireError::Empty));

        let mut wrong = bytes.clone();
        wrong[0] = WIRE_VERSION + 1;
        assert!(matches!(
            CapacityAdvert::decode(&wrong),
            Err(WireError::UnsupportedVersion { .. })
        ));

        let truncated = &bytes[..bytes.len() - 2];
        assert!(matches!(
            CapacityAdvert::decode(truncated),
            Err(WireError::Malformed { .. })
        ));

        bytes.push(0);
        assert!(matches!(
            CapacityAdvert::decode(&bytes),
            Err(WireError::Malformed { .. })
        ));
    }

    #[test]
    fn rejects_oversized_and_hostile_length_prefixes() {
        let big = vec![WIRE_VERSION; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(
            CapacityAdvert::decode(&big),
            Err(WireError::TooLarge { .. })
        ));
        // node_id, seq, then a map length claiming u64::MAX entries.
        let mut hostile = vec![WIRE_VERSION, 1, 1, 0xFD];
        hostile.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(CapacityAdvert::decode(&hostile).is_err());
    }

    #[test]
    fn rejects_non_finite_load() {
        let mut a = advert();
        a.load = f32::NAN;
        assert!(matches!(a.encode(), Err(WireError::InvalidField { .. })));
        // Hand-encode to bypass the sender-side check.
        let mut bytes = vec![WIRE_VERSION];
        bytes.extend(bincode_options().serialize(&a).expect("serialize"));
        assert!(matches!(
            CapacityAdvert::decode(&bytes),
            Err(WireError::InvalidField { .. })
        ));
    }

    #[test]
    fn rejects_job_utilization_outside_0_to_100() {
        for bad in [f32::NAN, -1.0, 100.5] {
            let mut a = advert();
            a.job_util.insert(9, bad);
            let mut bytes = vec![WIRE_VERSION];
            bytes.extend(bincode_options().serialize(&a).expect("serialize"));
            assert!(matches!(
                CapacityAdvert::decode(&bytes),
                Err(WireError::InvalidField {
                    field: "job_util",
                    ..
                })
            ));
        }
        let mut ok = advert();
        ok.job_util.insert(9, 91.5);
        let bytes = ok.encode().expect("encode");
        assert_eq!(CapacityAdvert::decode(&bytes), Ok(ok));
    }

    proptest::proptest! {
        /// Whatever arrives on a gossip topic decodes or is refused; it
        /// never panics, and what decodes passes the field checks.
        #[test]
        fn hostile_gossip_is_refused_not_fatal(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            if let Ok(a) = CapacityAdvert::decode(&bytes) {
                proptest::prop_assert!(a.check_fields().is_ok());
            }
            let _ = HeartbeatPayload::decode(&bytes);
        }

        /// A well-formed advert with bytes flipped anywhere.
        #[test]
        fn a_corrupted_advert_is_refused_or_sane(flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..8)) {
            let mut bytes = advert().encode().expect("encode");
            for (at, value) in flips {
                let len = bytes.len();
                bytes[at % len] = value;
            }
            if let Ok(a) = CapacityAdvert::decode(&bytes) {
                proptest::prop_assert!(a.check_fields().is_ok());
            }
        }
    }
}
