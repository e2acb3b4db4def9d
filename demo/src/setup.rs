//! What the demo needs before it can boot a test host: root, and the runner packages of
//! `vm-tests/RUNNER-PACKAGES` (the one list `.ci/run` installs too). As root it installs the
//! missing ones with apt, as `.ci/run` does; not as root it says exactly what to run.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// What to do about the machine before the demo starts.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Root, and every runner package is installed.
    Ready,
    /// Root: install these packages with apt first.
    Install(Vec<String>),
    /// Not root: the demo cannot run; the message says what to run instead.
    NeedRoot(String),
}

/// The decision, from whether we are root and which runner packages are missing.
pub fn plan(root: bool, missing: &[&str]) -> Plan {
    if !root {
        return Plan::NeedRoot(not_root_message(missing));
    }
    if missing.is_empty() {
        Plan::Ready
    } else {
        Plan::Install(missing.iter().map(|p| (*p).to_owned()).collect())
    }
}

/// The apt-get command line that installs `packages` (as `.ci/run` runs it).
pub fn apt_install_command(packages: &[&str]) -> String {
    format!(
        "apt-get install -y --no-install-recommends {}",
        packages.join(" ")
    )
}

fn not_root_message(missing: &[&str]) -> String {
    let mut m = String::from(
        "the demo boots a real Linux test host (systemd-nspawn in a network namespace, overlay \
         mounts) and needs root. Run, from the checkout:\n",
    );
    if !missing.is_empty() {
        m.push_str(&format!(
            "  sudo apt-get update && sudo {}\n",
            apt_install_command(missing)
        ));
    }
    m.push_str("  sudo -E env \"PATH=$PATH\" cargo run --release -p clawfleet-demo");
    m
}

/// Installs `packages` with apt-get (non-interactive), showing apt's errors.
pub fn apt_install(packages: &[String]) -> Result<()> {
    let run = |args: &[&str]| -> Result<()> {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .with_context(|| format!("cannot run apt-get {}", args.join(" ")))?;
        if !status.success() {
            bail!("apt-get {} failed ({status})", args.join(" "));
        }
        Ok(())
    };
    run(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(packages.iter().map(String::as_str));
    run(&args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_with_everything_installed_is_ready() {
        assert_eq!(plan(true, &[]), Plan::Ready);
    }

    #[test]
    fn root_installs_exactly_the_missing_packages() {
        assert_eq!(
            plan(true, &["systemd-container", "debootstrap"]),
            Plan::Install(vec!["systemd-container".into(), "debootstrap".into()])
        );
    }

    #[test]
    fn not_root_names_the_commands_to_run() {
        let Plan::NeedRoot(m) = plan(false, &["systemd-container"]) else {
            panic!("not root must not be Ready or Install");
        };
        assert!(
            m.contains("sudo apt-get install -y --no-install-recommends systemd-container\n"),
            "{m}"
        );
        assert!(m.contains("cargo run --release -p clawfleet-demo"), "{m}");
        let Plan::NeedRoot(m) = plan(false, &[]) else {
            panic!("not root must not be Ready");
        };
        assert!(!m.contains("apt-get"), "{m}");
    }

    #[test]
    fn the_fresh_machine_case_installs_the_harness_tools_from_the_shared_list() {
        // A fresh Debian 12 machine has none of the runner packages: the demo installs the whole
        // of vm-tests/RUNNER-PACKAGES, which holds what the harness calls (systemd-nspawn,
        // debootstrap, ip, ssh).
        let all = clawfleet_vm_tests::runner_packages();
        let missing = clawfleet_vm_tests::missing_packages(&all, |_| false);
        let Plan::Install(p) = plan(true, &missing) else {
            panic!("root with missing packages must install them");
        };
        for needed in [
            "systemd-container",
            "debootstrap",
            "iproute2",
            "openssh-client",
        ] {
            assert!(p.iter().any(|x| x == needed), "{needed} in {p:?}");
        }
    }
}
