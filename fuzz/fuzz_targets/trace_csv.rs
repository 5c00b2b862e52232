//! Any text as a cluster trace of each supported format: parsed jobs or an
//! error naming the line, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_sim::trace::{parse_traces, TraceFormat};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for format in [
        TraceFormat::Auto,
        TraceFormat::Philly,
        TraceFormat::Alibaba,
        TraceFormat::Simple,
    ] {
        let _ = parse_traces(&[("trace.csv", text)], format);
    }
});
