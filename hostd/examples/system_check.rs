//! Exercises every `RealSystem` method on a real host and prints one JSON object with what
//! happened. Run as root inside a test host by hostd/tests/real_system.rs; it changes the
//! host (an account and two units), so never run it on a machine you care about.
//!
//! Usage: `system_check <test-gateway-binary> <port>`

use std::path::Path;
use std::time::{Duration, Instant};

use hostd::real::RealSystem;
use hostd::system::{System, UnitState};
use serde_json::{Value, json};

const ACCOUNT: &str = "cfa-syscheck000000000000000";
const OK_UNIT: &str = "cf-syscheck-ok.service";
const BAD_UNIT: &str = "cf-syscheck-bad.service";
const DIR: &str = "/var/lib/cf-syscheck";
/// The uid and gid the account is created with (hostd allocates them from its range).
const ID: u32 = 400_777;

fn state_json(s: &Result<UnitState, hostd::system::SystemError>) -> Value {
    match s {
        Ok(s) => json!({
            "active": s.active_state, "sub": s.sub_state, "enabled": s.enabled,
            "loaded": s.loaded, "nRestarts": s.n_restarts, "execMainStatus": s.exec_main_status,
        }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

fn res<T: serde::Serialize>(r: Result<T, hostd::system::SystemError>) -> Value {
    match r {
        Ok(v) => json!({ "ok": v }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 10.0).round() / 10.0
}

fn unit_text(gateway: &str, port: u16, config: &str, user: bool) -> String {
    let user = if user {
        format!("User={ACCOUNT}\nGroup={ACCOUNT}\n")
    } else {
        String::new()
    };
    format!(
        "[Unit]\nDescription=RealSystem check\n\n[Service]\n{user}\
         Environment=OPENCLAW_CONFIG_PATH={config}\nEnvironment=OPENCLAW_GATEWAY_PORT={port}\n\
         Environment=OPENCLAW_GATEWAY_PASSWORD=pw-syscheck\n\
         Environment=OPENCLAW_STATE_DIR={DIR}/state\nWorkingDirectory={DIR}/state\n\
         ExecStart={gateway}\nRestart=always\nRestartSec=200ms\nRestartPreventExitStatus=78\n\n\
         [Install]\nWantedBy=multi-user.target\n"
    )
}

fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if f() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    None
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let gateway = args.next().ok_or("usage: system_check <gateway> <port>")?;
    let port: u16 = args.next().ok_or("missing port")?.parse()?;
    let mut out = serde_json::Map::new();
    let sys = RealSystem::new()?;
    let job_limit = Duration::from_secs(30);

    out.insert("missingTools".into(), json!(sys.missing_tools()));
    let t = Instant::now();
    out.insert("systemdVersion".into(), res(sys.systemd_version()));
    out.insert("connectMs".into(), json!(ms(t.elapsed())));

    // Accounts.
    out.insert(
        "userBefore".into(),
        res(sys.user(ACCOUNT).map(|o| o.map(|i| i.uid))),
    );
    out.insert("idInUseBefore".into(), res(sys.id_in_use(ID)));
    let t = Instant::now();
    let ids = sys.create_account(ACCOUNT, Path::new(&format!("{DIR}/home")), ID);
    out.insert("createAccountMs".into(), json!(ms(t.elapsed())));
    out.insert(
        "createAccount".into(),
        res(ids.clone().map(|i| json!({"uid": i.uid, "gid": i.gid}))),
    );
    out.insert(
        "createAgain".into(),
        res(sys
            .create_account(ACCOUNT, Path::new("/nonexistent"), ID + 1)
            .map(|_| ())),
    );
    out.insert(
        "user".into(),
        res(sys
            .user(ACCOUNT)
            .map(|o| o.map(|i| json!({"uid": i.uid, "gid": i.gid})))),
    );
    out.insert("group".into(), res(sys.group(ACCOUNT)));
    out.insert("idInUse".into(), res(sys.id_in_use(ID)));
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    out.insert(
        "passwdLine".into(),
        json!(
            passwd
                .lines()
                .find(|l| l.starts_with(&format!("{ACCOUNT}:")))
        ),
    );
    out.insert(
        "badName".into(),
        res(sys
            .create_account("-o", Path::new("/x"), ID + 2)
            .map(|_| ())),
    );

    // useradd fails (the user name is taken, the group name is free): the group is rolled back.
    let taken = "cfa-syscheck-taken";
    let setup = std::process::Command::new("/usr/sbin/useradd")
        .args(["--system", "--no-user-group", "--gid", "nogroup", taken])
        .status()?;
    out.insert("rollbackSetup".into(), json!(setup.success()));
    out.insert(
        "rollbackCreate".into(),
        res(sys
            .create_account(taken, Path::new("/nonexistent"), ID + 3)
            .map(|_| ())),
    );
    out.insert("rollbackGroup".into(), res(sys.group(taken)));
    out.insert("rollbackDelete".into(), res(sys.delete_user(taken)));

    // Files the gateway needs, owned by the new account through chown.
    std::fs::create_dir_all(format!("{DIR}/state"))?;
    std::fs::create_dir_all(format!("{DIR}/cfg"))?;
    let good = format!(
        r#"{{"gateway":{{"mode":"local","bind":"loopback","port":{port},"auth":{{"mode":"password"}}}},"x-clawfleet-test":{{"readyAfterMs":300,"label":"syscheck"}}}}"#
    );
    std::fs::write(format!("{DIR}/cfg/good.json"), good)?;
    std::fs::write(
        format!("{DIR}/cfg/bad.json"),
        r#"{"x-clawfleet-test":{"notASwitch":true}}"#,
    )?;
    if let Ok(ids) = ids {
        out.insert(
            "chown".into(),
            res(sys.chown(Path::new(&format!("{DIR}/state")), ids)),
        );
        std::os::unix::fs::symlink("/etc/hostname", format!("{DIR}/link"))?;
        out.insert(
            "chownLink".into(),
            res(sys.chown(Path::new(&format!("{DIR}/link")), ids)),
        );
    }
    out.insert(
        "chownMissing".into(),
        res(sys.chown(
            Path::new("/nonexistent/x"),
            hostd::system::Ids { uid: 1, gid: 1 },
        )),
    );

    // Units.
    std::fs::write(
        format!("/etc/systemd/system/{OK_UNIT}"),
        unit_text(&gateway, port, &format!("{DIR}/cfg/good.json"), true),
    )?;
    std::fs::write(
        format!("/etc/systemd/system/{BAD_UNIT}"),
        unit_text(
            &gateway,
            port.saturating_add(1),
            &format!("{DIR}/cfg/bad.json"),
            false,
        ),
    )?;
    out.insert(
        "unknownBeforeReload".into(),
        state_json(&sys.unit_state("cf-syscheck-none.service")),
    );
    let t = Instant::now();
    out.insert("daemonReload".into(), res(sys.daemon_reload()));
    out.insert("daemonReloadMs".into(), json!(ms(t.elapsed())));
    out.insert("okBefore".into(), state_json(&sys.unit_state(OK_UNIT)));

    let t = Instant::now();
    out.insert("restart".into(), res(sys.restart_unit(OK_UNIT, job_limit)));
    out.insert("restartMs".into(), json!(ms(t.elapsed())));
    let ready = wait_for(Duration::from_secs(15), || {
        sys.probe_ready(port, Duration::from_secs(1))
    });
    out.insert("readyAfterRestartMs".into(), json!(ready.map(ms)));
    out.insert(
        "probeReady".into(),
        json!(sys.probe_ready(port, Duration::from_secs(1))),
    );
    let t = Instant::now();
    out.insert("restart2".into(), res(sys.restart_unit(OK_UNIT, job_limit)));
    out.insert("restart2Ms".into(), json!(ms(t.elapsed())));
    let t = Instant::now();
    out.insert("enable".into(), res(sys.enable_unit(OK_UNIT)));
    out.insert("enableMs".into(), json!(ms(t.elapsed())));
    out.insert("enableAgain".into(), res(sys.enable_unit(OK_UNIT)));
    let t = Instant::now();
    out.insert("okRunning".into(), state_json(&sys.unit_state(OK_UNIT)));
    out.insert("unitStateMs".into(), json!(ms(t.elapsed())));
    out.insert(
        "wantsLink".into(),
        json!(
            Path::new(&format!(
                "/etc/systemd/system/multi-user.target.wants/{OK_UNIT}"
            ))
            .exists()
        ),
    );

    // A configuration error: exit 78, no restart loop.
    out.insert(
        "restartBad".into(),
        res(sys.restart_unit(BAD_UNIT, job_limit)),
    );
    let failed = wait_for(Duration::from_secs(10), || {
        sys.unit_state(BAD_UNIT).is_ok_and(|s| s.is_failed())
    });
    out.insert("badFailedAfterMs".into(), json!(failed.map(ms)));
    out.insert("badState".into(), state_json(&sys.unit_state(BAD_UNIT)));
    out.insert("stopBad".into(), res(sys.stop_unit(BAD_UNIT, job_limit)));

    // Stop, disable, unknown units.
    let t = Instant::now();
    out.insert("stop".into(), res(sys.stop_unit(OK_UNIT, job_limit)));
    out.insert("stopMs".into(), json!(ms(t.elapsed())));
    out.insert("okStopped".into(), state_json(&sys.unit_state(OK_UNIT)));
    out.insert(
        "probeAfterStop".into(),
        json!(sys.probe_ready(port, Duration::from_secs(1))),
    );
    out.insert("stopAgain".into(), res(sys.stop_unit(OK_UNIT, job_limit)));
    out.insert("disable".into(), res(sys.disable_unit(OK_UNIT)));
    out.insert("okDisabled".into(), state_json(&sys.unit_state(OK_UNIT)));
    out.insert(
        "wantsLinkAfterDisable".into(),
        json!(
            Path::new(&format!(
                "/etc/systemd/system/multi-user.target.wants/{OK_UNIT}"
            ))
            .exists()
        ),
    );
    out.insert("disableAgain".into(), res(sys.disable_unit(OK_UNIT)));
    out.insert(
        "disableUnknown".into(),
        res(sys.disable_unit("cf-syscheck-none.service")),
    );
    out.insert(
        "stopUnknown".into(),
        res(sys.stop_unit("cf-syscheck-none.service", job_limit)),
    );
    out.insert(
        "restartUnknown".into(),
        res(sys.restart_unit("cf-syscheck-none.service", job_limit)),
    );
    out.insert(
        "unknownState".into(),
        state_json(&sys.unit_state("cf-syscheck-none.service")),
    );
    out.insert(
        "badUnitName".into(),
        res(sys.restart_unit("../x.service", job_limit)),
    );
    // A job that cannot finish in time: a start that sleeps.
    std::fs::write(
        "/etc/systemd/system/cf-syscheck-slow.service",
        "[Service]\nType=oneshot\nExecStart=/bin/sleep 5\n",
    )?;
    out.insert("reloadForSlow".into(), res(sys.daemon_reload()));
    let t = Instant::now();
    out.insert(
        "restartSlow".into(),
        res(sys.restart_unit("cf-syscheck-slow.service", Duration::from_millis(500))),
    );
    out.insert("restartSlowMs".into(), json!(ms(t.elapsed())));
    out.insert(
        "stopSlow".into(),
        res(sys.stop_unit("cf-syscheck-slow.service", job_limit)),
    );

    // Remove the account.
    let t = Instant::now();
    out.insert("deleteUser".into(), res(sys.delete_user(ACCOUNT)));
    out.insert("deleteUserMs".into(), json!(ms(t.elapsed())));
    out.insert("deleteGroup".into(), res(sys.delete_group(ACCOUNT)));
    out.insert(
        "userAfter".into(),
        res(sys.user(ACCOUNT).map(|o| o.is_some())),
    );
    out.insert("groupAfter".into(), res(sys.group(ACCOUNT)));
    out.insert("deleteUserAgain".into(), res(sys.delete_user(ACCOUNT)));
    out.insert("deleteGroupAgain".into(), res(sys.delete_group(ACCOUNT)));

    println!("{}", Value::Object(out));
    Ok(())
}
