//! Any bytes as the JSON body of an API write: a decode error or a value,
//! never a panic, whatever the nesting or the numbers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_sdk::{JobSubmitRequest, ObjectPut, TenantRequest, TokenCreateRequest};

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<JobSubmitRequest>(data);
    let _ = serde_json::from_slice::<TenantRequest>(data);
    let _ = serde_json::from_slice::<ObjectPut>(data);
    let _ = serde_json::from_slice::<TokenCreateRequest>(data);
});
