//! A host aged as by years of use, for the benches that measure a long-lived host
//! (`hostd_ops.rs` here, `cutover.rs` in the coordinator's benches, which includes this file):
//! its journal filled with entries of long-expired operations.

use std::process::Command;

use clawfleet_protocol::OperationId;
use clawfleet_vm_tests::TestHost;

/// Fills the host's journal with entries of long-expired operations up to `total`, written as
/// hostd writes them (one tar through ssh), and removes the prune index, as on a host whose
/// hostd predates it. Returns how many it wrote.
pub fn fill_journal(host: &TestHost, total: usize) -> usize {
    let dir = "/var/lib/clawfleet/journal";
    let have: usize = host
        .run_ok(&format!("ls {dir} | grep -c '^[^.].*\\.json$' || true"))
        .unwrap()
        .trim()
        .parse()
        .unwrap_or(0);
    let want = total.saturating_sub(have);
    let scratch = tempfile::tempdir().unwrap();
    let long_ago = hostd::session::now_unix() - 86_400;
    for k in 0..want {
        let entry = hostd::journal::Entry {
            schema: hostd::markers::SCHEMA,
            operation_id: OperationId::new(format!("aged-{k}")).unwrap(),
            kind: clawfleet_protocol::operation::OperationKind::PrepareRevision,
            body_sha256: clawfleet_protocol::Sha256Hex::new("a".repeat(64)).unwrap(),
            expires_at: long_ago + k as u64,
            started_at: long_ago - 600 + k as u64,
            state: hostd::journal::EntryState::Failed {
                failure: clawfleet_protocol::failure::Failure::new(
                    clawfleet_protocol::failure::FailureCode::Internal,
                    "bench filler",
                ),
                after_step: None,
            },
        };
        std::fs::write(
            scratch.path().join(format!("aged-{k}.json")),
            hostd::markers::to_bytes(&entry),
        )
        .unwrap();
    }
    let names: String = (0..want).map(|k| format!("aged-{k}.json\n")).collect();
    let list = scratch.path().join("names");
    std::fs::write(&list, names).unwrap();
    let tar = Command::new("tar")
        .arg("-C")
        .arg(scratch.path())
        .args(["--owner=0", "--group=0", "--mode=0600", "-cf", "-", "-T"])
        .arg(&list)
        .output()
        .unwrap();
    assert!(tar.status.success(), "tar: {tar:?}");
    host.run_with_input(
        &format!("tar -C {dir} -xf - && rm -f {dir}/.index && sync"),
        &tar.stdout,
    )
    .unwrap();
    want
}
