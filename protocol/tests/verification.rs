//! Envelope verification: each kind of bad envelope is refused with its own code.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

mod common;

use clawfleet_protocol::allowed_signers::AllowedSigners;
use clawfleet_protocol::failure::FailureCode;
use clawfleet_protocol::framing::{Message, read_frame, write_frame};
use clawfleet_protocol::operation::{Operation, ProbeArgs};
use clawfleet_protocol::ssh_key::{HashAlg, LineEnding, PrivateKey};
use clawfleet_protocol::time::format_ssh_time;
use clawfleet_protocol::{
    Envelope, HostIdentity, HostName, Limits, SIGNATURE_NAMESPACE, SignedEnvelope, Verifier,
};
use common::*;

fn signers_line(principals: &str, options: &str, key: &PrivateKey) -> String {
    let public = key.public_key().to_openssh().unwrap();
    if options.is_empty() {
        format!("{principals} {public}\n")
    } else {
        format!("{principals} {options} {public}\n")
    }
}

fn verifier(text: &str) -> Verifier {
    Verifier::new(
        AllowedSigners::parse(text).unwrap(),
        HostIdentity {
            name: HostName::new("host-1.example").unwrap(),
            host_key: host_key_fingerprint(),
        },
    )
}

fn probe() -> Envelope {
    envelope(Operation::Probe(ProbeArgs {}))
}

fn code(
    result: Result<impl std::fmt::Debug, clawfleet_protocol::signing::Rejection>,
) -> FailureCode {
    match result {
        Err(r) => r.failure.code,
        Ok(v) => panic!("expected a rejection, got {v:?}"),
    }
}

#[test]
fn a_good_envelope_verifies_for_every_operation() {
    let key = new_key();
    let v = verifier(&signers_line("occ@fleet", "", &key));
    for op in every_operation() {
        let env = envelope(op);
        let signed = SignedEnvelope::sign(&env, &key).unwrap();
        let ok = v.verify(&signed, NOW).unwrap();
        assert_eq!(ok.envelope, env);
        assert_eq!(
            ok.signer,
            clawfleet_protocol::signing::fingerprint(key.public_key())
        );
    }
}

#[test]
fn each_bad_envelope_gets_its_own_code() {
    let key = new_key();
    let v = verifier(&signers_line("occ@fleet", "", &key));
    let signed = SignedEnvelope::sign(&probe(), &key).unwrap();

    // Tampered body: one byte changed after signing.
    let mut tampered = signed.clone();
    let pos = tampered.body.iter().position(|b| *b == b'4').unwrap();
    tampered.body[pos] = b'5';
    let r = v.verify(&tampered, NOW).unwrap_err();
    assert_eq!(r.failure.code, FailureCode::SignatureInvalid);
    assert_eq!(r.operation_id, None, "an untrusted id is never echoed");

    // Garbage signature.
    let mut garbage = signed.clone();
    garbage.signature = "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n".into();
    assert_eq!(code(v.verify(&garbage, NOW)), FailureCode::SignatureInvalid);

    // Right key, wrong SSHSIG namespace.
    let sig = key
        .sign("git", HashAlg::Sha512, &signed.body)
        .unwrap()
        .to_pem(LineEnding::LF)
        .unwrap();
    let wrong_ns = SignedEnvelope {
        body: signed.body.clone(),
        signature: sig,
    };
    assert_eq!(
        code(v.verify(&wrong_ns, NOW)),
        FailureCode::SignatureInvalid
    );

    // Unknown signer.
    let stranger = SignedEnvelope::sign(&probe(), &new_key()).unwrap();
    assert_eq!(code(v.verify(&stranger, NOW)), FailureCode::UnknownSigner);

    // Known key, but the envelope names an issuer the key may not sign as.
    let mut other_issuer = probe();
    other_issuer.issuer = clawfleet_protocol::Principal::new("admin@fleet").unwrap();
    let r = v
        .verify(&SignedEnvelope::sign(&other_issuer, &key).unwrap(), NOW)
        .unwrap_err();
    assert_eq!(r.failure.code, FailureCode::UnknownSigner);
    assert!(r.operation_id.is_some());

    // Expired, and exactly at expiry.
    assert_eq!(
        code(v.verify(&signed, NOW + 300)),
        FailureCode::EnvelopeExpired
    );
    assert_eq!(
        code(v.verify(&signed, NOW + 10_000)),
        FailureCode::EnvelopeExpired
    );

    // Not yet valid beyond the skew; within the skew it passes.
    assert!(v.verify(&signed, NOW - 60).is_ok());
    assert_eq!(
        code(v.verify(&signed, NOW - 61)),
        FailureCode::EnvelopeNotYetValid
    );

    // Wrong host name, wrong host key.
    let mut wrong_name = probe();
    wrong_name.target.host = HostName::new("host-2.example").unwrap();
    assert_eq!(
        code(v.verify(&SignedEnvelope::sign(&wrong_name, &key).unwrap(), NOW)),
        FailureCode::WrongHost
    );
    let mut wrong_key = probe();
    wrong_key.target.host_key =
        clawfleet_protocol::Fingerprint::new(format!("SHA256:{}", "B".repeat(43))).unwrap();
    assert_eq!(
        code(v.verify(&SignedEnvelope::sign(&wrong_key, &key).unwrap(), NOW)),
        FailureCode::WrongHost
    );

    // A lifetime beyond the host's maximum.
    let mut long = probe();
    long.expires_at = NOW + 7200;
    assert_eq!(
        code(v.verify(&SignedEnvelope::sign(&long, &key).unwrap(), NOW)),
        FailureCode::InvalidInput
    );

    // Oversized body.
    let mut small = verifier(&signers_line("occ@fleet", "", &key));
    small.limits = Limits {
        max_envelope: 100,
        ..Limits::default()
    };
    assert_eq!(code(small.verify(&signed, NOW)), FailureCode::InputTooLarge);

    // A validly signed body that is not a valid envelope.
    let junk = SignedEnvelope::sign_bytes(b"{\"version\":1}".to_vec(), &key).unwrap();
    assert_eq!(code(v.verify(&junk, NOW)), FailureCode::InvalidInput);
    let newer = SignedEnvelope::sign_bytes(b"{\"version\":7}".to_vec(), &key).unwrap();
    assert_eq!(code(v.verify(&newer, NOW)), FailureCode::UnsupportedVersion);
}

#[test]
fn signer_windows_and_namespaces_of_allowed_signers_apply() {
    let key = new_key();
    let signed = SignedEnvelope::sign(&probe(), &key).unwrap();
    let after = format!("valid-after=\"{}\"", format_ssh_time(NOW + 10));
    let before = format!("valid-before=\"{}\"", format_ssh_time(NOW - 10));
    assert_eq!(
        code(verifier(&signers_line("occ@fleet", &after, &key)).verify(&signed, NOW)),
        FailureCode::SignerNotValid
    );
    assert_eq!(
        code(verifier(&signers_line("occ@fleet", &before, &key)).verify(&signed, NOW)),
        FailureCode::SignerNotValid
    );
    let window = format!(
        "valid-after=\"{}\",valid-before=\"{}\"",
        format_ssh_time(NOW - 10),
        format_ssh_time(NOW + 10)
    );
    assert!(
        verifier(&signers_line("occ@fleet", &window, &key))
            .verify(&signed, NOW)
            .is_ok()
    );
    let ns_ok = format!("namespaces=\"git,{SIGNATURE_NAMESPACE}\"");
    assert!(
        verifier(&signers_line("occ@fleet", &ns_ok, &key))
            .verify(&signed, NOW)
            .is_ok()
    );
    assert_eq!(
        code(verifier(&signers_line("occ@fleet", "namespaces=\"git\"", &key)).verify(&signed, NOW)),
        FailureCode::UnknownSigner
    );
    // Several principals on one line; the issuer is one of them.
    assert!(
        verifier(&signers_line("ops,occ@fleet,backup", "", &key))
            .verify(&signed, NOW)
            .is_ok()
    );
}

#[test]
fn envelopes_travel_in_frames_byte_for_byte() {
    let key = new_key();
    let signed = SignedEnvelope::sign(&envelope(every_operation()[3].clone()), &key).unwrap();
    let mut wire = Vec::new();
    let frame = Message::Envelope(signed.clone()).to_frame().unwrap();
    write_frame(&mut wire, &frame, Limits::default().max_frame).unwrap();
    let back = read_frame(&mut wire.as_slice(), Limits::default().max_frame)
        .unwrap()
        .unwrap();
    match Message::from_frame(&back, &Limits::default()).unwrap() {
        Message::Envelope(got) => {
            assert_eq!(got, signed);
            assert!(
                verifier(&signers_line("occ@fleet", "", &key))
                    .verify(&got, NOW)
                    .is_ok()
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn envelope_payload_limits() {
    let key = new_key();
    let signed = SignedEnvelope::sign(&probe(), &key).unwrap();
    let payload = signed.to_payload();
    let tight = Limits {
        max_signature: 10,
        ..Limits::default()
    };
    assert!(SignedEnvelope::from_payload(&payload, &tight).is_err());
    let mut lying = payload.clone();
    lying[..4].copy_from_slice(&(u32::MAX).to_be_bytes());
    assert!(SignedEnvelope::from_payload(&lying, &Limits::default()).is_err());
    assert!(SignedEnvelope::from_payload(&payload[..3], &Limits::default()).is_err());
}
