//! Interop with the real OpenSSH `ssh-keygen -Y`: signatures cross in both directions, and
//! for a set of allowed_signers files the crate and ssh-keygen give the same verdict.
//!
//! Needs `ssh-keygen` (package openssh-client, installed by `.ci/run`). Without it the tests
//! say so and pass, except under `CI=true`, where a missing tool is a failure.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clawfleet_protocol::allowed_signers::AllowedSigners;
use clawfleet_protocol::operation::{Operation, ProbeArgs};
use clawfleet_protocol::signing::load_signing_key;
use clawfleet_protocol::ssh_key::{HashAlg, LineEnding, PrivateKey, SshSig};
use clawfleet_protocol::time::format_ssh_time;
use clawfleet_protocol::{HostIdentity, HostName, SIGNATURE_NAMESPACE, SignedEnvelope, Verifier};
use common::*;

fn ssh_keygen_available() -> bool {
    let found = Command::new("ssh-keygen")
        .arg("-?")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "ssh-keygen is missing under CI; .ci/run must install openssh-client"
        );
        eprintln!(
            "SKIP: ssh-keygen not found; install openssh-client to run the OpenSSH interop tests"
        );
    }
    found
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `ssh-keygen -Y verify`; true when it says the signature is good.
fn keygen_verify(
    dir: &Path,
    allowed: &str,
    principal: &str,
    namespace: &str,
    body: &[u8],
    signature: &str,
    at: u64,
) -> bool {
    let allowed_path = write(dir, "allowed_signers", allowed.as_bytes());
    let sig_path = write(dir, "body.sig", signature.as_bytes());
    let mut child = Command::new("ssh-keygen")
        .args(["-Y", "verify", "-f"])
        .arg(&allowed_path)
        .args(["-I", principal, "-n", namespace, "-s"])
        .arg(&sig_path)
        .arg(format!("-Overify-time={}", format_ssh_time(at)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    out.status.success()
}

fn keygen_new_key(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
    path
}

fn keygen_sign(key: &Path, namespace: &str, body_path: &Path) -> String {
    let status = Command::new("ssh-keygen")
        .args(["-Y", "sign", "-f"])
        .arg(key)
        .args(["-n", namespace])
        .arg(body_path)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let sig_path = PathBuf::from(format!("{}.sig", body_path.display()));
    let text = std::fs::read_to_string(&sig_path).unwrap();
    std::fs::remove_file(sig_path).unwrap();
    text
}

fn public_line(key: &PrivateKey) -> String {
    key.public_key().to_openssh().unwrap()
}

fn host_verifier(allowed: &str) -> Verifier {
    Verifier::new(
        AllowedSigners::parse(allowed).unwrap(),
        HostIdentity {
            name: HostName::new("host-1.example").unwrap(),
            host_key: host_key_fingerprint(),
        },
    )
}

#[test]
fn crate_signatures_verify_with_ssh_keygen() {
    if !ssh_keygen_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = new_key();
    let allowed = format!("occ@fleet {}\n", public_line(&key));
    for op in every_operation() {
        let signed = SignedEnvelope::sign(&envelope(op), &key).unwrap();
        assert!(keygen_verify(
            dir.path(),
            &allowed,
            "occ@fleet",
            SIGNATURE_NAMESPACE,
            &signed.body,
            &signed.signature,
            NOW
        ));
        // And ssh-keygen refuses the same signature over a changed body.
        let mut body = signed.body.clone();
        body.push(b' ');
        assert!(!keygen_verify(
            dir.path(),
            &allowed,
            "occ@fleet",
            SIGNATURE_NAMESPACE,
            &body,
            &signed.signature,
            NOW
        ));
    }
}

#[test]
fn ssh_keygen_signatures_verify_in_the_crate() {
    if !ssh_keygen_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key_path = keygen_new_key(dir.path(), "occ-signing");
    let public = std::fs::read_to_string(key_path.with_extension("pub")).unwrap();
    let allowed = format!("occ@fleet {public}");
    let env = envelope(Operation::Probe(ProbeArgs {}));
    let body = env.to_bytes().unwrap();
    let body_path = write(dir.path(), "envelope.json", &body);
    let signature = keygen_sign(&key_path, SIGNATURE_NAMESPACE, &body_path);
    let verified = host_verifier(&allowed)
        .verify(
            &SignedEnvelope {
                body: body.clone(),
                signature: signature.clone(),
            },
            NOW,
        )
        .unwrap();
    assert_eq!(verified.envelope, env);

    // The crate loads ssh-keygen's key file and its signatures verify with ssh-keygen.
    let loaded = load_signing_key(&key_path).unwrap();
    let signed = SignedEnvelope::sign(&env, &loaded).unwrap();
    assert!(keygen_verify(
        dir.path(),
        &allowed,
        "occ@fleet",
        SIGNATURE_NAMESPACE,
        &signed.body,
        &signed.signature,
        NOW
    ));

    // ssh-keygen's signature in another namespace is refused by the host.
    let other = keygen_sign(&key_path, "git", &body_path);
    let r = host_verifier(&allowed)
        .verify(
            &SignedEnvelope {
                body,
                signature: other,
            },
            NOW,
        )
        .unwrap_err();
    assert_eq!(
        r.failure.code,
        clawfleet_protocol::FailureCode::SignatureInvalid
    );
}

/// The crate's verdict in the terms ssh-keygen uses.
fn crate_verdict(
    allowed: &str,
    principal: &str,
    namespace: &str,
    body: &[u8],
    sig: &str,
    at: u64,
) -> bool {
    let Ok(signers) = AllowedSigners::parse(allowed) else {
        return false;
    };
    let Ok(sig) = SshSig::from_pem(sig.as_bytes()) else {
        return false;
    };
    signers.verify(principal, namespace, body, &sig, at).is_ok()
}

#[test]
fn allowed_signers_verdicts_match_ssh_keygen() {
    if !ssh_keygen_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let signer = new_key();
    let other = new_key();
    let me = public_line(&signer);
    let them = public_line(&other);
    let body = envelope(Operation::Probe(ProbeArgs {})).to_bytes().unwrap();
    let sig = signer
        .sign(SIGNATURE_NAMESPACE, HashAlg::Sha512, &body)
        .unwrap()
        .to_pem(LineEnding::LF)
        .unwrap();
    let t = |offset: i64| format_ssh_time(NOW.checked_add_signed(offset).unwrap());
    let ns = SIGNATURE_NAMESPACE;

    // (description, file, principal to check, expected verdict)
    let cases: Vec<(&str, String, &str, bool)> = vec![
        (
            "plain entry",
            format!("occ@fleet {me}\n"),
            "occ@fleet",
            true,
        ),
        (
            "wrong principal",
            format!("occ@fleet {me}\n"),
            "admin@fleet",
            false,
        ),
        (
            "several principals: first",
            format!("a,occ@fleet,b {me}\n"),
            "a",
            true,
        ),
        (
            "several principals: middle",
            format!("a,occ@fleet,b {me}\n"),
            "occ@fleet",
            true,
        ),
        (
            "several principals: none",
            format!("a,occ@fleet,b {me}\n"),
            "c",
            false,
        ),
        (
            "unknown key",
            format!("occ@fleet {them}\n"),
            "occ@fleet",
            false,
        ),
        (
            "key on a later line",
            format!("occ@fleet {them}\nocc@fleet {me}\n"),
            "occ@fleet",
            true,
        ),
        (
            "comment and blank lines",
            format!("# trusted\n\nocc@fleet {me} laptop\n"),
            "occ@fleet",
            true,
        ),
        (
            "namespace allowed",
            format!("occ@fleet namespaces=\"{ns}\" {me}\n"),
            "occ@fleet",
            true,
        ),
        (
            "namespace in a list",
            format!("occ@fleet namespaces=\"git,{ns},file\" {me}\n"),
            "occ@fleet",
            true,
        ),
        (
            "wrong namespace",
            format!("occ@fleet namespaces=\"git\" {me}\n"),
            "occ@fleet",
            false,
        ),
        (
            "valid-after in the past",
            format!("occ@fleet valid-after=\"{}\" {me}\n", t(-3600)),
            "occ@fleet",
            true,
        ),
        (
            "valid-after in the future",
            format!("occ@fleet valid-after=\"{}\" {me}\n", t(3600)),
            "occ@fleet",
            false,
        ),
        (
            "valid-after exactly now",
            format!("occ@fleet valid-after=\"{}\" {me}\n", t(0)),
            "occ@fleet",
            true,
        ),
        (
            "valid-before in the future",
            format!("occ@fleet valid-before=\"{}\" {me}\n", t(3600)),
            "occ@fleet",
            true,
        ),
        (
            "expired window",
            format!("occ@fleet valid-before=\"{}\" {me}\n", t(-1)),
            "occ@fleet",
            false,
        ),
        (
            "valid-before exactly now",
            format!("occ@fleet valid-before=\"{}\" {me}\n", t(0)),
            "occ@fleet",
            true,
        ),
        (
            "window around now",
            format!(
                "occ@fleet valid-after=\"{}\",valid-before=\"{}\" {me}\n",
                t(-60),
                t(60)
            ),
            "occ@fleet",
            true,
        ),
        (
            "window in the past",
            format!(
                "occ@fleet valid-after=\"{}\",valid-before=\"{}\" {me}\n",
                t(-7200),
                t(-3600)
            ),
            "occ@fleet",
            false,
        ),
        (
            "day-only date",
            format!("occ@fleet valid-after=\"20200101Z\" {me}\n"),
            "occ@fleet",
            true,
        ),
        (
            "upper-case option name",
            format!("occ@fleet VALID-AFTER=\"{}\" {me}\n", t(-60)),
            "occ@fleet",
            true,
        ),
        (
            "all options",
            format!(
                "occ@fleet namespaces=\"{ns}\",valid-after=\"{}\",valid-before=\"{}\" {me}\n",
                t(-60),
                t(60)
            ),
            "occ@fleet",
            true,
        ),
        (
            "unsupported option: cert-authority",
            format!("occ@fleet cert-authority {me}\n"),
            "occ@fleet",
            false,
        ),
        (
            "unsupported option: unknown",
            format!("occ@fleet no-touch-required=\"x\" {me}\n"),
            "occ@fleet",
            false,
        ),
        (
            "unsupported option: unknown flag",
            format!("occ@fleet restrict {me}\n"),
            "occ@fleet",
            false,
        ),
    ];
    let mut mismatches = Vec::new();
    for (what, file, principal, expected) in &cases {
        let ours = crate_verdict(file, principal, ns, &body, &sig, NOW);
        let theirs = keygen_verify(dir.path(), file, principal, ns, &body, &sig, NOW);
        if ours != theirs || ours != *expected {
            mismatches.push(format!(
                "{what}: crate {ours}, ssh-keygen {theirs}, expected {expected}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "verdicts differ:\n{}",
        mismatches.join("\n")
    );

    // Where hostd is deliberately stricter than OpenSSH (a bad line anywhere invalidates the
    // file), it refuses; it never accepts what ssh-keygen refuses.
    let stricter = [
        format!("occ@fleet {me}\nother cert-authority {them}\n"),
        format!("occ@fleet valid-after=\"20200101\" {me}\n"),
        format!("occ* {me}\n"),
    ];
    for file in &stricter {
        assert!(AllowedSigners::parse(file).is_err(), "{file}");
    }
}
