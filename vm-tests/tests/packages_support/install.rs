//! Installing hostd from the package `packaging/build.sh` built, for any crate's real-host
//! tests. Only std and the harness: include it with
//! `#[path = "<relative path>/vm-tests/tests/packages_support/install.rs"] mod install;`
//! (relative to the including file's directory), then
//!
//! ```ignore
//! let Some(deb) = install::hostd_deb_or_skip() else { return }; // SKIP, or panic under CI=true
//! install::install_hostd_deb(&host, &deb).unwrap();              // dpkg -i, /usr/sbin/hostd
//! ```
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use clawfleet_vm_tests::TestHost;

/// Where `packaging/build.sh` writes the packages: `CLAWFLEET_PACKAGES_DIR`, else
/// `$CARGO_TARGET_DIR/packages`, else `<workspace>/target/packages`.
pub fn packages_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CLAWFLEET_PACKAGES_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        let d = PathBuf::from(d);
        let d = if d.is_absolute() {
            d
        } else {
            workspace_dir().join(d)
        };
        return d.join("packages");
    }
    workspace_dir().join("target").join("packages")
}

pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The one file in `dir` whose name starts with `prefix` and ends with `suffix`.
pub fn find_one(dir: &Path, prefix: &str, suffix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix))
        })
        .collect();
    found.sort();
    assert!(
        found.len() <= 1,
        "more than one {prefix}*{suffix} in {}: {found:?}; rebuild with packaging/build.sh",
        dir.display()
    );
    found.pop()
}

/// Says why a prerequisite is missing: `SKIP: ...` on stderr (the caller returns), or a panic
/// under `CI=true`, where a missing prerequisite must fail the run.
pub fn missing(what: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and {what}");
    }
    eprintln!("SKIP: {what}");
}

/// The hostd .deb, or `None` after `SKIP: ...` (a panic under `CI=true`).
pub fn hostd_deb_or_skip() -> Option<PathBuf> {
    let dir = packages_dir();
    let deb = find_one(&dir, "clawfleet-hostd_", ".deb");
    if deb.is_none() {
        missing(&format!(
            "no clawfleet-hostd_*.deb in {} (run packaging/build.sh; .ci/run does)",
            dir.display()
        ));
    }
    deb
}

/// Installs hostd on `host` from its .deb with `dpkg -i`, as an operator does, and checks
/// that the binary answers at `/usr/sbin/hostd`. The package ships a commented
/// `/etc/clawfleet/hostd.toml` (all defaults); tests overwrite it as operators edit it.
pub fn install_hostd_deb(host: &TestHost, deb: &Path) -> Result<(), String> {
    host.install_deb(deb)
        .map_err(|e| format!("dpkg -i {}: {e}", deb.display()))?;
    host.run_ok("/usr/sbin/hostd --version")
        .map(|_| ())
        .map_err(|e| format!("hostd from {} does not run: {e}", deb.display()))
}
