//! Any text as a node's config file: a message naming the problem, or a
//! config that validates or is refused, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_node::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = toml::from_str::<Config>(text) {
        let _ = cfg.validate();
    }
});
