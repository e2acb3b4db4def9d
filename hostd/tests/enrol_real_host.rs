//! `enrol` on a real host: the written authorized_keys line is accepted by the host's own sshd
//! (StrictModes included) and confines the key to the forced command; the written
//! allowed_signers is accepted by `ssh-keygen -Y verify`; the fingerprint is the host's; a
//! second run changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use serde_json::Value;

fn example_binary(name: &str) -> PathBuf {
    clawfleet_vm_tests::cargo_build(
        "clawfleet-hostd",
        clawfleet_vm_tests::Artifact::Example,
        name,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn keygen(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(st.success());
    path
}

#[test]
fn enrol_writes_files_that_sshd_and_ssh_keygen_accept() {
    skip_unless_hosts!();
    let enrol_check = example_binary("enrol_check");
    let keys = tempfile::tempdir().unwrap();
    let login = keygen(keys.path(), "coordinator-login");
    let signing = keygen(keys.path(), "coordinator-signing");
    let other = keygen(keys.path(), "operator");

    let host = TestHost::start().unwrap();
    host.install_file(&enrol_check, "/usr/local/bin/enrol_check", 0o755)
        .unwrap();
    for (local, remote) in [(&login, "/tmp/login.pub"), (&signing, "/tmp/signing.pub")] {
        host.install_file(&local.with_extension("pub"), remote, 0o644)
            .unwrap();
    }
    // An operator's own key, which must survive byte for byte.
    let operator_line = format!(
        "# operator\n{}",
        std::fs::read_to_string(other.with_extension("pub")).unwrap()
    );
    host.run_ok("rm -rf /root/.ssh /etc/clawfleet").unwrap();
    host.write_file(
        "/root/.ssh/authorized_keys",
        operator_line.as_bytes(),
        0o600,
    )
    .unwrap();
    host.run_ok("chmod 700 /root/.ssh").unwrap();

    let cmd = "/usr/local/bin/enrol_check /tmp/login.pub /tmp/signing.pub occ-issuer-1 \
               '/bin/echo forced-command-ran'";
    let first: Value = serde_json::from_str(host.run_ok(cmd).unwrap().trim()).unwrap();
    assert_eq!(first["ok"]["authorizedKeys"], "added", "{first}");
    assert_eq!(first["ok"]["allowedSigners"], "created", "{first}");
    assert_eq!(
        first["ok"]["hostKeyFingerprint"].as_str().unwrap(),
        host.host_key_fingerprint()
    );
    let files = "sha256sum /root/.ssh/authorized_keys /etc/clawfleet/allowed_signers; \
                 stat -c '%a %U:%G %n' /root/.ssh /root/.ssh/authorized_keys /etc/clawfleet \
                 /etc/clawfleet/allowed_signers";
    let before = host.run_ok(files).unwrap();
    assert!(before.contains("700 root:root /root/.ssh\n"), "{before}");
    assert!(
        before.contains("600 root:root /root/.ssh/authorized_keys\n"),
        "{before}"
    );
    assert!(
        before.contains("755 root:root /etc/clawfleet\n"),
        "{before}"
    );
    assert!(
        before.contains("644 root:root /etc/clawfleet/allowed_signers\n"),
        "{before}"
    );
    let written = host.run_ok("cat /root/.ssh/authorized_keys").unwrap();
    assert!(written.starts_with(&operator_line), "{written}");

    // Idempotent.
    let second: Value = serde_json::from_str(host.run_ok(cmd).unwrap().trim()).unwrap();
    assert_eq!(second["ok"]["authorizedKeys"], "unchanged", "{second}");
    assert_eq!(second["ok"]["allowedSigners"], "unchanged", "{second}");
    assert_eq!(host.run_ok(files).unwrap(), before);

    // sshd accepts the key and runs only the forced command, whatever the client asks for.
    let mut options = host.ssh_options();
    let i = options.iter().position(|o| o == "-i").unwrap();
    options[i + 1] = login.clone().into();
    let out = Command::new("ssh")
        .args(&options)
        .arg(format!("root@{}", host.address()))
        .arg("id -u; touch /tmp/not-allowed")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The forced command is hostd's, with the login key's id appended (per-key sessions);
    // nothing of what the client asked for reaches it.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let key_id = stdout
        .trim()
        .strip_prefix("forced-command-ran --key=")
        .unwrap_or_else(|| panic!("not the forced command: {stdout:?}"));
    assert!(
        !key_id.is_empty()
            && key_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{stdout:?}"
    );
    assert!(host.run("test -e /tmp/not-allowed").unwrap().status.code() == Some(1));
    // `restrict`: no port forwarding.
    let fwd = Command::new("ssh")
        .args(&options)
        .args([
            "-o",
            "ExitOnForwardFailure=yes",
            "-R",
            "127.0.0.1:47123:127.0.0.1:22",
        ])
        .arg(format!("root@{}", host.address()))
        .arg("true")
        .output()
        .unwrap();
    assert!(!fwd.status.success(), "port forwarding must be refused");
    assert!(
        String::from_utf8_lossy(&fwd.stderr).contains("forwarding failed"),
        "{}",
        String::from_utf8_lossy(&fwd.stderr)
    );

    // ssh-keygen on the host verifies a signature by the signing key against the file.
    let msg = keys.path().join("msg");
    std::fs::write(&msg, b"an operation envelope").unwrap();
    let st = Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", "clawfleet-operation", "-f"])
        .arg(&signing)
        .arg(&msg)
        .status()
        .unwrap();
    assert!(st.success());
    host.install_file(&msg, "/tmp/msg", 0o644).unwrap();
    host.install_file(&msg.with_extension("sig"), "/tmp/msg.sig", 0o644)
        .unwrap();
    let verify = |principal: &str, namespace: &str| {
        host.run(&format!(
            "ssh-keygen -Y verify -f /etc/clawfleet/allowed_signers -I {principal} \
             -n {namespace} -s /tmp/msg.sig < /tmp/msg"
        ))
        .unwrap()
        .status
        .success()
    };
    assert!(verify("occ-issuer-1", "clawfleet-operation"));
    assert!(!verify("someone-else", "clawfleet-operation"));

    // A different principal for the same signing key is refused, nothing changes.
    let refused: Value = serde_json::from_str(
        host.run_ok(
            "/usr/local/bin/enrol_check /tmp/login.pub /tmp/signing.pub occ-other \
             '/bin/echo forced-command-ran'",
        )
        .unwrap()
        .trim(),
    )
    .unwrap();
    assert!(
        refused["error"].as_str().unwrap().contains("occ-issuer-1"),
        "{refused}"
    );
    assert_eq!(host.run_ok(files).unwrap(), before);
}
