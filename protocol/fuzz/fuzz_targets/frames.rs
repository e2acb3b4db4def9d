#![no_main]
//! The framing layer and message decoding on arbitrary byte streams.

use clawfleet_protocol::framing::{FrameDecoder, read_frame};
use clawfleet_protocol::{Limits, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut reader = data;
    while let Ok(Some(frame)) = read_frame(&mut reader, 64 * 1024) {
        let _ = Message::from_frame(&frame, &limits);
    }
    let mut decoder = FrameDecoder::new(64 * 1024);
    for chunk in data.chunks(7) {
        decoder.push(chunk);
        while let Ok(Some(frame)) = decoder.next_frame() {
            let _ = Message::from_frame(&frame, &limits);
        }
    }
});
