//! Property tests: arbitrary bytes never panic the decoders, the framing or the verifier.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

mod common;

use clawfleet_protocol::allowed_signers::AllowedSigners;
use clawfleet_protocol::framing::{Frame, FrameDecoder, FrameKind, read_frame};
use clawfleet_protocol::time::parse_ssh_time;
use clawfleet_protocol::{
    Envelope, HostIdentity, HostName, Limits, Message, SignedEnvelope, Verifier,
};
use common::*;
use proptest::prelude::*;

fn valid_body() -> Vec<u8> {
    envelope(every_operation()[3].clone()).to_bytes().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn envelope_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = Envelope::decode(&bytes, &Limits::default());
    }

    #[test]
    fn mutated_envelopes_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let mut body = valid_body();
        for (index, byte) in flips {
            let i = index.index(body.len());
            body[i] = byte;
        }
        let _ = Envelope::decode(&body, &Limits::default());
    }

    #[test]
    fn json_shaped_input_never_panics(text in "[{}\\[\\]\":,a-z0-9 .-]{0,400}") {
        let _ = Envelope::decode(text.as_bytes(), &Limits::default());
    }

    #[test]
    fn framing_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        chunk in 1usize..64,
    ) {
        let _ = read_frame(&mut bytes.as_slice(), 1024);
        let mut dec = FrameDecoder::new(1024);
        for part in bytes.chunks(chunk) {
            dec.push(part);
            while let Ok(Some(_)) = dec.next_frame() {}
        }
    }

    #[test]
    fn framed_headers_with_random_payloads_never_panic(
        kind in 1u8..=4,
        payload in proptest::collection::vec(any::<u8>(), 0..1024),
    ) {
        let kind = match kind { 1 => FrameKind::Hello, 2 => FrameKind::Envelope, 3 => FrameKind::Result, _ => FrameKind::Progress };
        let frame = Frame { kind, payload };
        let _ = Message::from_frame(&frame, &Limits::default());
        let _ = SignedEnvelope::from_payload(&frame.payload, &Limits::default());
    }

    #[test]
    fn verifier_never_panics(
        body in proptest::collection::vec(any::<u8>(), 0..512),
        signature in "[ -~\n]{0,600}",
    ) {
        let v = Verifier::new(
            AllowedSigners::default(),
            HostIdentity { name: HostName::new("h").unwrap(), host_key: host_key_fingerprint() },
        );
        let _ = v.verify(&SignedEnvelope { body, signature }, NOW);
    }

    #[test]
    fn allowed_signers_parser_never_panics(text in "[ -~\n\t]{0,600}") {
        let _ = AllowedSigners::parse(&text);
    }

    #[test]
    fn allowed_signers_lines_never_panic(
        principals in "[a-z@,*!\"]{0,20}",
        options in "[a-z=\",0-9Z -]{0,60}",
    ) {
        let line = format!("{principals} {options} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtlzZ3MFfuteL1oS3yr1Yx72/TNBkiGm1NN+JwrXN+M");
        let _ = AllowedSigners::parse(&line);
    }

    #[test]
    fn time_parser_never_panics(text in "[0-9Zz]{0,20}") {
        let _ = parse_ssh_time(&text);
    }
}
