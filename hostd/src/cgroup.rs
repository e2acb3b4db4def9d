//! Where a unit's processes are listed, on every cgroup layout systemd runs on: the unified
//! hierarchy (cgroup v2) at `/sys/fs/cgroup`, a hybrid host's at `/sys/fs/cgroup/unified`,
//! or a legacy (v1) host's named `systemd` hierarchy. Each of them holds every process of
//! the unit in the unit's `ControlGroup`, which is what a relaunch (`real.rs`) and the search
//! for an Agent's network namespace (`netns.rs`) read.

use std::path::{Path, PathBuf};

/// Where the kernel's cgroup file systems are mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

/// The hierarchies that list every process of a unit, in the order they are tried: the
/// unified one (v2), the unified one of a hybrid host, systemd's own (v1).
const HIERARCHIES: [&str; 3] = ["", "unified", "systemd"];

/// The `cgroup.procs` file of the control group `control_group` (systemd's `ControlGroup`,
/// such as `/system.slice/x.service`) under `root`: the first hierarchy that has it; `None`
/// when none does (the unit runs no process, or it is not a cgroup path).
pub fn procs_path(root: &Path, control_group: &str) -> Option<PathBuf> {
    let relative = control_group.trim_start_matches('/');
    if relative.is_empty()
        || relative
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return None;
    }
    HIERARCHIES
        .iter()
        .map(|h| root.join(h).join(relative).join("cgroup.procs"))
        .find(|p| p.is_file())
}

/// The control group of a system service, as systemd names it.
pub fn of_service(unit: &str) -> String {
    format!("/system.slice/{unit}")
}

/// A process's control group from its `/proc/<pid>/cgroup`: the unified hierarchy's (`0::`)
/// or, on a legacy host (whose `0::` line, if any, names the root), systemd's named one's;
/// `None` when both name the root group.
pub fn own_group(proc_cgroup: &str) -> Option<&str> {
    let not_root = |g: &&str| !g.is_empty() && *g != "/";
    let lines = || proc_cgroup.lines();
    lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(not_root)
        .or_else(|| {
            lines()
                .find_map(|l| l.split_once(":name=systemd:").map(|(_, g)| g))
                .filter(not_root)
        })
}

/// The pids listed in a `cgroup.procs` file.
pub fn read_pids(procs: &Path) -> std::io::Result<Vec<u32>> {
    Ok(std::fs::read_to_string(procs)?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dirs: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for d in dirs {
            let dir = root.path().join(d);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.procs"), "12\n34\n").unwrap();
        }
        root
    }

    #[test]
    fn every_layout_systemd_runs_on_lists_the_units_processes() {
        let cg = of_service("clawfleet-agent-x.service");
        for (dirs, want) in [
            // cgroup v2.
            (
                vec!["system.slice/clawfleet-agent-x.service"],
                "system.slice/clawfleet-agent-x.service",
            ),
            // Hybrid: v1 controllers, the unified hierarchy beside them, systemd's too.
            (
                vec![
                    "unified/system.slice/clawfleet-agent-x.service",
                    "systemd/system.slice/clawfleet-agent-x.service",
                ],
                "unified/system.slice/clawfleet-agent-x.service",
            ),
            // Legacy v1: systemd's named hierarchy only.
            (
                vec!["systemd/system.slice/clawfleet-agent-x.service"],
                "systemd/system.slice/clawfleet-agent-x.service",
            ),
        ] {
            let root = layout(&dirs);
            let found = procs_path(root.path(), &cg).unwrap();
            assert_eq!(found, root.path().join(want).join("cgroup.procs"));
            assert_eq!(read_pids(&found).unwrap(), [12, 34]);
        }
        // A process's own group, on each layout (hybrid: the unified line is empty of
        // controllers but names the group too).
        assert_eq!(
            own_group("0::/system.slice/a.service\n"),
            Some("/system.slice/a.service")
        );
        assert_eq!(
            own_group(
                "12:memory:/system.slice/a.service\n1:name=systemd:/system.slice/a.service\n"
            ),
            Some("/system.slice/a.service")
        );
        assert_eq!(
            own_group("1:name=systemd:/system.slice/a.service\n0::/system.slice/a.service\n"),
            Some("/system.slice/a.service")
        );
        assert_eq!(
            own_group("1:name=systemd:/system.slice/a.service\n0::/\n"),
            Some("/system.slice/a.service")
        );
        assert_eq!(own_group("1:name=systemd:/\n0::/\n"), None);
        assert_eq!(own_group("0::/\n"), None);
        assert_eq!(own_group(""), None);
        let root = layout(&["systemd/system.slice/other.service"]);
        assert_eq!(procs_path(root.path(), &cg), None);
        for bad in ["", "/", "/system.slice/../x", "/a//b", "/./x"] {
            assert_eq!(procs_path(root.path(), bad), None, "{bad:?}");
        }
    }
}
