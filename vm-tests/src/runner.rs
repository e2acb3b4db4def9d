//! The runner packages: the Debian packages a machine needs to boot test hosts, read from the
//! one list in `vm-tests/RUNNER-PACKAGES` (also read by `.ci/run`), and which of them are
//! missing here.

use std::process::Command;

/// `vm-tests/RUNNER-PACKAGES` as built in: one package a line, `#` comments and blank lines
/// ignored.
const RUNNER_PACKAGES: &str = include_str!("../RUNNER-PACKAGES");

/// The package names of a RUNNER-PACKAGES text, in order.
pub fn parse_runner_packages(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// The runner packages, in the file's order.
pub fn runner_packages() -> Vec<&'static str> {
    parse_runner_packages(RUNNER_PACKAGES)
}

/// The packages of `wanted` that `installed` says are not installed.
pub fn missing_packages<'a>(wanted: &[&'a str], installed: impl Fn(&str) -> bool) -> Vec<&'a str> {
    wanted.iter().copied().filter(|p| !installed(p)).collect()
}

/// Whether dpkg has `package` installed (`dpkg-query` says "install ok installed"); `None`
/// when there is no dpkg here (not a Debian-family machine).
pub fn dpkg_installed(package: &str) -> Option<bool> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .ok()?;
    Some(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed",
    )
}

/// The runner packages dpkg does not have installed; `None` when there is no dpkg here.
pub fn missing_runner_packages() -> Option<Vec<&'static str>> {
    dpkg_installed("dpkg")?;
    Some(missing_packages(&runner_packages(), |p| {
        dpkg_installed(p).unwrap_or(false)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_blank_lines_are_not_packages() {
        assert_eq!(
            parse_runner_packages("# tools\n\ndebootstrap\n  iproute2  \n#x\n"),
            ["debootstrap", "iproute2"]
        );
    }

    #[test]
    fn every_tool_the_harness_calls_comes_from_a_listed_package() {
        let listed = runner_packages();
        for (tool, package) in crate::TOOLS {
            assert!(
                listed.contains(package),
                "{tool} comes from {package}, which vm-tests/RUNNER-PACKAGES does not list"
            );
        }
    }

    #[test]
    fn missing_is_what_is_not_installed_in_list_order() {
        let wanted = ["a", "b", "c"];
        assert_eq!(missing_packages(&wanted, |p| p == "b"), ["a", "c"]);
        assert!(missing_packages(&wanted, |_| true).is_empty());
    }
}
