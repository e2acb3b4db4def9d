//! Secrets on a real host (issue 29): sealed to the host key, kept with systemd-creds, in
//! clear only on tmpfs at the gateway's fixed path, rotated without a restart, kept (and not
//! decrypted again) across a systemd-initiated restart, gone when the Agent stops, and nowhere else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use clawfleet_protocol::FailureCode;
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::sealed::{
    PutSecretsArgs, PutSecretsResult, SealedSecret, SecretFingerprint, SecretName, seal,
};
use clawfleet_protocol::ssh_key::PublicKey;
use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use hosts_support::*;
use serde_json::json;

const GATEWAY_FILE: &str = "/run/clawfleet/secrets/slack-bot";

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

fn sealed(host_key: &PublicKey, version: u64, value: &str) -> SealedSecret {
    seal(
        host_key,
        &id("ns1"),
        &id("a1"),
        &SecretName::new("slack-bot").unwrap(),
        version,
        value.as_bytes(),
    )
    .unwrap()
}

fn put(secrets: Vec<SealedSecret>) -> Operation {
    Operation::PutSecrets(PutSecretsArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
        secrets,
    })
}

fn put_ok(occ: &Coordinator, host: &TestHost, secrets: Vec<SealedSecret>) -> PutSecretsResult {
    match occ.ok(host, put(secrets)) {
        OperationResult::PutSecrets(r) => r,
        other => panic!("{other:?}"),
    }
}

/// The gateway's pid (its launcher's child).
fn main_pid(host: &TestHost, unit: &str) -> u32 {
    unit_gateway_pid(host, unit)
}

/// `uid mode type fstype sha256` of the secret file as the gateway's process sees it (in its
/// mount namespace).
fn seen_by_gateway(host: &TestHost, pid: u32) -> String {
    host.run_ok(&format!(
        "nsenter -t {pid} -m sh -c 'stat -c \"%u %a %F\" {GATEWAY_FILE} && findmnt -n -o FSTYPE --target {GATEWAY_FILE} && sha256sum < {GATEWAY_FILE}'"
    ))
    .unwrap()
    .split_whitespace()
    .filter(|w| *w != "-")
    .collect::<Vec<_>>()
    .join(" ")
}

fn expect_seen(host: &TestHost, pid: u32, uid: &str, value: &str) {
    let fp = SecretFingerprint::of(value.as_bytes());
    let hex = fp.as_str().trim_start_matches("sha256:");
    assert_eq!(
        seen_by_gateway(host, pid),
        format!("{uid} 400 regular file tmpfs {hex}"),
        "the gateway's view of {GATEWAY_FILE}"
    );
}

fn wait_for_new_pid(host: &TestHost, unit: &str, old: u32) -> u32 {
    for _ in 0..100 {
        let pid = main_pid(host, unit);
        let active = host
            .run_ok(&format!("systemctl is-active {unit} || true"))
            .unwrap();
        if pid != 0 && pid != old && active.trim() == "active" {
            return pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!("{unit} did not restart");
}

#[test]
fn secrets_reach_the_gateway_only_on_tmpfs_rotate_without_restart_and_leak_nowhere_on_a_real_host()
{
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    let host_key = PublicKey::from_openssh(host.host_public_key().trim()).unwrap();
    let paths = layout().agent(&id("ns1"), &id("a1"));
    let unit = paths.unit_name.clone();
    let run_dir = format!("/run/{}", unit.trim_end_matches(".service"));
    // Unique values, so any copy anywhere is found.
    let v1 = format!(
        "cf-secret-v1-{}",
        clawfleet_protocol::random::hex(16).unwrap()
    );
    let v2 = format!(
        "cf-secret-v2-{}",
        clawfleet_protocol::random::hex(16).unwrap()
    );
    host.write_file("/root/needles", format!("{v1}\n{v2}\n").as_bytes(), 0o600)
        .unwrap();

    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "a1"}));
    occ.ok(&host, prepare("ns1", "a1", &r1));

    // Before the gateway runs: kept at rest only, written at its first start.
    let put1 = put_ok(&occ, &host, vec![sealed(&host_key, 1, &v1)]);
    assert!(
        put1.changed && !put1.delivered_to_running_gateway,
        "{put1:?}"
    );
    assert_eq!(put1.secrets[0].version, 1);
    assert_eq!(
        put1.secrets[0].fingerprint,
        SecretFingerprint::of(v1.as_bytes())
    );
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    let uid = host.run_ok(&format!("id -u {}", paths.account)).unwrap();
    let uid = uid.trim();
    let pid = main_pid(&host, &unit);
    expect_seen(&host, pid, uid, &v1);
    // The same set again changes nothing on disk, and is answered as such.
    let again = put_ok(&occ, &host, vec![sealed(&host_key, 1, &v1)]);
    assert!(
        !again.changed && again.delivered_to_running_gateway,
        "{again:?}"
    );

    // Rotation: the new value reaches the running gateway's file; the same process.
    let put2 = put_ok(&occ, &host, vec![sealed(&host_key, 2, &v2)]);
    assert!(
        put2.changed && put2.delivered_to_running_gateway,
        "{put2:?}"
    );
    assert_eq!(
        main_pid(&host, &unit),
        pid,
        "the rotation restarted the gateway"
    );
    expect_seen(&host, pid, uid, &v2);

    // A systemd-initiated restart (the gateway crashed): the directory is kept
    // (`RuntimeDirectoryPreserve=restart`) and the file, still the manifest's value, is taken
    // as it is instead of being decrypted again, then written before the gateway starts.
    host.run_ok(&format!("kill -9 {pid}")).unwrap();
    let pid2 = wait_for_new_pid(&host, &unit, pid);
    expect_seen(&host, pid2, uid, &v2);
    let written = host
        .run_ok("journalctl --no-pager -o json -t hostd --grep 'secret files written' | tail -1")
        .unwrap();
    assert!(
        written.contains("\"F_KEPT\":\"1\"") && written.contains("\"F_SECRETS\":\"1\""),
        "the restart took the secret from its file: {written}"
    );

    // A value sealed to another key (or for another Agent) does not open: refused with its
    // code, nothing changed.
    let other = clawfleet_protocol::ssh_key::PrivateKey::random(
        &mut clawfleet_protocol::ssh_key::rand_core::UnwrapErr(
            clawfleet_protocol::ssh_key::getrandom::SysRng,
        ),
        clawfleet_protocol::ssh_key::Algorithm::Ed25519,
    )
    .unwrap();
    let f = occ.fails(
        &host,
        put(vec![sealed(other.public_key(), 3, "cf-never-delivered")]),
    );
    assert_eq!(f.code, FailureCode::SecretUndecryptable, "{f}");
    assert!(f.message.contains("slack-bot"), "{f}");
    let foreign = seal(
        &host_key,
        &id("ns1"),
        &id("a2"),
        &SecretName::new("slack-bot").unwrap(),
        3,
        b"cf-never-delivered",
    )
    .unwrap();
    let f = occ.fails(&host, put(vec![foreign]));
    assert_eq!(f.code, FailureCode::SecretUndecryptable, "{f}");
    expect_seen(&host, pid2, uid, &v2);

    // The unit's sandbox still rates at most 1.5.
    let out = host
        .run(&format!("systemd-analyze security --no-pager {unit}"))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let score: f64 = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure in {text}"));
    println!("systemd-analyze security: exposure {score}");
    assert!(score <= 1.5, "exposure {score} above 1.5\n{text}");

    // The leak check: neither value anywhere under the state root, in unit files, hostd's
    // configuration, the host's journal, or any process's environment; at rest only
    // systemd-creds credentials.
    let leaks = host
        .run_ok(
            "{ grep -r -l -a -F -f /root/needles /var/lib/clawfleet /etc/systemd/system /etc/clawfleet; \
             journalctl --no-pager -o export | grep -a -c -F -f /root/needles; \
             grep -l -a -F -f /root/needles /proc/[0-9]*/environ 2>/dev/null; } | tr '\\n' ' '",
        )
        .unwrap();
    assert_eq!(
        leaks.trim(),
        "0",
        "a secret value leaked (files, journal count, environ): {leaks}"
    );
    let at_rest = host
        .run_ok(&format!(
            "ls {0}/secrets; head -c 64 {0}/secrets/slack-bot.cred | base64 -d 2>/dev/null | head -c 0; stat -c '%a %U' {0}/secrets {0}/secrets/slack-bot.cred",
            paths.dir.display()
        ))
        .unwrap();
    assert!(
        at_rest.contains("manifest.json") && at_rest.contains("slack-bot.cred"),
        "{at_rest}"
    );
    assert!(
        at_rest.contains("700 root") && at_rest.contains("600 root"),
        "{at_rest}"
    );
    // systemd-creds opens the credential it keeps (so it is one of its credentials).
    let opened = host
        .run_ok(&format!(
            "systemd-creds decrypt --name=slack-bot {}/secrets/slack-bot.cred - | sha256sum",
            paths.dir.display()
        ))
        .unwrap();
    assert!(
        opened.starts_with(
            SecretFingerprint::of(v2.as_bytes())
                .as_str()
                .trim_start_matches("sha256:")
        ),
        "{opened}"
    );
    let environ = host
        .run_ok(&format!("tr '\\0' '\\n' < /proc/{pid2}/environ"))
        .unwrap();
    assert!(!environ.contains("cf-secret-"), "{environ}");

    // Stopped: the clear files are gone with the runtime directory.
    occ.ok(&host, Operation::StopRevision(rargs("ns1", "a1", &r1)));
    let gone = host
        .run_ok(&format!("test -e {run_dir} && echo present || echo gone"))
        .unwrap();
    assert_eq!(gone.trim(), "gone", "{run_dir} outlived the stop");
}

/// A revision whose configuration refers to the `slack-bot` secret through the provider the
/// coordinator renders for it.
fn spec_with_secret(rev: &str, number: u64) -> RevisionSpec {
    let mut value = configuration(None, json!({"label": "a1"})).value().clone();
    value["secrets"] = json!({"providers": {"clawfleet-slack-bot": {
        "source": "file", "path": GATEWAY_FILE, "mode": "singleValue"}}});
    value["channels"] = json!({"slack": {"botToken": {
        "source": "file", "provider": "clawfleet-slack-bot", "id": "value"}}});
    let configuration = clawfleet_protocol::Configuration::new(value).unwrap();
    let mut s = spec(rev, number, json!({}));
    s.id = id(rev);
    s.configuration_hash = configuration.hash();
    s.configuration = configuration;
    s
}

fn activate(r: &RevisionSpec) -> Operation {
    Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", r)))
}

/// The fingerprint of the file bytes the test gateway holds for `slack-bot`, and whether its
/// last reload succeeded.
fn held(host: &TestHost, port: u16) -> (String, Option<bool>) {
    let (code, body) = curl(host, port, "/secrets");
    assert_eq!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    (
        doc["providers"]["clawfleet-slack-bot"]["fingerprint"]
            .as_str()
            .unwrap_or_else(|| panic!("no fingerprint in {body}"))
            .to_owned(),
        doc["lastReload"]["ok"].as_bool(),
    )
}

#[test]
fn a_secrets_only_revision_reloads_the_running_gateway_without_a_restart_on_a_real_host() {
    skip_unless_hosts!();
    use clawfleet_protocol::result::SecretsReload;
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    let host_key = PublicKey::from_openssh(host.host_public_key().trim()).unwrap();
    let paths = layout().agent(&id("ns1"), &id("a1"));
    let unit = paths.unit_name.clone();
    let fp = |v: &str| SecretFingerprint::of(v.as_bytes()).as_str().to_owned();
    let current = || {
        host.run_ok(&format!("readlink {}", paths.current.display()))
            .unwrap()
            .trim()
            .to_owned()
    };

    occ.ok(&host, ensure("ns1"));
    let r1 = spec_with_secret("rev-1", 1);
    occ.ok(&host, prepare("ns1", "a1", &r1));
    put_ok(&occ, &host, vec![sealed(&host_key, 1, "cf-rotate-v1")]);
    let OperationResult::ActivateRevision(a1) = occ.ok(&host, activate(&r1)) else {
        panic!("not an activate result");
    };
    assert!(a1.restarted && a1.secrets_reload.is_none(), "{a1:?}");
    let port = a1.observation.port.unwrap();
    let pid = main_pid(&host, &unit);
    assert_eq!(held(&host, port).0, fp("cf-rotate-v1"));

    // Rotation: v2 delivered, then a revision with the same configuration activated: the
    // same process reloads and holds v2.
    let r2 = spec_with_secret("rev-2", 2);
    assert_eq!(r1.configuration_hash, r2.configuration_hash);
    put_ok(&occ, &host, vec![sealed(&host_key, 2, "cf-rotate-v2")]);
    occ.ok(&host, prepare("ns1", "a1", &r2));
    let OperationResult::ActivateRevision(a2) = occ.ok(&host, activate(&r2)) else {
        panic!("not an activate result");
    };
    assert!(!a2.restarted, "{a2:?}");
    assert_eq!(a2.secrets_reload, Some(SecretsReload::Verified), "{a2:?}");
    assert_eq!(a2.observation.current, Some(id("rev-2")));
    assert_eq!(a2.observation.served, Some(id("rev-2")));
    assert_eq!(
        main_pid(&host, &unit),
        pid,
        "the rotation restarted the gateway"
    );
    assert_eq!(held(&host, port), (fp("cf-rotate-v2"), Some(true)));
    // Activating it again is the no-op it always was.
    let OperationResult::ActivateRevision(again) = occ.ok(&host, activate(&r2)) else {
        panic!("not an activate result");
    };
    assert!(!again.restarted, "{again:?}");

    // A value the gateway resolves to nothing (only a byte order mark, which it strips):
    // the reload is refused, typed; the same process keeps v2 and rev-2 stays current.
    let r3 = spec_with_secret("rev-3", 3);
    put_ok(&occ, &host, vec![sealed(&host_key, 3, "\u{feff}")]);
    occ.ok(&host, prepare("ns1", "a1", &r3));
    let f = occ.fails(&host, activate(&r3));
    assert_eq!(f.code, FailureCode::SecretReloadFailed, "{f}");
    assert_eq!(
        main_pid(&host, &unit),
        pid,
        "the failed reload restarted the gateway"
    );
    assert_eq!(held(&host, port), (fp("cf-rotate-v2"), Some(false)));
    assert_eq!(
        current(),
        hostd::layout::AgentPaths::current_target(&id("rev-2"))
            .display()
            .to_string(),
        "current must name the served revision again"
    );
    let (code, _) = curl(&host, port, "/readyz");
    assert_eq!(code, 200, "the gateway stopped serving");

    // The refused value is not left behind: the set the gateway serves is back at rest and in
    // its files, so a restart (a crash, a reboot) starts on v2, not on the refused value.
    let manifest = host
        .run_ok(&format!(
            "cat {}/secrets/manifest.json",
            paths.dir.display()
        ))
        .unwrap();
    assert!(
        manifest.contains(&fp("cf-rotate-v2")) && !manifest.contains(&fp("\u{feff}")),
        "{manifest}"
    );
    host.run_ok(&format!("systemctl restart {unit}")).unwrap();
    let restarted = wait_for_new_pid(&host, &unit, pid);
    assert_ne!(restarted, pid);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while curl(&host, port, "/readyz").0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted gateway does not serve: {}",
            host.run_ok(&format!("journalctl -u {unit} -n 20 --no-pager || true"))
                .unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(held(&host, port).0, fp("cf-rotate-v2"));
}
