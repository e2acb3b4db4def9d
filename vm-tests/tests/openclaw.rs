//! The real OpenClaw gateway (openclaw@2026.9.6 on Node 24) inside a test host, as an
//! unprivileged hardened system unit following the launch contract, with the configuration form
//! the coordinator renders. Opt-in: set CLAWFLEET_VM_OPENCLAW=1 (first run fetches ~850 MB).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use clawfleet_vm_tests::{HarnessConfig, HostOptions, TestHost, openclaw, skip_unless_hosts};

const PORT: u16 = 18720;
const DIR: &str = "/var/lib/cfvm-oc";

#[test]
fn real_openclaw_gateway_becomes_ready_in_a_host() {
    skip_unless_hosts!();
    if std::env::var("CLAWFLEET_VM_OPENCLAW").as_deref() != Ok("1") {
        eprintln!("SKIP: set CLAWFLEET_VM_OPENCLAW=1 to run the real OpenClaw gateway");
        return;
    }
    if let Some(reason) = openclaw::skip_reason() {
        panic!("CLAWFLEET_VM_OPENCLAW=1 but {reason}");
    }
    let t0 = Instant::now();
    let config = HarnessConfig::from_env().unwrap();
    let options = HostOptions {
        openclaw: true,
        ..HostOptions::default()
    };
    let host = TestHost::start_with_options(&config, &options).unwrap();
    let paths = host.install_openclaw().unwrap();
    eprintln!(
        "host with the OpenClaw bundle bound in up in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        host.run_ok(&format!("{} --version", paths.node))
            .unwrap()
            .starts_with("v24.")
    );
    host.run_ok(
        "useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin cfvm-oc",
    )
    .unwrap();
    // The rendered form: mode local, loopback, port, env-only password auth.
    let config = format!(
        r#"{{"gateway":{{"mode":"local","bind":"loopback","port":{PORT},"auth":{{"mode":"password"}}}},
  "update":{{"checkOnStart":false}},"models":{{"catalogRefresh":{{"enabled":false}}}},
  "logging":{{"file":"{DIR}/state/logs/gateway.log"}}}}"#
    );
    host.write_file(
        &format!("{DIR}/revisions/r1/openclaw.json"),
        config.as_bytes(),
        0o644,
    )
    .unwrap();
    host.write_file(
        &format!("{DIR}/gateway-password.env"),
        b"OPENCLAW_GATEWAY_PASSWORD=oc-test-pass\n",
        0o600,
    )
    .unwrap();
    let unit = format!(
        "[Service]\nUser=cfvm-oc\nGroup=cfvm-oc\nEnvironment=HOME={DIR}/home\n\
         Environment=OPENCLAW_STATE_DIR={DIR}/state\n\
         Environment=OPENCLAW_CONFIG_PATH={DIR}/current/openclaw.json\n\
         Environment=OPENCLAW_GATEWAY_PORT={PORT}\nEnvironmentFile={DIR}/gateway-password.env\n\
         WorkingDirectory={DIR}/state\nExecStart={}\nRestart=always\nRestartPreventExitStatus=78\n\
         SuccessExitStatus=0 143\nKillMode=mixed\nTimeoutStopSec=60\n\
         ProtectSystem=strict\nReadWritePaths={DIR}\nProtectHome=yes\nPrivateTmp=yes\n\
         PrivateDevices=yes\nNoNewPrivileges=yes\n\
         RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\nSystemCallFilter=@system-service\n\
         CapabilityBoundingSet=\n",
        paths.exec_start()
    );
    host.write_file(
        "/etc/systemd/system/cfvm-oc.service",
        unit.as_bytes(),
        0o644,
    )
    .unwrap();
    host.run_ok(&format!(
        "set -e; ln -sfn revisions/r1 {DIR}/current; install -d -o cfvm-oc -g cfvm-oc {DIR}/state {DIR}/home; \
         systemctl daemon-reload; systemctl start cfvm-oc.service"
    ))
    .unwrap();
    let t1 = Instant::now();
    let out = host
        .run(&format!(
            "for i in $(seq 1800); do c=$(curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{PORT}/readyz); \
             [ \"$c\" = 200 ] && exit 0; [ \"$(systemctl show -P NRestarts cfvm-oc.service)\" = 0 ] || exit 2; \
             sleep 0.1; done; exit 1"
        ))
        .unwrap();
    let elapsed = t1.elapsed();
    if !out.status.success() {
        let status = host
            .run("systemctl status --no-pager cfvm-oc.service; journalctl -u cfvm-oc.service --no-pager | tail -40")
            .unwrap();
        panic!(
            "OpenClaw never became ready:\n{}",
            String::from_utf8_lossy(&status.stdout)
        );
    }
    eprintln!("OpenClaw /readyz 200 after {:.1}s", elapsed.as_secs_f64());
    let user = host
        .run_ok("ps -o user= -p $(systemctl show -P MainPID cfvm-oc.service)")
        .unwrap();
    assert_eq!(user.trim(), "cfvm-oc");
    let t2 = Instant::now();
    host.run_ok("systemctl stop cfvm-oc.service").unwrap();
    let result = host
        .run_ok("systemctl show -P Result cfvm-oc.service")
        .unwrap();
    assert_eq!(result.trim(), "success");
    eprintln!("OpenClaw stopped in {:.1}s", t2.elapsed().as_secs_f64());
}
