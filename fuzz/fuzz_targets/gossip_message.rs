//! Any bytes as a gossip message: capacity adverts are checked field by
//! field, heartbeats decode or fail, nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_mesh::gossip::{CapacityAdvert, HeartbeatPayload};

fuzz_target!(|data: &[u8]| {
    if let Ok(advert) = CapacityAdvert::decode(data) {
        assert!(advert.load.is_finite());
        assert!(advert.encode().is_ok());
    }
    let _ = HeartbeatPayload::decode(data);
});
