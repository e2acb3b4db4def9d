//! Three hosts in parallel: systemd running, D-Bus answering, own identity each, isolated from
//! each other; a reboot of one brings it back with the same host key and machine-id.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use clawfleet_vm_tests::{TestHosts, skip_unless_hosts};

const VERSION_CALL: &str = "busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
     org.freedesktop.DBus.Properties Get ss org.freedesktop.systemd1.Manager Version";

#[test]
fn three_hosts_boot_answer_dbus_and_survive_a_reboot() {
    skip_unless_hosts!();
    let t0 = Instant::now();
    let hosts = TestHosts::start(3).unwrap();
    eprintln!(
        "3 hosts up in {:.2}s (boot times {:?})",
        t0.elapsed().as_secs_f64(),
        hosts
            .iter()
            .map(|h| format!("{:.2}s", h.boot_duration().as_secs_f64()))
            .collect::<Vec<_>>()
    );
    std::thread::scope(|s| {
        for h in hosts.iter() {
            s.spawn(move || {
                let state = h.run_ok("systemctl is-system-running").unwrap();
                assert_eq!(state.trim(), "running", "{}", h.name());
                let version = h.run_ok(VERSION_CALL).unwrap();
                assert!(version.starts_with("v s \"252"), "{}: {version}", h.name());
                assert_eq!(h.run_ok("hostname").unwrap().trim(), h.name());
                assert_eq!(
                    h.run_ok("cat /etc/machine-id").unwrap().trim(),
                    h.machine_id()
                );
                assert_eq!(h.run_ok("cat /proc/1/comm").unwrap().trim(), "systemd");
                assert!(h.host_key_fingerprint().starts_with("SHA256:"));
                // The fingerprint the host serves is the one the harness exposes.
                let served = h
                    .run_ok("ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub")
                    .unwrap();
                assert!(served.contains(h.host_key_fingerprint()), "{served}");
            });
        }
    });
    let ids: std::collections::BTreeSet<_> = hosts.iter().map(|h| h.machine_id()).collect();
    assert_eq!(ids.len(), 3, "machine-ids must differ");
    let fps: std::collections::BTreeSet<_> =
        hosts.iter().map(|h| h.host_key_fingerprint()).collect();
    assert_eq!(fps.len(), 3, "host keys must differ");
    // Hosts reach only their own runner-side address, not each other.
    let other = hosts[1].address();
    let probe = hosts[0]
        .run(&format!("timeout 3 bash -c '</dev/tcp/{other}/22'"))
        .unwrap();
    assert!(!probe.status.success(), "h1 must not reach h2");

    let h = &hosts[2];
    h.run_ok("echo kept > /var/lib/reboot-marker").unwrap();
    let boot_before = h.run_ok("cat /proc/sys/kernel/random/boot_id").unwrap();
    let pid_before = h.record().nspawn_pid;
    let t1 = Instant::now();
    let boot = h.reboot().unwrap();
    eprintln!(
        "reboot of {} took {:.2}s (boot {:.2}s)",
        h.name(),
        t1.elapsed().as_secs_f64(),
        boot.as_secs_f64()
    );
    // ssh pins the old key (StrictHostKeyChecking=yes), so any answer proves the same host key.
    assert_eq!(
        h.run_ok("systemctl is-system-running").unwrap().trim(),
        "running"
    );
    assert_ne!(
        h.run_ok("cat /proc/sys/kernel/random/boot_id").unwrap(),
        boot_before
    );
    assert_ne!(h.record().nspawn_pid, pid_before);
    assert_eq!(
        h.run_ok("cat /etc/machine-id").unwrap().trim(),
        h.machine_id()
    );
    assert_eq!(
        h.run_ok("cat /var/lib/reboot-marker").unwrap().trim(),
        "kept"
    );
    assert!(h.run_ok(VERSION_CALL).is_ok());
    let t2 = Instant::now();
    hosts.shutdown().unwrap();
    eprintln!("3 hosts torn down in {:.2}s", t2.elapsed().as_secs_f64());
}
