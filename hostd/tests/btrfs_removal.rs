//! Issue 26, N6 on a real btrfs file system (a loop-mounted image of the test's own, with
//! quotas enabled): an Agent's subvolumes in its quota group, removed with nothing left behind,
//! also when a removal was interrupted and resumes from the trash, and also when the Agent
//! nested subvolumes of its own. Needs root, `mkfs.btrfs`, `losetup` and `btrfs`
//! (btrfs-progs); skipped otherwise, except under `CI=true`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use clawfleet_vm_tests::BtrfsImage;
use hostd::quota::{self, Limited, Mechanism, QuotaLimits, Support};

fn skip_reason() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root (loop devices, mount, btrfs quota groups)".to_owned());
    }
    for tool in ["mkfs.btrfs", "btrfs", "losetup"] {
        if Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            return Some(format!("{tool} is missing (apt-get install btrfs-progs)"));
        }
    }
    None
}

fn btrfs(args: &str, mount: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("btrfs {args} {}", mount.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "btrfs {args}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const UID: u32 = 61_234;

#[test]
fn agent_subvolumes_and_quota_group_leave_nothing_behind() {
    if let Some(why) = skip_reason() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "not skipped under CI=true: {why}"
        );
        eprintln!("SKIP: {why}");
        return;
    }
    let mut fs = BtrfsImage::create(512 << 20).unwrap();
    let root = fs.mount().to_path_buf();
    assert_eq!(
        quota::support(&root),
        Support::Enforced(Mechanism::BtrfsQgroups)
    );
    let limits = QuotaLimits {
        max_bytes: 8 << 20,
        max_inodes: 1000,
    };

    // Two Agents' trees: each with home and state subvolumes in its group.
    let mut trees = Vec::new();
    for (n, uid) in [("a", UID), ("b", UID + 1)] {
        let dir = root.join(n);
        std::fs::create_dir(&dir).unwrap();
        let (home, state) = (dir.join("home"), dir.join("state"));
        quota::create_subvolume(&home, 0o700).unwrap();
        quota::create_subvolume(&state, 0o700).unwrap();
        assert_eq!(
            quota::limit_agent(
                &root,
                Mechanism::BtrfsQgroups,
                &[&home, &state],
                uid,
                limits
            )
            .unwrap(),
            Limited::All
        );
        // Again, as every prepare does: idempotent.
        quota::limit_agent(
            &root,
            Mechanism::BtrfsQgroups,
            &[&home, &state],
            uid,
            limits,
        )
        .unwrap();
        std::fs::create_dir_all(home.join("d/e")).unwrap();
        std::fs::write(home.join("d/e/f"), vec![1u8; 1 << 20]).unwrap();
        std::fs::write(state.join("g"), b"x").unwrap();
        trees.push((dir, uid));
    }
    // Agent a nested a subvolume of its own inside its state, with files.
    let nested = trees[0].0.join("state/mine");
    quota::create_subvolume(&nested, 0o700).unwrap();
    std::fs::write(nested.join("h"), b"y").unwrap();
    // Beyond the limit: EDQUOT, as root too (btrfs quota groups exempt nobody).
    let big = std::fs::write(trees[1].0.join("home/big"), vec![0u8; 9 << 20]);
    let synced = big
        .and_then(|()| std::fs::File::open(trees[1].0.join("home/big")).and_then(|f| f.sync_all()));
    assert_eq!(
        synced.unwrap_err().raw_os_error(),
        Some(nix::libc::EDQUOT),
        "the group's limit holds"
    );
    // A full Agent's next prepare sets its limits again: the group calls go through the state
    // root, not through its own (full) subvolumes.
    let b = &trees[1].0;
    quota::limit_agent(
        &root,
        Mechanism::BtrfsQgroups,
        &[&b.join("home"), &b.join("state")],
        trees[1].1,
        limits,
    )
    .unwrap();
    let groups = btrfs("qgroup show -pcre --raw", &root);
    assert!(groups.contains(&format!("1/{UID} ")), "{groups}");
    assert!(groups.contains(&format!("1/{} ", UID + 1)), "{groups}");
    // A plain directory on this file system is reported, not limited, not moved.
    let old = root.join("old-home");
    std::fs::create_dir(&old).unwrap();
    assert_eq!(
        quota::limit_agent(&root, Mechanism::BtrfsQgroups, &[&old], UID + 2, limits).unwrap(),
        Limited::NotSubvolumes(vec![old.display().to_string()])
    );

    let trash = hostd::trash::Trash::new(root.join("trash"));
    // Agent a: removed in one go.
    quota::release_agent(&root, trees[0].1).unwrap();
    assert!(trash.remove_tree(&trees[0].0).unwrap());
    // Agent b: moved aside and then the run "killed" (the entry dropped undeleted); its group
    // released twice (a retry), and the leftover finished as the next operation would.
    quota::release_agent(&root, trees[1].1).unwrap();
    quota::release_agent(&root, trees[1].1).unwrap();
    let moved = trash.move_aside(&trees[1].0).unwrap().unwrap();
    drop(moved);
    assert_eq!(trash.finish().unwrap(), 1);
    assert!(trash.entries().unwrap().is_empty());

    btrfs("subvolume sync", &root);
    let groups = btrfs("qgroup show -pcre --raw", &root);
    let left: Vec<&str> = groups
        .lines()
        .filter(|l| l.starts_with("0/") || l.starts_with("1/"))
        .collect();
    assert_eq!(
        left.len(),
        1,
        "only the top level's group is left: {groups}"
    );
    assert!(left[0].starts_with("0/5 "), "{groups}");
    assert_eq!(
        btrfs("subvolume list", &root).trim(),
        "",
        "no subvolume left"
    );
    std::fs::remove_dir(&old).unwrap();
    std::fs::remove_dir(root.join("trash")).unwrap();
    fs.teardown().unwrap();
    assert!(!root.exists());
}
