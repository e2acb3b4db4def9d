//! `RealSystem` on a real systemd host: the `system_check` example runs inside a test host
//! (root, systemd as PID 1, system D-Bus) against the project's test gateway, and prints what
//! every method did; this test checks it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use serde_json::Value;

/// Builds the example with the cargo running this test (same profile and target dir) and
/// returns its path from cargo's JSON messages.
fn system_check_binary() -> PathBuf {
    clawfleet_vm_tests::cargo_build(
        "clawfleet-hostd",
        clawfleet_vm_tests::Artifact::Example,
        "system_check",
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn ok(v: &Value, key: &str) -> Value {
    let r = &v[key];
    assert!(r.get("ok").is_some(), "{key} failed: {r}\nall: {v:#}");
    r["ok"].clone()
}

fn err(v: &Value, key: &str) -> String {
    let r = &v[key];
    r["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{key} should have failed: {r}\nall: {v:#}"))
        .to_owned()
}

#[test]
fn real_system_drives_accounts_and_systemd_on_a_real_host() {
    skip_unless_hosts!();
    let check = system_check_binary();
    let host = TestHost::start().unwrap();
    let gateway = host.install_test_gateway().unwrap();
    host.install_file(&check, "/usr/local/bin/system_check", 0o755)
        .unwrap();
    let raw = host
        .run_ok(&format!("/usr/local/bin/system_check {gateway} 18750"))
        .unwrap();
    let v: Value = serde_json::from_str(raw.trim()).unwrap();
    eprintln!("system_check: {v:#}");

    assert_eq!(v["missingTools"], serde_json::json!([]), "{v:#}");
    let version = ok(&v, "systemdVersion");
    let major: u32 = version
        .as_str()
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(major >= 245, "{version}");

    // Accounts.
    assert_eq!(ok(&v, "userBefore"), Value::Null);
    let created = ok(&v, "createAccount");
    let (uid, gid) = (
        created["uid"].as_u64().unwrap(),
        created["gid"].as_u64().unwrap(),
    );
    assert!(uid > 0 && gid > 0, "{created}");
    assert_eq!(ok(&v, "user"), created);
    assert_eq!(ok(&v, "group").as_u64(), Some(gid));
    assert!(err(&v, "createAgain").contains("exit status 9"), "{v:#}");
    assert!(err(&v, "badName").contains("not a valid account name"));
    assert_eq!(
        v["passwdLine"].as_str().unwrap(),
        format!(
            "cfa-syscheck000000000000000:x:{uid}:{gid}::/var/lib/cf-syscheck/home:/usr/sbin/nologin"
        )
    );
    // The id hostd asked for, for the user and its group alike (`-K SYS_GID_MIN/MAX`).
    assert_eq!((uid, gid), (400_777, 400_777), "{created}");
    assert_eq!(ok(&v, "idInUseBefore"), false, "{v:#}");
    assert_eq!(ok(&v, "idInUse"), true, "{v:#}");
    assert!(
        !host.root_dir().join("var/lib/cf-syscheck/home").exists(),
        "no home is created"
    );
    assert_eq!(v["rollbackSetup"], true, "{v:#}");
    assert!(err(&v, "rollbackCreate").contains("useradd"), "{v:#}");
    assert_eq!(
        ok(&v, "rollbackGroup"),
        Value::Null,
        "the group was rolled back"
    );
    ok(&v, "rollbackDelete");

    // chown, without following symlinks.
    ok(&v, "chown");
    ok(&v, "chownLink");
    assert!(err(&v, "chownMissing").contains("/nonexistent/x"));
    let owners = host
        .run_ok("stat -c %u:%g /var/lib/cf-syscheck/state /etc/hostname; stat -c %u:%g -L /etc/hostname")
        .unwrap();
    assert_eq!(
        owners.lines().collect::<Vec<_>>(),
        [format!("{uid}:{gid}").as_str(), "0:0", "0:0"],
        "{owners}"
    );

    // systemd.
    assert_eq!(v["unknownBeforeReload"]["loaded"], false, "{v:#}");
    assert_eq!(v["unknownBeforeReload"]["enabled"], false, "{v:#}");
    ok(&v, "daemonReload");
    assert_eq!(v["okBefore"]["loaded"], true, "{v:#}");
    assert_eq!(v["okBefore"]["active"], "inactive", "{v:#}");
    assert_eq!(v["okBefore"]["enabled"], false, "{v:#}");
    ok(&v, "restart");
    assert!(v["readyAfterRestartMs"].is_number(), "never ready: {v:#}");
    assert_eq!(v["probeReady"], true);
    ok(&v, "restart2");
    ok(&v, "enable");
    ok(&v, "enableAgain");
    let running = &v["okRunning"];
    assert_eq!(running["active"], "active", "{v:#}");
    assert_eq!(running["sub"], "running", "{v:#}");
    assert_eq!(running["enabled"], true, "{v:#}");
    assert_eq!(running["loaded"], true, "{v:#}");
    assert_eq!(v["wantsLink"], true);

    // Exit status 78: restart may succeed or fail, but the unit ends failed without restarts.
    let bad = &v["badState"];
    assert_eq!(bad["active"], "failed", "{v:#}");
    assert_eq!(bad["execMainStatus"], 78, "{v:#}");
    assert_eq!(bad["nRestarts"], 0, "{v:#}");
    ok(&v, "stopBad");

    ok(&v, "stop");
    assert_eq!(v["okStopped"]["active"], "inactive", "{v:#}");
    assert_eq!(v["probeAfterStop"], false);
    ok(&v, "stopAgain");
    ok(&v, "disable");
    assert_eq!(v["okDisabled"]["enabled"], false, "{v:#}");
    assert_eq!(v["wantsLinkAfterDisable"], false);
    ok(&v, "disableAgain");
    ok(&v, "disableUnknown");
    ok(&v, "stopUnknown");
    assert!(err(&v, "restartUnknown").contains("restart"), "{v:#}");
    assert_eq!(v["unknownState"]["loaded"], false, "{v:#}");
    assert!(err(&v, "badUnitName").contains("not a valid unit name"));
    assert_eq!(
        err(&v, "restartSlow"),
        "the systemd job for cf-syscheck-slow.service did not finish within 1 s"
    );
    assert!(v["restartSlowMs"].as_f64().unwrap() < 3000.0, "{v:#}");
    ok(&v, "stopSlow");

    // Account removal, idempotent.
    ok(&v, "deleteUser");
    ok(&v, "deleteGroup");
    assert_eq!(ok(&v, "userAfter"), Value::Bool(false));
    assert_eq!(ok(&v, "groupAfter"), Value::Null);
    ok(&v, "deleteUserAgain");
    ok(&v, "deleteGroupAgain");
    assert!(
        host.run("getent group cfa-syscheck000000000000000")
            .unwrap()
            .status
            .code()
            == Some(2)
    );

    eprintln!(
        "timings (ms): connect {} createAccount {} daemonReload {} restart {} (again {}) \
         readyAfterRestart {} enable {} unitState {} stop {} deleteUser {}",
        v["connectMs"],
        v["createAccountMs"],
        v["daemonReloadMs"],
        v["restartMs"],
        v["restart2Ms"],
        v["readyAfterRestartMs"],
        v["enableMs"],
        v["unitStateMs"],
        v["stopMs"],
        v["deleteUserMs"]
    );
}
