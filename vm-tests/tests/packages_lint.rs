//! Static checks of the built packages on the runner (no test host, no root needed):
//! lintian reports no errors on either .deb, the .deb control data is what the operator guide
//! promises, and `rpm -qip`, `rpm -qlp` and `rpm -qp --requires` show the expected metadata,
//! files and dependencies for both .rpm files.
//!
//! Needs `packaging/build.sh` output, lintian and rpm (.ci/run installs both); otherwise
//! prints `SKIP: ...` (fails under `CI=true`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod packages_support;

use std::path::Path;

use packages_support::*;

fn tools_or_skip(tools: &[&str]) -> bool {
    let absent: Vec<&str> = tools.iter().copied().filter(|t| !have_tool(t)).collect();
    if absent.is_empty() {
        return true;
    }
    missing(&format!(
        "{} not installed (apt-get install lintian rpm; .ci/run does)",
        absent.join(", ")
    ));
    false
}

fn lintian(deb: &Path) {
    let (_, out, err) = run_local(
        "lintian",
        &[
            "--tag-display-limit",
            "0",
            "--display-info",
            deb.to_str().unwrap(),
        ],
    );
    eprintln!("lintian {}:\n{out}{err}", deb.display());
    let errors: Vec<&str> = out.lines().filter(|l| l.starts_with("E: ")).collect();
    assert!(errors.is_empty(), "lintian errors: {errors:#?}");
    assert!(
        !err.contains("error") || err.contains("running with root privileges"),
        "lintian failed to run: {err}"
    );
}

fn deb_contents(deb: &Path) -> Vec<String> {
    let (ok, out, err) = run_local("dpkg-deb", &["-c", deb.to_str().unwrap()]);
    assert!(ok, "{err}");
    out.lines().map(str::to_owned).collect()
}

/// An entry of `dpkg-deb -c` with this mode, owned by root (`root/root` as dpkg-deb
/// `--root-owner-group` writes it, or `0/0` without owner names).
fn has_entry(listing: &[String], mode: &str, path: &str) -> bool {
    listing.iter().any(|l| {
        l.starts_with(mode)
            && (l.contains(" root/root ") || l.contains(" 0/0 "))
            && l.ends_with(path)
    })
}

#[test]
fn lintian_finds_no_errors_and_the_debs_hold_what_the_guide_says() {
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    if !tools_or_skip(&["lintian", "dpkg-deb"]) {
        return;
    }
    lintian(&pkgs.hostd_deb);
    lintian(&pkgs.coordinator_deb);

    // hostd
    let depends = deb_field(&pkgs.hostd_deb, "Depends");
    for want in [
        "libc6 (>=",
        "openssh-server",
        "passwd",
        "systemd",
        "iproute2",
        "nftables",
    ] {
        assert!(depends.contains(want), "{want} in {depends}");
    }
    assert_eq!(deb_field(&pkgs.hostd_deb, "Package"), "clawfleet-hostd");
    let c = deb_contents(&pkgs.hostd_deb);
    assert!(has_entry(&c, "-rwxr-xr-x", "./usr/sbin/hostd"), "{c:#?}");
    assert!(
        has_entry(&c, "-rwxr-xr-x", "./usr/lib/clawfleet-hostd/reload-sshd"),
        "{c:#?}"
    );
    assert!(
        has_entry(&c, "-rw-r--r--", "./etc/clawfleet/hostd.toml"),
        "{c:#?}"
    );
    assert!(
        has_entry(
            &c,
            "-rw-r--r--",
            "./usr/share/doc/clawfleet-hostd/changelog.Debian.gz"
        ),
        "{c:#?}"
    );
    assert!(!c.iter().any(|l| l.contains("allowed_signers")), "{c:#?}");
    let (ok, conffiles, _) = run_local(
        "dpkg-deb",
        &["-I", pkgs.hostd_deb.to_str().unwrap(), "conffiles"],
    );
    assert!(ok);
    assert!(
        has_entry(
            &c,
            "-rw-r--r--",
            "./etc/ssh/sshd_config.d/clawfleet-hostd.conf"
        ),
        "{c:#?}"
    );
    assert_eq!(
        conffiles.trim(),
        "/etc/clawfleet/hostd.toml\n/etc/ssh/sshd_config.d/clawfleet-hostd.conf"
    );

    // coordinator
    let depends = deb_field(&pkgs.coordinator_deb, "Depends");
    for want in ["libc6 (>=", "systemd"] {
        assert!(depends.contains(want), "{want} in {depends}");
    }
    let c = deb_contents(&pkgs.coordinator_deb);
    for (mode, path) in [
        ("-rwxr-xr-x", "./usr/bin/occ"),
        ("-rw-r--r--", "./etc/clawfleet/occ.toml"),
        (
            "-rw-r--r--",
            "./usr/lib/systemd/system/clawfleet-coordinator.service",
        ),
        (
            "-rw-r--r--",
            "./usr/lib/sysusers.d/clawfleet-coordinator.conf",
        ),
    ] {
        assert!(has_entry(&c, mode, path), "{path} in {c:#?}");
    }
    let (ok, postinst, _) = run_local(
        "dpkg-deb",
        &["-I", pkgs.coordinator_deb.to_str().unwrap(), "postinst"],
    );
    assert!(ok);
    assert!(
        postinst.contains("systemd-sysusers") && postinst.contains("clawfleet-coordinator.conf"),
        "{postinst}"
    );
    assert!(
        postinst.contains("deb-systemd-helper enable 'clawfleet-coordinator.service'")
            || postinst.contains("deb-systemd-helper enable clawfleet-coordinator.service"),
        "{postinst}"
    );
}

fn rpm_query(rpm: &Path, args: &[&str]) -> String {
    let mut all = vec!["-qp"];
    all.extend_from_slice(args);
    all.push(rpm.to_str().unwrap());
    let (ok, out, err) = run_local("rpm", &all);
    assert!(ok, "rpm {all:?}: {err}");
    out
}

fn info_field(info: &str, field: &str) -> String {
    info.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == field).then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("{field} not in {info}"))
}

#[test]
fn rpm_metadata_files_and_dependencies() {
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    if !tools_or_skip(&["rpm"]) {
        return;
    }
    let version = deb_field(&pkgs.hostd_deb, "Version");
    let upstream = version.rsplit_once('-').unwrap().0;

    // hostd
    let info = rpm_query(&pkgs.hostd_rpm, &["-i"]);
    eprintln!("rpm -qip {}:\n{info}", pkgs.hostd_rpm.display());
    assert_eq!(info_field(&info, "Name"), "clawfleet-hostd");
    assert_eq!(info_field(&info, "Version"), upstream);
    assert_eq!(info_field(&info, "Release"), "1");
    assert_eq!(info_field(&info, "Architecture"), "x86_64");
    assert_eq!(info_field(&info, "License"), "Apache-2.0");
    assert!(info_field(&info, "Summary").contains("host helper"));
    let files = rpm_query(&pkgs.hostd_rpm, &["-l"]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        [
            "/etc/clawfleet/hostd.toml",
            "/etc/ssh/sshd_config.d/clawfleet-hostd.conf",
            "/usr/lib/clawfleet-hostd/reload-sshd",
            "/usr/sbin/hostd",
            "/usr/share/doc/clawfleet-hostd/operator-guide.md",
        ],
        "{files}"
    );
    let config = rpm_query(&pkgs.hostd_rpm, &["-c"]);
    assert_eq!(
        config.trim(),
        "/etc/clawfleet/hostd.toml\n/etc/ssh/sshd_config.d/clawfleet-hostd.conf"
    );
    // %config(noreplace): an edited hostd.toml survives upgrades.
    let flags = rpm_query(
        &pkgs.hostd_rpm,
        &["--qf", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]"],
    );
    assert!(flags.contains("cn /etc/clawfleet/hostd.toml"), "{flags}");
    let modes = rpm_query(
        &pkgs.hostd_rpm,
        &["--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]"],
    );
    assert!(modes.contains("-rwxr-xr-x /usr/sbin/hostd"), "{modes}");
    let requires = rpm_query(&pkgs.hostd_rpm, &["--requires"]);
    eprintln!(
        "rpm -qp --requires {}:\n{requires}",
        pkgs.hostd_rpm.display()
    );
    for want in [
        "libc.so.6(GLIBC_2.34)(64bit)",
        "openssh-server",
        "shadow-utils",
        "systemd",
        "iproute",
        "nftables",
        "/bin/sh",
    ] {
        assert!(
            requires.lines().any(|l| l.starts_with(want)),
            "{want} in {requires}"
        );
    }
    let scripts = rpm_query(&pkgs.hostd_rpm, &["--scripts"]);
    assert!(scripts.contains("postinstall scriptlet"), "{scripts}");
    assert!(scripts.contains("postuninstall scriptlet"), "{scripts}");
    assert!(scripts.contains("install -d -m 0755 -o root -g root /var/lib/clawfleet"));

    // coordinator
    let info = rpm_query(&pkgs.coordinator_rpm, &["-i"]);
    eprintln!("rpm -qip {}:\n{info}", pkgs.coordinator_rpm.display());
    assert_eq!(info_field(&info, "Name"), "clawfleet-coordinator");
    assert_eq!(info_field(&info, "Version"), upstream);
    assert_eq!(info_field(&info, "Architecture"), "x86_64");
    let files = rpm_query(&pkgs.coordinator_rpm, &["-l"]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        [
            "/etc/clawfleet/occ.toml",
            "/usr/bin/occ",
            "/usr/lib/systemd/system/clawfleet-coordinator.service",
            "/usr/lib/sysusers.d/clawfleet-coordinator.conf",
            "/usr/share/doc/clawfleet-coordinator/operator-guide.md",
        ],
        "{files}"
    );
    let flags = rpm_query(
        &pkgs.coordinator_rpm,
        &["--qf", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]"],
    );
    assert!(flags.contains("cn /etc/clawfleet/occ.toml"), "{flags}");
    let requires = rpm_query(&pkgs.coordinator_rpm, &["--requires"]);
    eprintln!(
        "rpm -qp --requires {}:\n{requires}",
        pkgs.coordinator_rpm.display()
    );
    for want in ["libc.so.6(GLIBC_2.34)(64bit)", "systemd", "/bin/sh"] {
        assert!(
            requires.lines().any(|l| l.starts_with(want)),
            "{want} in {requires}"
        );
    }
    let scripts = rpm_query(&pkgs.coordinator_rpm, &["--scripts"]);
    for want in [
        "systemd-sysusers /usr/lib/sysusers.d/clawfleet-coordinator.conf",
        "systemctl --no-reload disable --now clawfleet-coordinator.service",
        "systemctl try-restart clawfleet-coordinator.service",
    ] {
        assert!(scripts.contains(want), "{want} in {scripts}");
    }
}

/// The helper other suites use to install hostd tells a current package from a stale one.
#[test]
fn a_hostd_deb_older_than_the_sources_is_stale() {
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let dir = ScratchDir::new("pkgtest-stale");
    let copy = dir.0.join("clawfleet-hostd_0_amd64.deb");
    std::fs::copy(&pkgs.hostd_deb, &copy).unwrap();
    let f = std::fs::File::options().write(true).open(&copy).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    assert!(!hostd_deb_is_stale(&copy));
    f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1))
        .unwrap();
    assert!(hostd_deb_is_stale(&copy));
}

/// `packaging/mkpkg.py` fills the line that is exactly `#DEBHELPER#` and refuses the marker
/// anywhere else: a tool that replaces every occurrence put the generated code into a comment
/// too (its first line commented out, the rest run as commands: `postinst: 40: ,: not found`,
/// and every generated step twice).
#[test]
fn a_debhelper_marker_outside_its_own_line_fails_the_package_build() {
    if !have_tool("python3") {
        missing("python3 not installed (packaging/mkpkg.py needs it)");
        return;
    }
    let mkpkg = workspace_dir().join("packaging/mkpkg.py");
    let dir = ScratchDir::new("pkgtest-debhelper");
    let script = |name: &str, text: &str| {
        let path = dir.0.join(name);
        std::fs::write(&path, text).unwrap();
        let (ok, out, err) = run_local(
            "python3",
            &[mkpkg.to_str().unwrap(), "debhelper", path.to_str().unwrap()],
        );
        (ok, out, err)
    };
    let (ok, out, err) = script(
        "good",
        "#!/bin/sh\nset -e\n# generated part below\n#DEBHELPER#\nexit 0\n",
    );
    assert!(ok, "{err}");
    assert_eq!(out.matches("GENERATED").count(), 1, "{out}");
    assert!(!out.contains("#DEBHELPER#"), "{out}");

    let (ok, _, err) = script(
        "in-comment",
        "#!/bin/sh\n# The generated part below (#DEBHELPER#, filled in by the tool):\nset -e\n#DEBHELPER#\nexit 0\n",
    );
    assert!(!ok, "a marker in a comment must fail the build");
    assert!(
        err.contains("line(s) [2]") && err.contains("not alone on its line"),
        "{err}"
    );
    let (ok, _, err) = script("twice", "#!/bin/sh\n#DEBHELPER#\n#DEBHELPER#\n");
    assert!(!ok && err.contains("appears 2 times"), "{err}");
}

/// The coordinator's postinst as packaged: no marker left, each generated part once, and
/// valid shell.
#[test]
fn the_coordinator_postinst_holds_each_generated_part_once() {
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let (ok, postinst, err) = run_local(
        "dpkg-deb",
        &["-I", pkgs.coordinator_deb.to_str().unwrap(), "postinst"],
    );
    assert!(ok, "{err}");
    assert!(!postinst.contains("#DEBHELPER#"), "{postinst}");
    let commands = |needle: &str| {
        postinst
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && l.contains(needle))
            .count()
    };
    assert_eq!(commands("systemd-sysusers"), 1, "{postinst}");
    assert_eq!(commands("deb-systemd-helper enable"), 1, "{postinst}");
    assert_eq!(commands("deb-systemd-invoke $_dh_action"), 1, "{postinst}");
    let dir = ScratchDir::new("pkgtest-postinst");
    let path = dir.0.join("postinst");
    std::fs::write(&path, &postinst).unwrap();
    let (ok, _, err) = run_local("sh", &["-n", path.to_str().unwrap()]);
    assert!(ok, "sh -n postinst: {err}");
}

/// `SHA256SUMS` lists every package and is signed: `ssh-keygen -Y verify` accepts the signature
/// with the `allowed_signers` the build wrote, `sha256sum -c` passes, and a changed
/// `SHA256SUMS` no longer verifies.
#[test]
fn sha256sums_is_signed_and_a_changed_copy_does_not_verify() {
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let sums = pkgs.dir.join("SHA256SUMS");
    let sig = pkgs.dir.join("SHA256SUMS.sig");
    let signers = pkgs.dir.join("allowed_signers");
    for f in [&sums, &sig, &signers] {
        assert!(
            f.is_file(),
            "{} missing (packaging/build.sh writes it)",
            f.display()
        );
    }
    let listed = std::fs::read_to_string(&sums).unwrap();
    for p in [
        &pkgs.hostd_deb,
        &pkgs.coordinator_deb,
        &pkgs.hostd_rpm,
        &pkgs.coordinator_rpm,
    ] {
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(
            listed.lines().any(|l| l.ends_with(name)),
            "{name} in {listed}"
        );
    }
    let principal = std::fs::read_to_string(&signers)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let verify = |file: &Path| {
        let out = std::process::Command::new("ssh-keygen")
            .args(["-Y", "verify", "-f"])
            .arg(&signers)
            .args(["-I", &principal, "-n", "clawfleet-packages", "-s"])
            .arg(&sig)
            .stdin(std::fs::File::open(file).unwrap())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, said) = verify(&sums);
    assert!(ok, "{said}");
    assert!(
        said.contains(&format!(
            "Good \"clawfleet-packages\" signature for {principal}"
        )),
        "{said}"
    );
    let out = std::process::Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&pkgs.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let dir = ScratchDir::new("pkgtest-sums");
    let changed = dir.0.join("SHA256SUMS");
    std::fs::write(&changed, listed.replacen('0', "1", 1)).unwrap();
    let (ok, said) = verify(&changed);
    assert!(!ok, "a changed SHA256SUMS verified: {said}");
}
