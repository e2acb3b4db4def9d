//! hostd on a real host (systemd PID 1, D-Bus, sshd), enrolled with `hostd enrol` and driven
//! through the stock OpenSSH client with the forced command: the whole Agent lifecycle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use clawfleet_protocol::failure::FailureCode;
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::{OperationResult, Step};
use clawfleet_vm_tests::skip_unless_hosts;
use hosts_support::*;
use serde_json::json;

fn stat(host: &clawfleet_vm_tests::TestHost, path: &str) -> String {
    host.run_ok(&format!("stat -c '%a %U %G %F' {path}"))
        .unwrap()
        .trim()
        .to_owned()
}

fn port(r: &OperationResult) -> u16 {
    match r {
        OperationResult::PrepareRevision(p) => p.observation.port.unwrap(),
        other => panic!("{other:?}"),
    }
}

/// The unit's run: its main process and invocation (both change only when systemd starts it).
fn unit_run(host: &clawfleet_vm_tests::TestHost, unit: &str) -> (String, String) {
    let out = host
        .run_ok(&format!(
            "systemctl show -P MainPID {unit}; systemctl show -P InvocationID {unit}"
        ))
        .unwrap();
    let mut lines = out.lines().map(|l| l.trim().to_owned());
    (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    )
}

/// The pid of the gateway answering on `port` (the test gateway's `/info`).
fn gateway_pid(host: &clawfleet_vm_tests::TestHost, port: u16) -> String {
    let (_, info) = curl(host, port, "/info");
    let info: serde_json::Value = serde_json::from_str(info.trim()).unwrap();
    info["pid"].to_string()
}

#[test]
fn two_agents_full_lifecycle_on_a_real_host() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");

    // probe: no lock, nothing missing.
    match occ.ok(&host, Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => {
            assert!(p.missing_tools.is_empty(), "{:?}", p.missing_tools);
            assert!(p.systemd_version.is_some());
            assert_eq!(p.host_key.as_str(), host.host_key_fingerprint());
        }
        other => panic!("{other:?}"),
    }

    occ.ok(&host, ensure("ns1"));
    occ.ok(&host, ensure("ns2"));
    // a1's gateway looks at its configuration file every millisecond, as a file-system watch
    // would: one that saw a cutover's new configuration before its relaunch would restart
    // itself, and the unit with it.
    let r1 = spec("rev-1", 1, json!({"label": "a1-rev-1", "configPollMs": 1}));
    let b1 = spec("rev-1", 1, json!({"label": "b1-rev-1"}));
    let p1 = port(&occ.ok(&host, prepare("ns1", "a1", &r1)));
    let p2 = port(&occ.ok(&host, prepare("ns2", "b1", &b1)));
    assert_ne!(p1, p2);

    let layout = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system");
    let a = layout.agent(&id("ns1"), &id("a1"));
    let b = layout.agent(&id("ns2"), &id("b1"));
    let (adir, bdir) = (a.dir.display().to_string(), b.dir.display().to_string());
    // Preparation stages only: no unit, no current.
    assert!(
        host.run(&format!("test -e {}", a.unit_file.display()))
            .unwrap()
            .status
            .code()
            == Some(1)
    );
    assert!(
        host.run(&format!("test -e {adir}/current"))
            .unwrap()
            .status
            .code()
            == Some(1)
    );
    // Modes and owners.
    assert_eq!(
        stat(&host, &adir),
        format!("750 root {} directory", a.account)
    );
    assert_eq!(
        stat(&host, &format!("{adir}/home")),
        format!("700 {0} {0} directory", a.account)
    );
    assert_eq!(
        stat(&host, &format!("{adir}/state")),
        format!("700 {0} {0} directory", a.account)
    );
    assert_eq!(
        stat(&host, &format!("{adir}/gateway-password.env")),
        "600 root root regular file"
    );
    let snap = a.revision_dir(&id("rev-1"));
    assert_eq!(
        stat(&host, &format!("{}/openclaw.json", snap.display())),
        format!("640 root {} regular file", a.account)
    );
    assert_eq!(
        stat(&host, &format!("{}/revision.json", snap.display())),
        "600 root root regular file"
    );
    // Distinct system accounts.
    let ua = host
        .run_ok(&format!("id -u {0}; id -g {0}", a.account))
        .unwrap();
    let ub = host
        .run_ok(&format!("id -u {0}; id -g {0}", b.account))
        .unwrap();
    assert_ne!(ua, ub);

    // Activate both.
    for (n, ag, rev) in [("ns1", "a1", &r1), ("ns2", "b1", &b1)] {
        match occ.ok(
            &host,
            Operation::ActivateRevision(ActivateArgs::from(rargs(n, ag, rev))),
        ) {
            OperationResult::ActivateRevision(r) => {
                assert!(r.restarted && r.unit_changed);
                assert_eq!(r.observation.served, Some(id("rev-1")));
                let u = r.observation.unit.unwrap();
                assert_eq!((u.active_state.as_str(), u.enabled), ("active", true));
            }
            other => panic!("{other:?}"),
        }
    }
    let (code, body) = curl(&host, p1, "/readyz");
    assert_eq!(code, 200, "{body}");
    let (_, info) = curl(&host, p1, "/info");
    let info: serde_json::Value = serde_json::from_str(info.trim()).unwrap();
    assert_eq!(info["label"], "a1-rev-1");
    assert_eq!(info["uid"].to_string(), ua.lines().next().unwrap().trim());

    // Sibling isolation: a1's user reads its own state and config, not b1's.
    let own = host
        .run(&format!(
            "runuser -u {} -- cat {adir}/current/openclaw.json",
            a.account
        ))
        .unwrap();
    assert!(own.status.success());
    for path in [
        format!("{bdir}/current/openclaw.json"),
        format!("{bdir}/state"),
        format!("{bdir}/gateway-password.env"),
    ] {
        let other = host
            .run(&format!("runuser -u {} -- ls -la {path}", a.account))
            .unwrap();
        assert!(!other.status.success(), "{} can read {path}", a.account);
    }
    host.run_ok(&format!(
        "runuser -u {} -- touch {adir}/state/mine",
        a.account
    ))
    .unwrap();

    // Replace a1 with revision 2: a revision-only cutover, no daemon-reload, and no restart
    // of the unit either: its launcher relaunches the gateway inside the same unit run
    // (hostd/src/supervise.rs).
    let run_before = unit_run(&host, &a.unit_name);
    let gateway_before = gateway_pid(&host, p1);
    let unit_before = host
        .run_ok(&format!("stat -c %i:%Y {}", a.unit_file.display()))
        .unwrap();
    let r2 = spec("rev-2", 2, json!({"label": "a1-rev-2", "configPollMs": 1}));
    occ.ok(&host, prepare("ns1", "a1", &r2));
    let (_, still) = curl(&host, p1, "/info");
    assert!(
        still.contains("a1-rev-1"),
        "prepare must not cut over: {still}"
    );
    let id2 = occ.next_id();
    let out = occ.session(
        &host,
        &[occ.sign(&occ.envelope(
            &host,
            &id2,
            Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r2))),
        ))],
    );
    let steps: Vec<Step> = progress(&out).iter().map(|p| p.step).collect();
    assert!(!steps.contains(&Step::DaemonReload), "{steps:?}");
    assert!(steps.contains(&Step::PointerFlip) && steps.contains(&Step::Readiness));
    match &results(&out)[0].outcome {
        clawfleet_protocol::result::Outcome::Succeeded {
            result: OperationResult::ActivateRevision(r),
        } => {
            assert!(!r.unit_changed && r.restarted);
            assert_eq!(r.observation.served, Some(id("rev-2")));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        host.run_ok(&format!("stat -c %i:%Y {}", a.unit_file.display()))
            .unwrap(),
        unit_before
    );
    let (_, info) = curl(&host, p1, "/info");
    assert!(info.contains("a1-rev-2"), "{info}");
    assert_eq!(
        unit_run(&host, &a.unit_name),
        run_before,
        "the unit was restarted, not its gateway relaunched"
    );
    let gateway_after = gateway_pid(&host, p1);
    assert_ne!(
        gateway_after, gateway_before,
        "the gateway was not relaunched"
    );
    assert_eq!(
        host.run_ok(&format!("ps -o ppid= -p {gateway_after}"))
            .unwrap()
            .trim(),
        run_before.0,
        "the new gateway is not the launcher's child"
    );
    assert!(
        host.run(&format!("kill -0 {gateway_before}"))
            .unwrap()
            .status
            .code()
            != Some(0),
        "the old gateway outlived the relaunch"
    );
    // What systemd reads only at a start changed (the operator's env file): the next
    // cutover restarts the unit, and the gateway sees the new value.
    host.run_ok(&format!("echo CF_OPERATOR_VALUE=v2 > {adir}/env"))
        .unwrap();
    let r3 = spec("rev-3", 3, json!({"label": "a1-rev-3"}));
    occ.ok(&host, prepare("ns1", "a1", &r3));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r3))),
    );
    let run_restarted = unit_run(&host, &a.unit_name);
    assert_ne!(
        run_restarted.1, run_before.1,
        "a changed env file needs a restart"
    );
    let (_, info) = curl(&host, p1, "/info");
    assert!(info.contains("a1-rev-3"), "{info}");
    let env = host
        .run_ok(&format!(
            "tr '\\0' '\\n' < /proc/{}/environ",
            gateway_pid(&host, p1)
        ))
        .unwrap();
    assert!(env.contains("CF_OPERATOR_VALUE=v2"), "{env}");
    // And the cutover after that, with nothing new to read, is in place again.
    let r4 = spec("rev-4", 4, json!({"label": "a1-rev-4"}));
    occ.ok(&host, prepare("ns1", "a1", &r4));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r4))),
    );
    assert_eq!(unit_run(&host, &a.unit_name), run_restarted);
    let (_, info) = curl(&host, p1, "/info");
    assert!(info.contains("a1-rev-4"), "{info}");
    let r2 = r4;
    // Activating again is a no-op (fast path).
    match occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r2))),
    ) {
        OperationResult::ActivateRevision(r) => assert!(!r.restarted),
        other => panic!("{other:?}"),
    }

    // Retire revision 1; stop (twice); re-activate.
    occ.ok(&host, Operation::RetireRevision(rargs("ns1", "a1", &r1)));
    assert!(
        host.run(&format!("test -d {}", snap.display()))
            .unwrap()
            .status
            .code()
            == Some(1)
    );
    match occ.ok(&host, Operation::StopRevision(rargs("ns1", "a1", &r2))) {
        OperationResult::StopRevision(s) => {
            assert!(s.stopped);
            let u = s.observation.unit.unwrap();
            assert_eq!((u.active_state.as_str(), u.enabled), ("inactive", false));
        }
        other => panic!("{other:?}"),
    }
    assert_ne!(curl(&host, p1, "/readyz").0, 200);
    occ.ok(&host, Operation::StopRevision(rargs("ns1", "a1", &r2)));
    host.run_ok(&format!(
        "test -f {adir}/state/mine && test -f {adir}/gateway-password.env"
    ))
    .unwrap();
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r2))),
    );
    assert_eq!(curl(&host, p1, "/readyz").0, 200);

    // Status from the host itself.
    let table = host.run_ok("hostd status").unwrap();
    assert!(
        table.contains("a1") && table.contains("rev-4") && table.contains("active/running"),
        "{table}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&host.run_ok("hostd status --json").unwrap()).unwrap();
    assert_eq!(json["problems"], json!([]));

    // Delete a1, then Namespace ns2 with b1 still in it.
    occ.ok(
        &host,
        Operation::DeleteAgent(AgentArgs {
            namespace: ns("ns1"),
            agent: agent("a1"),
        }),
    );
    assert!(
        host.run(&format!("id {}", a.account))
            .unwrap()
            .status
            .code()
            != Some(0)
    );
    assert!(
        host.run(&format!("test -e {}", a.unit_file.display()))
            .unwrap()
            .status
            .code()
            == Some(1)
    );
    assert!(host.run(&format!("test -e {adir}")).unwrap().status.code() == Some(1));
    match occ.ok(
        &host,
        Operation::DeleteNamespace(NamespaceArgs {
            namespace: ns("ns2"),
        }),
    ) {
        OperationResult::DeleteNamespace(d) => assert_eq!(d.agents_removed, 1),
        other => panic!("{other:?}"),
    }
    assert!(
        host.run(&format!("id {}", b.account))
            .unwrap()
            .status
            .code()
            != Some(0)
    );
    assert_ne!(curl(&host, p2, "/readyz").0, 200);
    occ.ok(
        &host,
        Operation::DeleteNamespace(NamespaceArgs {
            namespace: ns("ns1"),
        }),
    );
    let left = host.run_ok("ls /var/lib/clawfleet/namespaces /var/lib/clawfleet/accounts /var/lib/clawfleet/ports; ls /etc/systemd/system | grep clawfleet-agent || true").unwrap();
    assert!(
        !left.contains("cfa-") && !left.contains("clawfleet-agent-") && !left.contains(".json"),
        "{left}"
    );
}

#[test]
fn refusals_change_nothing_on_a_real_host() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "x"}));
    occ.ok(&host, prepare("ns1", "a1", &r1));
    let layout = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system");
    let a = layout.agent(&id("ns1"), &id("a1"));
    let snapshot = || {
        host.run_ok("find /var/lib/clawfleet /etc/systemd/system -newer /etc/hostname -printf '%p %s %T@\\n' | grep -v /var/lib/clawfleet/journal | sort").unwrap()
    };

    // Tampered marker.
    host.run_ok(&format!(
        "cp {0} /root/agent.json.orig && sed -i 's/\"port\"/\"extra\": 1, \"port\"/' {0}",
        a.marker.display()
    ))
    .unwrap();
    let before = snapshot();
    let f = occ.fails(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
    assert_eq!(snapshot(), before);
    host.run_ok(&format!("cp /root/agent.json.orig {}", a.marker.display()))
        .unwrap();

    // A foreign unit at our unit's name.
    host.write_file(
        &a.unit_file.display().to_string(),
        b"[Service]\nExecStart=/bin/true\n",
        0o644,
    )
    .unwrap();
    let f = occ.fails(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
    assert_eq!(
        host.run_ok(&format!("cat {}", a.unit_file.display()))
            .unwrap(),
        "[Service]\nExecStart=/bin/true\n"
    );
    host.run_ok(&format!("rm {}", a.unit_file.display()))
        .unwrap();

    // A foreign account at the name of a new Agent's account.
    let foreign = layout.agent(&id("ns1"), &id("a2")).account;
    host.run_ok(&format!("useradd --system {foreign}")).unwrap();
    let f = occ.fails(&host, prepare("ns1", "a2", &r1));
    assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
    host.run_ok(&format!("id {foreign}")).unwrap();

    // Envelopes: replayed with another body, expired, forged, wrong host.
    let id1 = occ.next_id();
    let probe = occ.sign(&occ.envelope(&host, &id1, ensure("ns1")));
    let replay_other = occ.sign(&occ.envelope(&host, &id1, ensure("ns9")));
    let mut expired = occ.envelope(&host, &occ.next_id(), ensure("ns8"));
    expired.issued_at -= 7200;
    expired.expires_at = expired.issued_at + 60;
    let forged = SignedEnvelopeForge::forge(&occ.envelope(&host, &occ.next_id(), ensure("ns7")));
    let mut wrong_host = occ.envelope(&host, &occ.next_id(), ensure("ns6"));
    wrong_host.target.host = clawfleet_protocol::HostName::new("elsewhere").unwrap();
    let before = snapshot();
    let out = occ.session(
        &host,
        &[
            probe.clone(),
            probe,
            replay_other,
            occ.sign(&expired),
            forged,
            occ.sign(&wrong_host),
        ],
    );
    let codes: Vec<_> = results(&out)
        .iter()
        .map(|r| r.outcome.failure().map(|f| f.code))
        .collect();
    assert_eq!(
        codes,
        vec![
            None,
            None,
            Some(FailureCode::ReplayMismatch),
            Some(FailureCode::EnvelopeExpired),
            Some(FailureCode::UnknownSigner),
            Some(FailureCode::WrongHost),
        ]
    );
    assert_eq!(snapshot(), before);
    let ns_dirs = host
        .run_ok("ls /var/lib/clawfleet/namespaces | wc -l")
        .unwrap();
    assert_eq!(ns_dirs.trim(), "1");
}

/// Envelopes signed by a key the host never trusted.
struct SignedEnvelopeForge;

impl SignedEnvelopeForge {
    fn forge(envelope: &clawfleet_protocol::Envelope) -> clawfleet_protocol::SignedEnvelope {
        use clawfleet_protocol::ssh_key::{
            Algorithm, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr,
        };
        let key = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap();
        clawfleet_protocol::SignedEnvelope::sign(envelope, &key).unwrap()
    }
}

/// Issue 27: the failed unit of a deleted Agent stayed in systemd's failed list
/// (`not-found failed`). delete-agent and delete-namespace reset it.
#[test]
fn a_deleted_agents_failed_unit_leaves_the_failed_list_on_a_real_host() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, QUICK_READINESS);
    occ.ok(&host, ensure("ns1"));
    occ.ok(&host, ensure("ns2"));
    // A switch the test gateway cannot read: it exits 78, which the unit does not restart.
    let bad = spec("rev-1", 1, json!({"crashAtStart": "not a boolean"}));
    let failed = || {
        host.run_ok("systemctl list-units --all --failed --plain --no-legend 'clawfleet-agent-*'")
            .unwrap()
    };
    for (n, a) in [("ns1", "a1"), ("ns2", "b1")] {
        occ.ok(&host, prepare(n, a, &bad));
        let f = occ.fails(
            &host,
            Operation::ActivateRevision(ActivateArgs::from(rargs(n, a, &bad))),
        );
        assert_eq!(f.code, FailureCode::UnitFailed, "{f}");
    }
    assert_eq!(failed().lines().count(), 2, "{}", failed());
    occ.ok(
        &host,
        Operation::DeleteAgent(AgentArgs {
            namespace: ns("ns1"),
            agent: agent("a1"),
        }),
    );
    assert_eq!(failed().lines().count(), 1, "{}", failed());
    occ.ok(
        &host,
        Operation::DeleteNamespace(NamespaceArgs {
            namespace: ns("ns2"),
        }),
    );
    assert_eq!(failed().trim(), "", "failed units left: {}", failed());
}
