//! The test gateway runs inside a host as an unprivileged user under a hardened systemd unit,
//! following the launch contract, and answers /readyz on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clawfleet_vm_tests::{TestHost, skip_unless_hosts};

fn unit(name: &str, gateway: &str, port: u16) -> String {
    format!(
        "[Unit]\nDescription=test gateway {name}\n\n[Service]\nUser=cfvm-gw\nGroup=cfvm-gw\n\
         Environment=HOME=/var/lib/cfvm-gw/{name}/home\n\
         Environment=OPENCLAW_STATE_DIR=/var/lib/cfvm-gw/{name}/state\n\
         Environment=OPENCLAW_CONFIG_PATH=/var/lib/cfvm-gw/{name}/current/openclaw.json\n\
         Environment=OPENCLAW_GATEWAY_PORT={port}\n\
         EnvironmentFile=-/var/lib/cfvm-gw/{name}/gateway-password.env\n\
         WorkingDirectory=/var/lib/cfvm-gw/{name}/state\n\
         ExecStart={gateway}\nRestart=always\nRestartSec=200ms\nRestartPreventExitStatus=78\n\
         ProtectSystem=strict\nReadWritePaths=/var/lib/cfvm-gw/{name}\nProtectHome=yes\n\
         PrivateTmp=yes\nPrivateDevices=yes\nNoNewPrivileges=yes\n\
         RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\nSystemCallFilter=@system-service\n\
         CapabilityBoundingSet=\n"
    )
}

/// Lays out an Agent-like directory with a revision snapshot and a `current` symlink.
fn deploy(host: &TestHost, name: &str, config: &str, gateway: &str, port: u16) {
    let dir = format!("/var/lib/cfvm-gw/{name}");
    host.write_file(
        &format!("{dir}/revisions/r1/openclaw.json"),
        config.as_bytes(),
        0o644,
    )
    .unwrap();
    host.write_file(
        &format!("{dir}/gateway-password.env"),
        b"OPENCLAW_GATEWAY_PASSWORD=pw-123\n",
        0o600,
    )
    .unwrap();
    host.write_file(
        &format!("/etc/systemd/system/cfvm-gw-{name}.service"),
        unit(name, gateway, port).as_bytes(),
        0o644,
    )
    .unwrap();
    host.run_ok(&format!(
        "set -e; ln -sfn revisions/r1 {dir}/current; install -d -o cfvm-gw -g cfvm-gw {dir}/state {dir}/home; \
         systemctl daemon-reload; systemctl start cfvm-gw-{name}.service"
    ))
    .unwrap();
}

#[test]
fn test_gateway_runs_as_an_unprivileged_unit_inside_a_host() {
    skip_unless_hosts!();
    let host = TestHost::start().unwrap();
    let gateway = host.install_test_gateway().unwrap();
    host.run_ok(
        "useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin cfvm-gw",
    )
    .unwrap();
    let uid: u32 = host
        .run_ok("id -u cfvm-gw")
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let good = r#"{"gateway":{"mode":"local","bind":"loopback","port":18700,"auth":{"mode":"password"}},
        "x-clawfleet-test":{"readyAfterMs":400,"label":"r1"}}"#;
    deploy(&host, "a1", good, &gateway, 18700);
    let ready = host
        .run_ok(
            "for i in $(seq 200); do c=$(curl -s -o /dev/null -w '%{http_code}' \
             http://127.0.0.1:18700/readyz); [ \"$c\" = 200 ] && echo $c && exit 0; sleep 0.05; done; \
             echo $c; exit 1",
        )
        .unwrap();
    assert_eq!(ready.trim(), "200");
    let info: serde_json::Value = serde_json::from_str(
        &host
            .run_ok("curl -fsS http://127.0.0.1:18700/info")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(info["uid"], uid, "{info}");
    assert_eq!(info["label"], "r1");
    assert_eq!(
        info["configPath"],
        "/var/lib/cfvm-gw/a1/revisions/r1/openclaw.json"
    );
    assert_eq!(info["cwd"], "/var/lib/cfvm-gw/a1/state");
    assert!(info["passwordSha256"].is_string(), "{info}");
    let main_pid = host
        .run_ok("systemctl show -P MainPID cfvm-gw-a1.service")
        .unwrap();
    assert_eq!(info["pid"].to_string(), main_pid.trim());

    // A configuration error exits 78 and is not restarted (RestartPreventExitStatus=78).
    let bad = r#"{"x-clawfleet-test":{"notASwitch":true}}"#;
    deploy(&host, "a2", bad, &gateway, 18701);
    let shown = host
        .run_ok(
            "sleep 1; systemctl show -P ExecMainStatus cfvm-gw-a2.service; \
             systemctl show -P NRestarts cfvm-gw-a2.service; systemctl is-active cfvm-gw-a2.service || true",
        )
        .unwrap();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines, ["78", "0", "failed"], "{shown}");
}
