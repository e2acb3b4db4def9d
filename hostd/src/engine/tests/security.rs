//! Issue 26 over the fake layer: what one Agent (or a hook) could do to the host or to
//! another tenant.

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use super::*;
use crate::trash::BEFORE_DELETE;

fn delete_namespace(n: &str) -> Operation {
    Operation::DeleteNamespace(NamespaceArgs { namespace: ns(n) })
}

/// Whether another process could take the lock at `path` now (a missing file is free).
fn lock_free(path: &Path) -> bool {
    match File::open(path) {
        Ok(f) => f.try_lock().is_ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// Many files in the Agent's state, as a tenant could leave them.
fn fill(paths: &AgentPaths, files: usize) {
    let dir = paths.state.join("many");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..files {
        std::fs::write(dir.join(i.to_string()), b"x").unwrap();
    }
}

/// N8: the tree of a deleted Agent (or Namespace) is moved aside under the locks and deleted
/// after they are released, so another tenant's operation never waits for the deletion.
#[test]
fn a_deleted_agents_tree_is_deleted_after_the_host_and_agent_locks_are_released() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    h.ok(prepare("ns1", "a2", "rev-1", 1));
    let a1 = h.layout().agent(&id("ns1"), &id("a1"));
    let a2 = h.layout().agent(&id("ns1"), &id("a2"));
    fill(&a1, 200);
    fill(&a2, 200);
    let host_lock = h.layout().host_lock();
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let record = std::rc::Rc::clone(&seen);
    let locks = [host_lock.clone(), a1.lock.clone(), a2.lock.clone()];
    BEFORE_DELETE.with(|f| {
        *f.borrow_mut() = Some(Box::new(move |entry: &Path| {
            // The tree is already gone from its name and still whole in the trash.
            let agent_file = entry.join("tree/state/many/199");
            let in_namespace = entry
                .join("tree/agents")
                .read_dir()
                .map(|mut d| d.next().is_some())
                .unwrap_or(false);
            assert!(agent_file.is_file() || in_namespace, "{}", entry.display());
            record
                .borrow_mut()
                .push(locks.iter().map(|l| lock_free(l)).collect::<Vec<_>>());
        }))
    });
    h.ok(delete("ns1", "a1"));
    assert!(!a1.dir.exists());
    h.ok(delete_namespace("ns1"));
    BEFORE_DELETE.with(|f| *f.borrow_mut() = None);
    let seen = seen.borrow();
    assert_eq!(seen.len(), 2, "one deletion each: {seen:?}");
    for locks in seen.iter() {
        assert_eq!(
            locks,
            &[true, true, true],
            "host lock, a1's and a2's lock free while the tree is deleted"
        );
    }
    assert!(!h.layout().namespace_dir(&id("ns1")).exists());
    let trash = h.layout().trash_dir();
    assert!(!trash.exists() || std::fs::read_dir(&trash).unwrap().count() == 0);
}

/// N14: unit files are readable by root only, and their description names no tenant.
#[test]
fn unit_files_are_not_readable_by_other_users_and_name_no_tenant() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    h.ok(activate("ns1", "a1", "rev-1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let meta = std::fs::metadata(&paths.unit_file).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o640, "{}", paths.unit_file.display());
    let text = std::fs::read_to_string(&paths.unit_file).unwrap();
    let description = text
        .lines()
        .find(|l| l.starts_with("Description="))
        .unwrap();
    assert!(
        !description.contains("ns1") && !description.contains("a1"),
        "{description}"
    );
}

/// N5: Agent uids come from the configured range and are never handed out twice, even after
/// the Agent that had one is deleted.
#[test]
fn a_deleted_agents_uid_is_never_handed_out_again() {
    let h = Host::with_config("[accounts]\nuid_range = [500000, 500009]");
    let uid_of = |a: &str| {
        let paths = h.layout().agent(&id("ns1"), &id(a));
        let m: crate::markers::AccountMarker =
            crate::markers::read(&h.layout().account_marker(&paths.account), "account").unwrap();
        assert_eq!(m.uid, m.gid);
        m.uid
    };
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    assert_eq!(uid_of("a1"), 500_000);
    h.ok(delete("ns1", "a1"));
    h.ok(prepare("ns1", "a2", "rev-1", 1));
    assert_eq!(uid_of("a2"), 500_001, "the deleted Agent's uid is retired");
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    assert_eq!(
        uid_of("a1"),
        500_002,
        "a re-created Agent gets a new uid too"
    );
    // The mark only grows, and the range running out refuses clearly.
    let h = Host::with_config("[accounts]\nuid_range = [500000, 500000]");
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    h.ok(delete("ns1", "a1"));
    let f = h.fails(prepare("ns1", "a2", "rev-1", 1));
    assert_eq!(f.code, FailureCode::HostFull, "{f}");
    assert!(f.message.contains("accounts.uid_range"), "{f}");
    let a2 = h.layout().agent(&id("ns1"), &id("a2"));
    assert!(!a2.dir.exists());
    assert!(!h.layout().account_intent(&a2.account).exists());
}

/// Item 5: deleting a running Agent runs its `before-workload-stop` hooks, as stopping it
/// does; deleting a stopped one does not.
#[test]
fn deleting_a_running_agent_runs_its_stop_hooks() {
    let h = Host::new();
    let log = hook_log(&h).display().to_string();
    hook(
        &h,
        "before-workload-stop",
        "10-stop",
        &format!(
            "echo stop:$CLAWFLEET_AGENT_ID:$CLAWFLEET_REVISION_ID:$CLAWFLEET_REVISION_NUMBER >> {log}"
        ),
        0o700,
    );
    h.ok(ensure("ns1"));
    for a in ["a1", "a2", "a3"] {
        h.ok(prepare("ns1", a, "rev-1", 1));
        h.ok(activate("ns1", a, "rev-1", 1));
    }
    h.ok(Operation::StopRevision(rargs("ns1", "a3", "rev-1", 1)));
    assert_eq!(read_log(&h), ["stop:a3:rev-1:1"]);
    h.ok(delete("ns1", "a1"));
    assert_eq!(read_log(&h), ["stop:a3:rev-1:1", "stop:a1:rev-1:1"]);
    // a2 runs, a3 was stopped: only a2's hooks run with the Namespace.
    h.ok(delete_namespace("ns1"));
    assert_eq!(
        read_log(&h),
        ["stop:a3:rev-1:1", "stop:a1:rev-1:1", "stop:a2:rev-1:1"]
    );
    // A failing stop hook never keeps an Agent from being deleted.
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    h.ok(activate("ns1", "a1", "rev-1", 1));
    hook(&h, "before-workload-stop", "20-fail", "exit 3", 0o700);
    h.ok(delete("ns1", "a1"));
    assert!(!h.layout().agent(&id("ns1"), &id("a1")).dir.exists());
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Item 4: a hook's `setsid` daemon (another session and process group) is killed at the
/// hook's limit, and so is one a hook that finished left behind.
#[test]
fn a_hooks_setsid_daemons_do_not_outlive_it() {
    let mut h = Host::new();
    h.config.limits.hook_timeout = Duration::from_millis(500);
    let dir = h.config.state_root.parent().unwrap().to_path_buf();
    let daemon = |name: &str| {
        let pid_file = dir.join(name);
        format!(
            "setsid sh -c 'echo $$ > {0}; exec sleep 60' </dev/null >/dev/null 2>&1 & \
             while [ ! -s {0} ]; do sleep 0.01; done",
            pid_file.display()
        )
    };
    let pid = |name: &str| -> i32 {
        std::fs::read_to_string(dir.join(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    hook(
        &h,
        "before-workload-start",
        "10-hang",
        &format!("{}; sleep 60", daemon("hang.pid")),
        0o700,
    );
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert_eq!(f.code, FailureCode::HookTimeout, "{f}");
    let hung = pid("hang.pid");
    let still = alive(hung);
    if still {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(hung),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(!still, "the setsid daemon {hung} outlived the hook's limit");
    hook(
        &h,
        "before-workload-start",
        "10-hang",
        &daemon("left.pid"),
        0o700,
    );
    h.ok(activate("ns1", "a1", "rev-1", 1));
    let left = pid("left.pid");
    let still = alive(left);
    if still {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(left),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(!still, "the setsid daemon {left} outlived its hook");
}
