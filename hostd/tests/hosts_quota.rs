//! Issue 26, N6 on a real host: one Agent fills its share of the state root (bytes with
//! `fallocate` and `dd`, inodes with `touch`), and another tenant's deploy and hostd's own
//! operations still succeed. The state root is a small ext4 file system of this test's own
//! (a loop-mounted image on the runner, bound into the test host as `/var/lib/clawfleet`), so
//! filling it fills nothing else.
//!
//! Where the runner's kernel can mount an ext4 with project quotas (`CONFIG_QUOTA` and
//! `CONFIG_QFMT_V2`), the image has them: hostd reports `quotas: enforced`, the filling Agent
//! gets `EDQUOT` at `[quota]`'s limits, and the file system keeps room for everyone else.
//! Where it cannot (the mount is refused), the image has none: hostd reports `quotas:
//! unavailable: <why>`, the filling Agent gets `ENOSPC` at the blocks ext4 reserves for root,
//! and hostd (root) keeps writing; inodes are not filled then, since nothing bounds them
//! without quotas (the operator guide says so).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::OperationResult;
use clawfleet_vm_tests::{HostOptions, TestHost, skip_unless_hosts};
use hosts_support::*;
use serde_json::json;

/// A loop-mounted ext4 image on the runner, unmounted and removed on drop.
struct StateFs {
    dir: tempfile::TempDir,
    mount: PathBuf,
    /// Whether it has project quotas (the kernel mounted it with `prjquota`).
    quotas: bool,
}

fn sh(command: &str) -> std::process::Output {
    Command::new("sh").arg("-c").arg(command).output().unwrap()
}

impl StateFs {
    fn new() -> Self {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let image = dir.path().join("state.img");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let (i, m) = (image.display(), mount.display());
        // 128 MiB, 4096 inodes, ext4's default 5% reserved for root.
        let with_quotas = sh(&format!(
            "truncate -s 128M {i} && mkfs.ext4 -q -F -N 4096 -O quota,project -E quotatype=prjquota {i} && mount -o loop,prjquota {i} {m}"
        ));
        let quotas = with_quotas.status.success();
        if !quotas {
            eprintln!(
                "this kernel cannot mount an ext4 with project quotas ({}); testing the state root without them",
                String::from_utf8_lossy(&with_quotas.stderr).trim()
            );
            let plain = sh(&format!(
                "mkfs.ext4 -q -F -N 4096 {i} && mount -o loop {i} {m}"
            ));
            assert!(
                plain.status.success(),
                "{}",
                String::from_utf8_lossy(&plain.stderr)
            );
        }
        Self { dir, mount, quotas }
    }
}

impl Drop for StateFs {
    fn drop(&mut self) {
        // Our own mount, by its path (the loop device goes with it: mount set autoclear).
        let out = sh(&format!("umount {}", self.mount.display()));
        if !out.status.success() {
            eprintln!(
                "cannot unmount {}: {}",
                self.mount.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = &self.dir;
    }
}

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

fn deploy(occ: &Coordinator, host: &TestHost, n: &str, a: &str, label: &str) {
    occ.ok(host, ensure(n));
    let rev = spec("rev-1", 1, json!({ "label": label }));
    occ.ok(host, prepare(n, a, &rev));
    occ.ok(
        host,
        Operation::ActivateRevision(ActivateArgs::from(rargs(n, a, &rev))),
    );
}

/// Runs `script` as the Agent's account (its uid and gid, no other groups), as a process of
/// the Agent would.
fn as_agent(host: &TestHost, home: &Path, script: &str) -> String {
    let uid = host
        .run_ok(&format!("stat -c %u {}", home.display()))
        .unwrap();
    let uid = uid.trim();
    let out = host
        .run(&format!(
            "cd {} && setpriv --reuid={uid} --regid={uid} --clear-groups sh -c '{script}' 2>&1",
            home.display()
        ))
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `script` in the Agent's running unit (its gateway's user and mount namespaces), as
/// its account, from its home.
fn in_unit(host: &TestHost, paths: &hostd::layout::AgentPaths, script: &str) -> String {
    let pid = host
        .run_ok(&format!(
            "systemctl show -p MainPID --value {}",
            paths.unit_name
        ))
        .unwrap();
    let uid = host
        .run_ok(&format!("stat -c %u {}", paths.home.display()))
        .unwrap();
    let (pid, uid) = (pid.trim(), uid.trim());
    let out = host
        .run(&format!(
            "nsenter -t {pid} -U -m -S {uid} -G {uid} --wd={} sh -c '{script}' 2>&1",
            paths.home.display()
        ))
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn an_agent_that_fills_its_share_leaves_other_tenants_and_hostd_working() {
    skip_unless_hosts!();
    let fs = StateFs::new();
    let occ = Coordinator::new();
    let host = host_with_hostd_options(
        &occ,
        // 16 MiB and 300 inodes per Agent, where quotas exist.
        "[quota]\nmax_bytes = 16777216\nmax_inodes = 300\n",
        &HostOptions {
            binds: vec![(fs.mount.clone(), "/var/lib/clawfleet".to_owned())],
            ..HostOptions::default()
        },
    );
    let quotas = match occ.ok(&host, Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => p.quotas.expect("hostd reports its quotas"),
        other => panic!("{other:?}"),
    };
    if fs.quotas {
        assert!(quotas.starts_with("enforced: project quotas"), "{quotas}");
    } else {
        assert!(
            quotas.starts_with("unavailable: ") && quotas.contains("project quotas"),
            "{quotas}"
        );
    }
    let status = host.run_ok("hostd status").unwrap();
    assert!(status.contains(&format!("quotas: {quotas}")), "{status}");

    deploy(&occ, &host, "ns-filler", "filler", "filler");
    let filler = layout().agent(&id("ns-filler"), &id("filler"));
    let refusal = if fs.quotas {
        "Disk quota exceeded"
    } else {
        "No space left on device"
    };

    // From inside its unit the Agent cannot take its files out of its project: neither change
    // a file's project id nor clear a directory's inherit flag (its own user namespace,
    // PrivateUsers=; from the init user namespace the owner may do both).
    let escape = in_unit(
        &host,
        &filler,
        "mkdir -p esc && touch esc/f; chattr -p 4242 esc/f; echo rc=$?; if lsattr -d esc | cut -d\" \" -f1 | grep -q P; then chattr -P esc; else chattr +P esc; fi; echo rc=$?",
    );
    assert!(
        escape.matches("Invalid argument").count() == 2 && !escape.contains("rc=0"),
        "the project state cannot change inside the unit: {escape}"
    );

    if fs.quotas {
        // Inodes first (while the blocks for directory entries are within the limit): files
        // until the limit.
        let inodes = as_agent(
            &host,
            &filler.home,
            "i=0; while touch f$i; do i=$((i+1)); done; echo made=$i",
        );
        assert!(inodes.contains("Disk quota exceeded"), "{inodes}");
        let used = host
            .run_ok("df --output=iused /var/lib/clawfleet | tail -1")
            .unwrap();
        assert!(
            used.trim().parse::<u64>().unwrap() < 2000,
            "the file system keeps inodes for others: {used}"
        );
    }

    // Bytes: one large allocation, then everything dd can write.
    let big = as_agent(
        &host,
        &filler.home,
        "fallocate -l 200M big; echo rc=$?; dd if=/dev/zero of=fill bs=1M status=none; echo rc=$?",
    );
    assert!(
        big.contains(refusal) && !big.contains("rc=0"),
        "the filler's writes are refused ({refusal}): {big}"
    );
    let workspace = as_agent(
        &host,
        &filler.state,
        "mkdir -p workspace && dd if=/dev/zero of=workspace/more bs=1M count=4 status=none; echo rc=$?",
    );
    assert!(
        workspace.contains(refusal),
        "its workspace shares its limit: {workspace}"
    );

    // Another tenant deploys, and hostd's own operations go on.
    deploy(&occ, &host, "ns-other", "other", "other");
    occ.ok(&host, Operation::Status(StatusArgs::default()));
    occ.ok(&host, ensure("ns-third"));
    let rev2 = spec("rev-2", 2, json!({ "label": "other-2" }));
    occ.ok(&host, prepare("ns-other", "other", &rev2));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns-other", "other", &rev2))),
    );
    if fs.quotas {
        // And the other Agent can still write its own files: the filler took only its share.
        let other = layout().agent(&id("ns-other"), &id("other"));
        let wrote = as_agent(
            &host,
            &other.home,
            "dd if=/dev/zero of=mine bs=1M count=4 status=none; echo rc=$?",
        );
        assert!(wrote.contains("rc=0"), "{wrote}");
    }
    drop(host);
    drop(fs);
}

fn qgroups_enabled(mount: &Path) -> bool {
    sh(&format!("btrfs qgroup show {}", mount.display()))
        .status
        .success()
}

fn qgroups(mount: &Path) -> String {
    let out = sh(&format!(
        "btrfs qgroup show -pcre --raw {}",
        mount.display()
    ));
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 26, N6 on a btrfs state root (Fedora's and openSUSE's default file system), where the
/// kernel enforces btrfs quota groups: two Agents of two Namespaces; one writes as its own uid
/// until `EDQUOT`; the other's deploy and hostd's operations still succeed (the attack as the
/// finding has it: the writes come first and the other tenant's operations right after, so
/// a hostd without limits fails there); the filled Agent's
/// own workspace setup reports `NO_SPACE` (retryable); deleting it removes its subvolumes and
/// its quota group. The harness makes and removes the file system ([`HostOptions`]).
#[test]
fn a_btrfs_state_root_limits_each_agent_by_its_quota_group() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd_options(
        &occ,
        "[quota]\nmax_bytes = 33554432\n",
        &HostOptions {
            btrfs_state_root: Some(1 << 30),
            ..HostOptions::default()
        },
    );
    let mount = host.state_fs().expect("a btrfs state root").to_path_buf();
    // Quotas off: hostd says so, with the command that turns them on, and never turns them on
    // itself; an Agent provisioned now has plain directories.
    let quotas_of = |occ: &Coordinator| match occ.ok(&host, Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => p.quotas.expect("hostd reports its quotas"),
        other => panic!("{other:?}"),
    };
    assert!(
        sh(&format!("btrfs quota disable {}", mount.display()))
            .status
            .success()
    );
    // (Checked after the attack below, which a hostd without limits fails first.)
    let off = quotas_of(&occ);
    deploy(&occ, &host, "ns-old", "old", "old");
    assert!(
        !qgroups_enabled(&mount),
        "hostd did not enable quotas itself"
    );
    assert!(
        sh(&format!("btrfs quota enable {}", mount.display()))
            .status
            .success()
    );
    deploy(&occ, &host, "ns-filler", "filler", "filler");
    deploy(&occ, &host, "ns-other", "other", "other");
    let filler = layout().agent(&id("ns-filler"), &id("filler"));
    let other = layout().agent(&id("ns-other"), &id("other"));
    let uid_of = |p: &Path| {
        host.run_ok(&format!("stat -c %u {}", p.display()))
            .unwrap()
            .trim()
            .to_owned()
    };
    let filler_uid = uid_of(&filler.home);
    // The filler writes as its uid until the kernel refuses: EDQUOT, in home and in state.
    let fill = as_agent(
        &host,
        &filler.home,
        "dd if=/dev/zero of=fill bs=1M status=none; echo rc=$?",
    );
    assert!(!fill.contains("rc=0"), "{fill}");
    let more = as_agent(
        &host,
        &filler.state,
        "dd if=/dev/zero of=more bs=1M count=4 status=none; echo rc=$?",
    );

    // The other tenant and hostd go on: a new revision, a new Namespace, status; and the
    // other Agent writes its own files.
    // With initial workspace files: copied into its state subvolume (a rename from hostd's
    // staging directory cannot cross into it).
    let rev2 = spec("rev-2", 2, json!({ "label": "other-2" }));
    let setup: Vec<clawfleet_protocol::workspace::WorkspaceFile> = ["AGENTS.md", "memory/notes.md"]
        .iter()
        .map(|n| clawfleet_protocol::workspace::WorkspaceFile {
            name: clawfleet_protocol::workspace::WorkspaceName::new(*n).unwrap(),
            content: format!("{n}\n").into_bytes(),
        })
        .collect();
    occ.ok(
        &host,
        Operation::PrepareRevision(PrepareArgs {
            workspace: Some(clawfleet_protocol::workspace::WorkspaceSetup {
                manifest: setup.iter().map(|f| f.meta()).collect(),
                files: Some(setup),
            }),
            namespace: ns("ns-other"),
            agent: agent("other"),
            revision: rev2.clone(),
            egress: None,
        }),
    );
    let applied = as_agent(
        &host,
        &other.state,
        "cat workspace/AGENTS.md workspace/memory/notes.md && stat -c %U:%a workspace/memory/notes.md workspace/memory",
    );
    let account = layout().agent(&id("ns-other"), &id("other")).account;
    assert_eq!(
        applied,
        format!("AGENTS.md\nmemory/notes.md\n{account}:600\n{account}:700\n"),
        "the workspace is the Agent's"
    );
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns-other", "other", &rev2))),
    );
    occ.ok(&host, ensure("ns-third"));
    occ.ok(&host, Operation::Status(StatusArgs::default()));
    let wrote = as_agent(
        &host,
        &other.home,
        "dd if=/dev/zero of=mine bs=1M count=8 status=none; echo rc=$?",
    );
    assert!(wrote.contains("rc=0"), "{wrote}");

    assert!(
        off.starts_with("unavailable: ") && off.contains("`btrfs quota enable"),
        "{off}"
    );
    // Which is because the filler hit its own limit, not the file system's end.
    assert!(fill.contains("Disk quota exceeded"), "{fill}");
    assert!(more.contains("Disk quota exceeded"), "{more}");
    let quotas = quotas_of(&occ);
    assert!(
        quotas.starts_with("enforced: btrfs quota groups") && quotas.contains("no inode limit"),
        "{quotas}"
    );
    let status = host.run_ok("hostd status").unwrap();
    assert!(status.contains(&format!("quotas: {quotas}")), "{status}");

    // home and state are subvolumes (inode 256) in the Agent's group 1/<uid>, limited.
    for dir in [&filler.home, &filler.state, &other.home, &other.state] {
        let ino = host
            .run_ok(&format!("stat -c %i {}", dir.display()))
            .unwrap();
        assert_eq!(ino.trim(), "256", "{} is a subvolume", dir.display());
    }
    let groups = qgroups(&mount);
    let line = groups
        .lines()
        .find(|l| l.starts_with(&format!("1/{filler_uid} ")))
        .unwrap_or_else(|| panic!("no group 1/{filler_uid}: {groups}"));
    assert!(line.contains("33554432"), "{line}");
    assert_eq!(
        line.split_whitespace().nth(6).unwrap().split(',').count(),
        2,
        "{line}"
    );

    // The Agent provisioned before quotas were enabled is reported unlimited, its data
    // where it was.
    let old = layout().agent(&id("ns-old"), &id("old"));
    let problems = match occ.ok(&host, Operation::Status(StatusArgs::default())) {
        OperationResult::Status(i) => i.problems,
        other => panic!("{other:?}"),
    };
    for dir in [&old.home, &old.state] {
        assert!(
            problems
                .iter()
                .any(|p| p.path == dir.display().to_string() && p.message.contains("unlimited")),
            "{} is listed as unlimited: {problems:?}",
            dir.display()
        );
    }
    assert!(
        problems.len() == 2,
        "only the old Agent's directories: {problems:?}"
    );

    // The filler's own operation that writes into its share: NO_SPACE, retryable.
    // Two files of 60 KiB (a workspace file is at most 64 KiB, a set 128 KiB).
    let files: Vec<clawfleet_protocol::workspace::WorkspaceFile> = (0..2)
        .map(|i| clawfleet_protocol::workspace::WorkspaceFile {
            name: clawfleet_protocol::workspace::WorkspaceName::new(format!("notes/{i}.md"))
                .unwrap(),
            content: vec![b'x'; 60 * 1024],
        })
        .collect();
    let rev3 = spec("rev-3", 2, json!({ "label": "filler-2" }));
    let with_workspace = Operation::PrepareRevision(PrepareArgs {
        workspace: Some(clawfleet_protocol::workspace::WorkspaceSetup {
            manifest: files.iter().map(|f| f.meta()).collect(),
            files: Some(files),
        }),
        namespace: ns("ns-filler"),
        agent: agent("filler"),
        revision: rev3,
        egress: None,
    });
    let failure = occ.fails(&host, with_workspace.clone());
    assert_eq!(
        failure.code,
        clawfleet_protocol::failure::FailureCode::NoSpace,
        "{failure:?}"
    );
    assert!(failure.is_retryable(), "{failure:?}");
    // Retryable indeed: once the Agent freed space, the same prepare succeeds, its files
    // whole (nothing partial from the refused attempt is in the way).
    let freed = as_agent(&host, &filler.home, "rm -f fill && sync; echo rc=$?");
    assert!(freed.contains("rc=0"), "{freed}");
    occ.ok(&host, with_workspace);
    let notes = as_agent(
        &host,
        &filler.state,
        "cat workspace/notes/0.md workspace/notes/1.md | wc -c",
    );
    assert_eq!(notes.trim(), (2 * 60 * 1024).to_string(), "{notes}");

    // Deleting the filler removes its subvolumes and its group; nothing is left behind.
    occ.ok(
        &host,
        Operation::DeleteAgent(AgentArgs {
            namespace: ns("ns-filler"),
            agent: agent("filler"),
        }),
    );
    assert!(
        sh(&format!("btrfs subvolume sync {}", mount.display()))
            .status
            .success()
    );
    let groups = qgroups(&mount);
    assert!(
        !groups.contains(&format!("1/{filler_uid} ")),
        "the filler's group is gone: {groups}"
    );
    occ.ok(
        &host,
        Operation::DeleteAgent(AgentArgs {
            namespace: ns("ns-old"),
            agent: agent("old"),
        }),
    );
    let subvolumes = sh(&format!("btrfs subvolume list {}", mount.display()));
    let listed = String::from_utf8_lossy(&subvolumes.stdout);
    assert_eq!(
        listed.lines().count(),
        2,
        "only the other Agent's: {listed}"
    );
    assert!(
        groups.lines().filter(|l| l.starts_with("0/")).count() == 3,
        "level-0 groups: the top level and the other Agent's two: {groups}"
    );
    host.shut_down().unwrap();
    assert!(!mount.exists(), "the harness removed its file system");
}
