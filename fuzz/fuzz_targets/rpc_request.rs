//! Any bytes as an RPC request or answer body: an error, never a panic, and
//! what decodes encodes back to something that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_node::rpc::proto::{decode, encode, Request, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode::<Request>(data) {
        let again = encode(&req);
        assert!(decode::<Request>(&again).is_ok());
    }
    let _ = decode::<Response>(data);
});
