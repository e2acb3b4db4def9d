//! The .rpm packages on a real systemd host: install, upgrade, roll back and erase.
//!
//! The test hosts are Debian and carry no rpm, so rpm runs on the runner with `--root` on the
//! host's file system (the overlay its container runs on, with `--nodeps`: the host has the
//! dependencies, but under Debian names in dpkg's database). The payload lands where it lands
//! on a RHEL host and the scriptlets run in a chroot of the host, so they cannot reach its
//! running systemd; the test then does what the operator guide tells RHEL operators to do
//! (`systemctl enable --now clawfleet-coordinator`), and stops the service before the erase.
//! What this proves: the rpm payload and scriptlets work on a systemd host, `%config(noreplace)`
//! keeps an edited config, and erase follows the documented rule.
//!
//! Needs root (test hosts), rpm and `packaging/build.sh` output; otherwise prints `SKIP: ...`
//! (fails under `CI=true`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod packages_support;

use std::path::Path;
use std::time::Duration;

use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use packages_support::*;

fn rpm(host: &TestHost, args: &[&str]) -> String {
    let root = host.root_dir().to_str().unwrap().to_owned();
    let mut all = vec!["--root", root.as_str()];
    all.extend_from_slice(args);
    let (ok, out, err) = run_local("rpm", &all);
    assert!(ok, "rpm {args:?}: {out}{err}");
    out + &err
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn exists(host: &TestHost, path: &str) -> bool {
    host.run(&format!("test -e {path}"))
        .unwrap()
        .status
        .success()
}

#[test]
fn rpms_install_upgrade_roll_back_and_erase_on_a_real_host() {
    skip_unless_hosts!();
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    if !have_tool("rpm") {
        missing("rpm is not installed (apt-get install rpm; .ci/run does)");
        return;
    }
    let Some(next) = pkgs.hostd_rpm_next.clone() else {
        missing("no rebuilt hostd .rpm in target/packages/test (packaging/build.sh makes it)");
        return;
    };
    let host = TestHost::start().unwrap();

    // Install both.
    rpm(
        &host,
        &[
            "-i",
            "--nodeps",
            path(&pkgs.hostd_rpm),
            path(&pkgs.coordinator_rpm),
        ],
    );
    let q = rpm(&host, &["-q", "clawfleet-hostd", "clawfleet-coordinator"]);
    assert!(
        q.contains("clawfleet-hostd-") && q.contains("clawfleet-coordinator-"),
        "{q}"
    );
    host.run_ok("/usr/sbin/hostd --version").unwrap();
    assert_eq!(
        host.run_ok("stat -c '%a %U %G' /usr/sbin/hostd /var/lib/clawfleet /etc/clawfleet")
            .unwrap(),
        "755 root root\n755 root root\n755 root root\n"
    );
    assert_eq!(
        host.run_ok("grep -v -E '^[[:space:]]*(#|$)' /etc/clawfleet/hostd.toml || true")
            .unwrap(),
        ""
    );
    host.run_ok("hostd status --json").unwrap();
    // %post created the service user with systemd-sysusers.
    let user = host.run_ok("getent passwd clawfleet").unwrap();
    assert!(
        user.contains(":/var/lib/clawfleet-coordinator:/usr/sbin/nologin"),
        "{user}"
    );
    host.run_ok("systemctl daemon-reload && systemctl enable --now clawfleet-coordinator")
        .unwrap();
    let serve_exists = host
        .run("/usr/bin/occ serve --help")
        .unwrap()
        .status
        .success();
    if serve_exists {
        assert!(
            wait_until(Duration::from_secs(30), || curl(
                &host,
                "http://127.0.0.1:7300/healthz"
            )
            .0 == 200),
            "{}",
            host.run_ok("journalctl -u clawfleet-coordinator --no-pager | tail -n 30")
                .unwrap()
        );
    } else {
        eprintln!("SKIP (service part): `occ serve` is not in this build of occ yet");
    }

    // Upgrade and roll back hostd with an edited config: %config(noreplace) keeps the edit.
    host.write_file(
        "/etc/clawfleet/hostd.toml",
        b"# edited by the operator\n",
        0o644,
    )
    .unwrap();
    rpm(&host, &["-U", "--nodeps", path(&next)]);
    let v = rpm(&host, &["-q", "clawfleet-hostd"]);
    assert!(v.contains(".pkgtest1"), "{v}");
    rpm(
        &host,
        &["-U", "--nodeps", "--oldpackage", path(&pkgs.hostd_rpm)],
    );
    let v = rpm(&host, &["-q", "clawfleet-hostd"]);
    assert!(!v.contains(".pkgtest1"), "{v}");
    assert_eq!(
        host.run_ok("cat /etc/clawfleet/hostd.toml").unwrap(),
        "# edited by the operator\n"
    );
    host.run_ok("/usr/sbin/hostd --version && test -d /var/lib/clawfleet")
        .unwrap();

    // Erase: what the packages made goes; Agent state, enrolment and coordinator state stay.
    host.run_ok(
        "mkdir -p /var/lib/clawfleet/namespaces/x && echo keep > /var/lib/clawfleet/namespaces/x/agent.json \
         && echo '# operator' > /etc/clawfleet/allowed_signers",
    )
    .unwrap();
    host.run_ok("systemctl stop clawfleet-coordinator").unwrap();
    rpm(&host, &["-e", "clawfleet-hostd", "clawfleet-coordinator"]);
    host.run_ok("systemctl daemon-reload").unwrap();
    assert!(!exists(&host, "/usr/sbin/hostd"));
    assert!(!exists(&host, "/usr/bin/occ"));
    assert!(!exists(
        &host,
        "/usr/lib/systemd/system/clawfleet-coordinator.service"
    ));
    assert!(
        !exists(&host, "/etc/clawfleet/occ.toml"),
        "unmodified: removed"
    );
    assert_eq!(
        host.run_ok("cat /etc/clawfleet/hostd.toml.rpmsave /var/lib/clawfleet/namespaces/x/agent.json /etc/clawfleet/allowed_signers")
            .unwrap(),
        "# edited by the operator\nkeep\n# operator\n",
        "modified config saved; Agent state and enrolment kept"
    );
    host.run_ok("getent passwd clawfleet").unwrap();
    if serve_exists {
        assert!(exists(
            &host,
            "/var/lib/clawfleet-coordinator/keys/signing_ed25519"
        ));
    }
}
