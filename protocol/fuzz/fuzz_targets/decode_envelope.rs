#![no_main]
//! The envelope decoder and the verifier on arbitrary bytes: they must return errors, never
//! panic, hang or allocate without bound.

use clawfleet_protocol::{
    AllowedSigners, Envelope, Fingerprint, HostIdentity, HostName, Limits, SignedEnvelope,
    Verifier,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let _ = Envelope::decode(data, &limits);
    if let Ok(signed) = SignedEnvelope::from_payload(data, &limits) {
        if let (Ok(name), Ok(host_key)) = (
            HostName::new("fuzz-host"),
            Fingerprint::new("SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s"),
        ) {
            let verifier = Verifier::new(AllowedSigners::default(), HostIdentity { name, host_key });
            let _ = verifier.verify(&signed, 1_800_000_000);
        }
    }
});
