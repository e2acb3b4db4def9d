#![no_main]
//! The allowed_signers reader on arbitrary text.

use clawfleet_protocol::AllowedSigners;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = AllowedSigners::parse(text);
    }
});
