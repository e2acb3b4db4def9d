//! The packages' maintainer scripts on a real test host, with their output checked: `dpkg -i`,
//! the same package again, an upgrade to the test build with the higher version, the
//! downgrade back, `dpkg -r` and `dpkg -P`. No step may print "not found" or an error or
//! warning line (a shell error in a script is printed and, without `set -e` reaching it,
//! ignored), and the generated parts of the coordinator's scripts (systemd-sysusers, the
//! unit's enable and start) run exactly once per configure, traced with `sh -x`.
//!
//! Needs root (test hosts) and `packaging/build.sh` output; otherwise prints `SKIP: ...`
//! (fails under `CI=true`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod packages_support;

use std::path::Path;

use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use packages_support::*;

/// Lines of dpkg/maintainer-script output that mean something went wrong. dpkg's own notice
/// on a downgrade is expected there and allowed.
fn bad_lines(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|l| {
            let lower = l.to_lowercase();
            (lower.contains("not found")
                || lower.contains("error")
                || lower.contains("warning")
                || lower.contains("syntax")
                || lower.contains("cannot")
                || lower.contains("failed"))
                && !lower.starts_with("dpkg: warning: downgrading ")
        })
        .collect()
}

/// Runs a dpkg command on the host (stderr folded into stdout); it must succeed and print no
/// bad line. Returns the output.
fn dpkg_clean(host: &TestHost, what: &str, command: &str) -> String {
    let out = host
        .run(&format!("DEBIAN_FRONTEND=noninteractive {command} 2>&1"))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("--- {what}: {command}\n{text}");
    assert!(out.status.success(), "{what} failed:\n{text}");
    let bad = bad_lines(&text);
    assert!(
        bad.is_empty(),
        "{what} printed {bad:#?}\nwhole output:\n{text}"
    );
    text
}

fn copy_deb(host: &TestHost, deb: &Path, remote: &str) {
    host.install_file(deb, remote, 0o644).unwrap();
}

/// Occurrences of `needle` on the lines of `text` that are not comments.
fn count_commands(text: &str, needle: &str) -> usize {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains(needle))
        .count()
}

/// Runs the installed postinst again as dpkg does on an upgrade (`configure <old version>`,
/// with the variables dpkg sets: deb-systemd-helper does nothing without them), traced with
/// `sh -x`; returns the trace.
fn traced_postinst(host: &TestHost, package: &str, old_version: &str) -> String {
    let out = host
        .run(&format!(
            "DPKG_MAINTSCRIPT_PACKAGE={package} DPKG_MAINTSCRIPT_NAME=postinst \
             sh -x /var/lib/dpkg/info/{package}.postinst configure {old_version} 2>&1"
        ))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "postinst configure failed:\n{text}");
    let bad = bad_lines(&text);
    assert!(bad.is_empty(), "postinst printed {bad:#?}\n{text}");
    text
}

/// Executed commands (the `+ ` lines of an `sh -x` trace) that start with `command`.
fn ran(trace: &str, command: &str) -> usize {
    trace
        .lines()
        .filter(|l| {
            l.trim_start_matches('+').trim_start().starts_with(command) && l.starts_with('+')
        })
        .count()
}

#[test]
fn coordinator_maintainer_scripts_print_nothing_wrong_and_run_each_generated_step_once() {
    skip_unless_hosts!();
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let Some(next) = pkgs.coordinator_deb_next.clone() else {
        missing("no coordinator .deb in target/packages/test (packaging/build.sh makes it)");
        return;
    };
    let host = TestHost::start().unwrap();
    let cur = "/var/tmp/coordinator.deb";
    let new = "/var/tmp/coordinator-next.deb";
    copy_deb(&host, &pkgs.coordinator_deb, cur);
    copy_deb(&host, &next, new);
    let version = deb_field(&pkgs.coordinator_deb, "Version");
    let p = "clawfleet-coordinator";

    let install = dpkg_clean(&host, "install", &format!("dpkg -i {cur}"));
    assert!(
        install.contains(&format!("Setting up {p} ({version})")),
        "{install}"
    );

    // The installed scripts hold each generated part once (a marker replaced twice, once in a
    // comment, ran them twice and left a stray line the shell could not run).
    let postinst = host
        .run_ok(&format!("cat /var/lib/dpkg/info/{p}.postinst"))
        .unwrap();
    assert!(!postinst.contains("#DEBHELPER#"), "{postinst}");
    for (needle, want) in [
        ("systemd-sysusers", 1),
        ("deb-systemd-helper enable", 1),
        ("deb-systemd-invoke $_dh_action", 1),
    ] {
        assert_eq!(
            count_commands(&postinst, needle),
            want,
            "{needle} in postinst:\n{postinst}"
        );
    }
    for script in ["prerm", "postrm"] {
        let text = host
            .run_ok(&format!("cat /var/lib/dpkg/info/{p}.{script}"))
            .unwrap();
        assert!(!text.contains("#DEBHELPER#"), "{script}:\n{text}");
        host.run_ok(&format!("sh -n /var/lib/dpkg/info/{p}.{script}"))
            .unwrap();
    }
    let prerm = host
        .run_ok(&format!("cat /var/lib/dpkg/info/{p}.prerm"))
        .unwrap();
    assert_eq!(
        count_commands(&prerm, "deb-systemd-invoke stop"),
        1,
        "{prerm}"
    );
    let postrm = host
        .run_ok(&format!("cat /var/lib/dpkg/info/{p}.postrm"))
        .unwrap();
    assert_eq!(
        count_commands(&postrm, "deb-systemd-helper mask"),
        1,
        "{postrm}"
    );
    assert_eq!(
        count_commands(&postrm, "deb-systemd-helper purge"),
        1,
        "{postrm}"
    );

    // What runs: one sysusers call, one enable, one restart per configure.
    let trace = traced_postinst(&host, p, &version);
    for (command, want) in [
        ("systemd-sysusers", 1),
        ("deb-systemd-helper enable", 1),
        ("deb-systemd-invoke restart", 1),
        ("deb-systemd-invoke start", 0),
    ] {
        assert_eq!(
            ran(&trace, command),
            want,
            "{command} in the trace:\n{trace}"
        );
    }
    assert_eq!(
        host.run_ok("getent passwd clawfleet | wc -l")
            .unwrap()
            .trim(),
        "1"
    );

    dpkg_clean(&host, "reinstall (same version)", &format!("dpkg -i {cur}"));
    dpkg_clean(&host, "upgrade", &format!("dpkg -i {new}"));
    assert_eq!(
        host.run_ok(&format!("dpkg-query -W -f='${{Version}}' {p}"))
            .unwrap(),
        deb_field(&next, "Version")
    );
    dpkg_clean(&host, "downgrade", &format!("dpkg -i {cur}"));
    assert_eq!(
        host.run_ok("systemctl is-enabled clawfleet-coordinator.service || true")
            .unwrap()
            .trim(),
        "enabled"
    );
    dpkg_clean(&host, "remove", &format!("dpkg -r {p}"));
    dpkg_clean(&host, "purge", &format!("dpkg -P {p}"));
    assert!(
        !host
            .run_ok(&format!("dpkg-query -W -f='${{Status}}' {p} 2>&1 || true"))
            .unwrap()
            .contains("install ok installed")
    );
    // Purge leaves no enablement behind, and a fresh install after it is clean again.
    assert!(
        !host
            .run(
                "test -e /etc/systemd/system/multi-user.target.wants/clawfleet-coordinator.service"
            )
            .unwrap()
            .status
            .success()
    );
    dpkg_clean(&host, "install after purge", &format!("dpkg -i {cur}"));
}

#[test]
fn hostd_maintainer_scripts_print_nothing_wrong() {
    skip_unless_hosts!();
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let Some(next) = pkgs.hostd_deb_next.clone() else {
        missing("no hostd .deb in target/packages/test (packaging/build.sh makes it)");
        return;
    };
    let host = TestHost::start().unwrap();
    let cur = "/var/tmp/hostd.deb";
    let new = "/var/tmp/hostd-next.deb";
    copy_deb(&host, &pkgs.hostd_deb, cur);
    copy_deb(&host, &next, new);
    let p = "clawfleet-hostd";
    for script in ["postinst", "postrm"] {
        let text = host.run_ok(&format!("dpkg-deb -I {cur} {script}")).unwrap();
        assert!(!text.contains("#DEBHELPER#"), "{script}:\n{text}");
    }
    dpkg_clean(&host, "install", &format!("dpkg -i {cur}"));
    host.run_ok("/usr/sbin/hostd --version").unwrap();
    dpkg_clean(&host, "reinstall (same version)", &format!("dpkg -i {cur}"));
    dpkg_clean(&host, "upgrade", &format!("dpkg -i {new}"));
    dpkg_clean(&host, "downgrade", &format!("dpkg -i {cur}"));
    dpkg_clean(&host, "remove", &format!("dpkg -r {p}"));
    dpkg_clean(&host, "purge", &format!("dpkg -P {p}"));
    assert!(
        !host
            .run("test -e /etc/clawfleet/hostd.toml")
            .unwrap()
            .status
            .success()
    );
    // sshd still answers after the scripts reloaded it.
    host.run_ok("true").unwrap();
}
