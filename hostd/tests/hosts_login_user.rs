//! `hostd enrol --login-user` on a real host (issue 11, hosts that forbid root login): the
//! coordinator's key logs in as a dedicated system user with stock `ssh`, its forced command
//! runs `hostd serve` through sudo and a session works; that user can run nothing else
//! through sudo (not even another hostd command), gets no shell, no other command and no
//! forward over ssh; root login stays as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use std::process::{Command, Stdio};

use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::OperationResult;
use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use hosts_support::*;
use serde_json::{Value, json};

const USER: &str = "clawfleet";

/// Runs `hostd enrol --login-user` on the host; returns its JSON.
fn enrol(host: &TestHost) -> Value {
    let out = host
        .run_ok(&format!(
            "hostd enrol --ssh-key /tmp/occ-login.pub --signing-key /tmp/occ-signing.pub \
             --principal {PRINCIPAL} --login-user {USER}"
        ))
        .unwrap();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Stock `ssh` as the login user with the coordinator's key and its pinned host key, with
/// extra `options` and a `command` of our choosing (which the forced command ignores).
fn ssh(
    occ: &Coordinator,
    host: &TestHost,
    options: &[&str],
    command: &[&str],
) -> std::process::Output {
    // `Coordinator::ssh` ends with the destination and "hostd serve": keep its options.
    let argv: Vec<std::ffi::OsString> = occ.ssh(host).get_args().map(Into::into).collect();
    let (opts, dest) = (&argv[..argv.len() - 2], &argv[argv.len() - 2]);
    Command::new("ssh")
        .args(opts)
        .args(options)
        .arg(dest)
        .args(command)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_login_user_runs_hostd_serve_through_sudo_and_nothing_else_on_a_real_host() {
    skip_unless_hosts!();
    let mut occ = Coordinator::new();
    let host = TestHost::start().unwrap();
    install::install_hostd_package_or_binary(
        &host,
        std::path::Path::new(env!("CARGO_BIN_EXE_hostd")),
    )
    .unwrap();
    let gateway = host.install_test_gateway().unwrap();
    host.write_file(
        "/etc/clawfleet/hostd.toml",
        format!(
            "host_name = \"{}\"\ngateway_command = [\"{gateway}\"]\n",
            host.name()
        )
        .as_bytes(),
        0o644,
    )
    .unwrap();
    for (name, key) in [
        ("/tmp/occ-login.pub", occ.login_public()),
        ("/tmp/occ-signing.pub", occ.signing_public()),
    ] {
        host.write_file(name, key.as_bytes(), 0o644).unwrap();
    }
    let root_keys_before = host
        .run_ok("sha256sum /root/.ssh/authorized_keys 2>/dev/null || echo none")
        .unwrap();

    let first = enrol(&host);
    println!("first enrol: {first}");
    assert_eq!(first["loginUser"]["user"], "created");
    assert_eq!(first["loginUser"]["sudoers"], "created");
    assert_eq!(
        first["loginUser"]["forcedCommand"],
        hostd::login_user::LoginUserRequest::new(USER).forced_command()
    );
    assert_eq!(first["hostKeyFingerprint"], host.host_key_fingerprint());
    let second = enrol(&host);
    assert_eq!(second["loginUser"]["user"], "unchanged");
    assert_eq!(second["loginUser"]["sudoers"], "unchanged");
    assert_eq!(second["authorizedKeys"], "unchanged");
    assert_eq!(second["allowedSigners"], "unchanged");

    // What was installed: the drop-in (visudo accepts it; 0440 root), the user's files
    // (root's, not writable by the user), and root's authorized_keys untouched.
    let dropin = format!("/etc/sudoers.d/clawfleet-hostd-{USER}");
    println!(
        "{}",
        host.run_ok(&format!(
            "visudo -cf {dropin}; stat -c '%a %U:%G %n' {dropin} /var/lib/clawfleet-login/{USER} /var/lib/clawfleet-login/{USER}/.ssh /var/lib/clawfleet-login/{USER}/.ssh/authorized_keys; \
             getent passwd {USER}; cat /var/lib/clawfleet-login/{USER}/.ssh/authorized_keys"
        ))
        .unwrap()
    );
    assert_eq!(
        host.run_ok(&format!("stat -c '%a %U' {dropin}"))
            .unwrap()
            .trim(),
        "440 root"
    );
    assert_eq!(
        host.run_ok(&format!(
            "stat -c '%a %U' /var/lib/clawfleet-login/{USER}/.ssh/authorized_keys"
        ))
        .unwrap()
        .trim(),
        "644 root"
    );
    assert_eq!(
        host.run_ok("sha256sum /root/.ssh/authorized_keys 2>/dev/null || echo none")
            .unwrap(),
        root_keys_before,
        "root's authorized_keys changed"
    );

    // A session as the login user: hostd serve runs as root through sudo.
    occ.user = USER.to_owned();
    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "via-sudo"}));
    match occ.ok(&host, prepare("ns1", "a1", &r1)) {
        OperationResult::PrepareRevision(p) => assert!(p.ready),
        other => panic!("{other:?}"),
    }
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    let journal = host
        .run_ok("journalctl --no-pager -o cat _COMM=sudo | grep COMMAND= | tail -1")
        .unwrap();
    println!("sudo's log: {journal}");
    assert!(
        journal.contains("COMMAND=/usr/sbin/hostd serve"),
        "{journal}"
    );

    // Nothing else through sudo, as that user.
    for cmd in [
        "sudo -n /usr/bin/id -u",
        "sudo -n /usr/sbin/hostd status",
        "sudo -n /usr/sbin/hostd apply /etc/passwd",
        "sudo -n /bin/sh -c id",
        "sudo -n -u nobody /usr/sbin/hostd serve",
        "sudo -n /usr/sbin/hostd relay --config /tmp/occ-login.pub",
    ] {
        let out = host
            .run(&format!("su -s /bin/sh {USER} -c '{cmd}' </dev/null"))
            .unwrap();
        println!(
            "as {USER}: {cmd} -> {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        assert!(!out.status.success(), "{USER} ran {cmd} through sudo");
        assert!(!String::from_utf8_lossy(&out.stdout).contains('0'), "{cmd}");
    }
    let listed = host
        .run_ok(&format!("su -s /bin/sh {USER} -c 'sudo -n -l' </dev/null"))
        .unwrap();
    println!("sudo -l as {USER}: {listed}");
    let allowed: Vec<&str> = listed
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('('))
        .collect();
    assert_eq!(
        allowed,
        ["(root) NOPASSWD: /usr/sbin/hostd serve, /usr/sbin/hostd relay"]
    );

    // The relay channel, asked for as the coordinator asks (`hostd relay`): hostd relay's
    // greeting, through sudo, as root.
    let relay = ssh(&occ, &host, &[], &["hostd", "relay"]);
    let stdout = String::from_utf8_lossy(&relay.stdout);
    println!("ssh {USER}@host 'hostd relay' -> {stdout:?}");
    assert!(
        stdout.contains("idleTimeoutSeconds") && !stdout.contains("hostdVersion"),
        "not hostd relay's greeting: {stdout} {}",
        String::from_utf8_lossy(&relay.stderr)
    );

    // Over ssh with the key: another command still gets hostd's hello (the forced command),
    // never a shell; a forward is refused.
    let other = ssh(&occ, &host, &[], &["sudo -n /usr/bin/id -u; id -u"]);
    let stdout = String::from_utf8_lossy(&other.stdout);
    println!("ssh {USER}@host 'sudo -n id -u; id -u' -> {stdout:?}");
    assert!(
        stdout.contains("hostdVersion"),
        "not hostd's hello: {stdout}"
    );
    assert!(!stdout.lines().any(|l| l.trim() == "0"), "{stdout}");
    let forward = ssh(&occ, &host, &["-W", "127.0.0.1:22"], &[]);
    let stderr = String::from_utf8_lossy(&forward.stderr);
    println!("forward as {USER}: {} {}", forward.status, stderr.trim());
    assert!(
        !forward.status.success(),
        "a forward through the login user"
    );
    assert!(
        !String::from_utf8_lossy(&forward.stdout).starts_with("SSH-"),
        "reached sshd through a forward: {stderr}"
    );

    // A host enrolled before the relay channel (the drop-in and the forced command allowed
    // `serve` alone): enrolling again replaces both, and the relay channel opens.
    let earlier = hostd::login_user::LoginUserRequest::new(USER);
    host.write_file(
        &dropin,
        format!(
            "# Written by `hostd enrol --login-user {USER}`: {USER} may run exactly\n\
             # `/usr/sbin/hostd serve` as root (the forced command of the coordinator's key), nothing else.\n\
             {USER} ALL=(root) NOPASSWD: /usr/sbin/hostd serve\n"
        )
        .as_bytes(),
        0o440,
    )
    .unwrap();
    let keys_file = format!("/var/lib/clawfleet-login/{USER}/.ssh/authorized_keys");
    host.write_file(
        &keys_file,
        format!(
            "restrict,command=\"{}\" {}\n",
            earlier.earlier_forced_command(),
            occ.login_public().trim()
        )
        .as_bytes(),
        0o644,
    )
    .unwrap();
    let before_relay = ssh(&occ, &host, &[], &["hostd", "relay"]);
    assert!(
        String::from_utf8_lossy(&before_relay.stdout).contains("hostdVersion"),
        "an earlier enrol's forced command runs serve whatever is asked"
    );
    let again = enrol(&host);
    println!("enrol over an earlier one: {again}");
    assert_eq!(again["loginUser"]["sudoers"], "updated", "{again}");
    assert_eq!(again["authorizedKeys"], "updated", "{again}");
    let keys = host.run_ok(&format!("cat {keys_file}")).unwrap();
    assert_eq!(keys.lines().count(), 1, "{keys}");
    let relay = ssh(&occ, &host, &[], &["hostd", "relay"]);
    assert!(
        String::from_utf8_lossy(&relay.stdout).contains("idleTimeoutSeconds"),
        "{}",
        String::from_utf8_lossy(&relay.stderr)
    );

    // Root login stays the default: the harness's root key still logs in.
    assert_eq!(host.run_ok("id -u").unwrap().trim(), "0");
}
