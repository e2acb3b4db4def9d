//! Issue 11 over the fake layer: removals an Agent cannot wedge, and crash windows.

use super::*;
use crate::trash::{deep_chain, rerun_with_descriptor_limit};

fn retire(n: &str, a: &str, rev: &str, number: u64) -> Operation {
    Operation::RetireRevision(rargs(n, a, rev, number))
}

fn delete_namespace(n: &str) -> Operation {
    Operation::DeleteNamespace(NamespaceArgs { namespace: ns(n) })
}

/// What an Agent can plant in its own directories: a deep chain in `state/`, links to a
/// directory outside its tree (standing in for `/etc`) in `home/` and `state/`.
fn plant(paths: &AgentPaths, outside: &Path, depth: usize) {
    drop(deep_chain(&paths.state, depth));
    std::os::unix::fs::symlink(outside, paths.home.join("etc")).unwrap();
    std::os::unix::fs::symlink(outside, paths.state.join("etc")).unwrap();
    std::fs::write(paths.home.join("f"), b"x").unwrap();
}

fn outside(h: &Host) -> std::path::PathBuf {
    let dir = h.config.state_root.parent().unwrap().join("etc-outside");
    std::fs::create_dir_all(dir.join("ssh")).unwrap();
    std::fs::write(dir.join("passwd"), b"root:x:0:0").unwrap();
    dir
}

fn assert_outside_intact(dir: &Path) {
    assert_eq!(std::fs::read(dir.join("passwd")).unwrap(), b"root:x:0:0");
    assert!(dir.join("ssh").is_dir());
}

/// No pending leftover anywhere under the state root, and an empty trash.
fn assert_no_leftovers(h: &Host) {
    let mut stack = vec![h.config.state_root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                !name.contains(".pending-"),
                "leftover {}",
                e.path().display()
            );
            if e.file_type().unwrap().is_dir() && name != "namespaces" {
                stack.push(e.path());
            }
        }
    }
    let trash = h.layout().trash_dir();
    if trash.exists() {
        assert_eq!(std::fs::read_dir(&trash).unwrap().count(), 0, "trash left");
    }
}

/// Run by [`a_deep_chain_and_links_do_not_stop_any_removal`] with at most 128 descriptors.
#[test]
#[ignore = "run by a_deep_chain_and_links_do_not_stop_any_removal under prlimit"]
fn removals_under_a_descriptor_limit() {
    if std::env::var_os("HOSTD_TRASH_TEST_DIR").is_none() {
        return;
    }
    let h = Host::new();
    let etc = outside(&h);
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.ok(activate("ns1", "a1", "r1", 1));
    h.ok(prepare("ns1", "a1", "r2", 2));
    h.ok(activate("ns1", "a1", "r2", 2));
    let a1 = h.layout().agent(&id("ns1"), &id("a1"));
    plant(&a1, &etc, 400);

    match h.ok(retire("ns1", "a1", "r1", 1)) {
        OperationResult::RetireRevision(r) => assert!(r.removed && !r.stopped),
        other => panic!("{other:?}"),
    }
    assert!(!a1.revision_dir(&id("r1")).exists());
    match h.ok(delete("ns1", "a1")) {
        OperationResult::DeleteAgent(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    assert!(!a1.dir.exists());
    assert!(!h.fake.has_user(&a1.account) && !h.fake.has_group(&a1.account));
    assert_outside_intact(&etc);
    assert_no_leftovers(&h);

    h.ok(ensure("ns2"));
    h.ok(prepare("ns2", "a2", "r1", 1));
    h.ok(activate("ns2", "a2", "r1", 1));
    let a2 = h.layout().agent(&id("ns2"), &id("a2"));
    plant(&a2, &etc, 400);
    match h.ok(delete_namespace("ns2")) {
        OperationResult::DeleteNamespace(r) => assert!(r.removed && r.agents_removed == 1),
        other => panic!("{other:?}"),
    }
    assert!(!h.layout().namespace_dir(&id("ns2")).exists());
    assert!(!h.fake.has_user(&a2.account));
    assert_outside_intact(&etc);
    assert_no_leftovers(&h);
}

#[test]
fn a_deep_chain_and_links_do_not_stop_any_removal() {
    let dir = tempfile::tempdir().unwrap();
    rerun_with_descriptor_limit(
        "engine::tests::hardening::removals_under_a_descriptor_limit",
        128,
        dir.path(),
    );
}

#[test]
fn a_removal_killed_half_way_is_finished_by_the_retry_and_by_any_later_operation() {
    let h = Host::new();
    let etc = outside(&h);
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.ok(activate("ns1", "a1", "r1", 1));
    let a1 = h.layout().agent(&id("ns1"), &id("a1"));
    plant(&a1, &etc, 50);
    // What a delete-agent killed right after its rename leaves: the tree in an unlocked
    // trash entry, the unit gone, the account and its marker still there.
    let unit = a1.unit_name.clone();
    h.fake.stop_unit(&unit, Duration::from_secs(1)).unwrap();
    std::fs::remove_file(&a1.unit_file).unwrap();
    let entry = h.layout().trash_dir().join("00killed00");
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::rename(&a1.dir, entry.join("tree")).unwrap();
    let inv = status(&h);
    assert!(
        inv.problems
            .iter()
            .any(|p| p.path == entry.display().to_string()),
        "status shows the trash: {inv:?}"
    );

    match h.ok(delete("ns1", "a1")) {
        OperationResult::DeleteAgent(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    assert!(!h.fake.has_user(&a1.account));
    assert!(!h.layout().account_marker(&a1.account).exists());
    assert_no_leftovers(&h);
    assert_outside_intact(&etc);

    // Any changing operation finishes what it finds, here an ensure-namespace.
    let entry = h.layout().trash_dir().join("00killed01");
    std::fs::create_dir_all(entry.join("tree/a/b/c")).unwrap();
    std::os::unix::fs::symlink(&etc, entry.join("tree/a/etc")).unwrap();
    h.ok(ensure("ns1"));
    assert_no_leftovers(&h);
    assert_outside_intact(&etc);
    assert!(status(&h).problems.is_empty());
}

/// The intent a run killed at the account step leaves (it is written before `useradd`).
fn write_intent(h: &Host, a: &str) -> AgentPaths {
    let paths = h.layout().agent(&id("ns1"), &id(a));
    let intent = crate::markers::AccountIntent {
        schema: crate::markers::SCHEMA,
        namespace_id: id("ns1"),
        agent_id: id(a),
        service_principal_id: id(&format!("sp-{a}")),
        account: paths.account.clone(),
    };
    std::fs::create_dir_all(h.layout().accounts_dir()).unwrap();
    std::fs::write(
        h.layout().account_intent(&paths.account),
        crate::markers::to_bytes(&intent),
    )
    .unwrap();
    paths
}

#[test]
fn an_account_created_by_a_killed_prepare_is_adopted_from_its_intent() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    // Killed after useradd, before the account marker: user and group exist, no marker.
    let paths = write_intent(&h, "a1");
    let ids = Ids { uid: 950, gid: 950 };
    h.fake.add_foreign_user(&paths.account, ids);
    assert!(
        status(&h)
            .problems
            .iter()
            .any(|p| p.path.ends_with(".intent")),
        "status shows the intent"
    );
    h.fake.clear_calls();
    h.ok(prepare("ns1", "a1", "r1", 1));
    assert!(
        !h.fake
            .calls()
            .iter()
            .any(|c| c.starts_with("create-account")),
        "adopted, not created again: {:?}",
        h.fake.calls()
    );
    let marker: crate::markers::AccountMarker =
        crate::markers::read(&h.layout().account_marker(&paths.account), "account").unwrap();
    assert_eq!((marker.uid, marker.gid), (950, 950));
    assert!(!h.layout().account_intent(&paths.account).exists());
    h.ok(activate("ns1", "a1", "r1", 1));
    assert!(status(&h).problems.is_empty());
}

#[test]
fn a_lone_group_of_a_killed_prepare_is_replaced_and_a_bare_intent_created_afresh() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    // A lone group (an earlier hostd killed between groupadd and useradd).
    let p1 = write_intent(&h, "a1");
    h.fake
        .add_foreign_user(&p1.account, Ids { uid: 951, gid: 951 });
    h.fake.delete_user(&p1.account).unwrap();
    assert!(h.fake.has_group(&p1.account) && !h.fake.has_user(&p1.account));
    h.ok(prepare("ns1", "a1", "r1", 1));
    assert!(h.fake.has_user(&p1.account));
    assert!(!h.layout().account_intent(&p1.account).exists());
    // Killed right after the intent: nothing else.
    let p2 = write_intent(&h, "a2");
    h.ok(prepare("ns1", "a2", "r1", 1));
    assert!(h.fake.has_user(&p2.account));
    assert!(!h.layout().account_intent(&p2.account).exists());
}

#[test]
fn an_intent_is_refused_for_another_agent_and_removed_with_its_agent() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let paths = write_intent(&h, "a1");
    h.fake
        .add_foreign_user(&paths.account, Ids { uid: 952, gid: 952 });
    // Another service principal under the same Agent id: not what the intent describes.
    let mut other = prepare("ns1", "a1", "r1", 1);
    if let Operation::PrepareRevision(p) = &mut other {
        p.agent.service_principal_id = id("sp-other");
    }
    assert_eq!(h.fails(other).code, FailureCode::OwnershipMismatch);
    assert!(h.fake.has_user(&paths.account));
    // delete-agent removes what the intent describes: user, group, intent.
    match h.ok(delete("ns1", "a1")) {
        OperationResult::DeleteAgent(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    assert!(!h.fake.has_user(&paths.account) && !h.fake.has_group(&paths.account));
    assert!(!h.layout().account_intent(&paths.account).exists());
    // And delete-namespace does for the Agents of its Namespace.
    let p2 = write_intent(&h, "a2");
    h.fake
        .add_foreign_user(&p2.account, Ids { uid: 953, gid: 953 });
    h.ok(delete_namespace("ns1"));
    assert!(!h.fake.has_user(&p2.account));
    assert!(!h.layout().account_intent(&p2.account).exists());
    assert_no_leftovers(&h);
}

#[test]
fn an_intent_that_cannot_be_written_stops_prepare_before_the_account() {
    // The intent cannot be written (the real full disk is in tests/hosts_faults.rs): nothing
    // is created, no pending file is left.
    let h = Host::new();
    h.ok(ensure("ns1"));
    let accounts = h.layout().accounts_dir();
    std::fs::create_dir_all(&accounts).unwrap();
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    // A directory where the intent goes stands in for a write that fails.
    std::fs::create_dir(h.layout().account_intent(&paths.account)).unwrap();
    let f = h.fails(prepare("ns1", "a1", "r1", 1));
    assert!(f.message.contains(".intent"), "{f}");
    assert!(!h.fake.has_user(&paths.account));
    assert!(!h.layout().account_marker(&paths.account).exists());
    std::fs::remove_dir(h.layout().account_intent(&paths.account)).unwrap();
    h.ok(prepare("ns1", "a1", "r1", 1));
    assert_no_leftovers(&h);
}
