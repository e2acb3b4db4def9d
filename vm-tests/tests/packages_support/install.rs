//! Installing hostd from the package `packaging/build.sh` built, for any crate's real-host
//! tests. Only std and the harness: include it with
//! `#[path = "<relative path>/vm-tests/tests/packages_support/install.rs"] mod install;`
//! (relative to the including file's directory), then
//!
//! ```ignore
//! let Some(deb) = install::hostd_deb_or_skip() else { return }; // SKIP, or panic under CI=true
//! install::install_hostd_deb(&host, &deb).unwrap();              // dpkg -i, /usr/sbin/hostd
//! ```
//!
//! or, replacing `host.install_hostd(binary)` in suites that test hostd itself:
//!
//! ```ignore
//! install::install_hostd_package_or_binary(&host, Path::new(env!("CARGO_BIN_EXE_hostd"))).unwrap();
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

/// The workspace root: the parent of this package's directory, as cargo gives it at run time
/// (a build reused from another checkout sharing the target directory keeps that checkout's
/// compile-time path), else at build time.
pub fn workspace_dir() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().unwrap_or(Path::new("/")).to_path_buf()
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

/// Newest modification time of the files a hostd package is built from.
fn newest_source(dir: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::symlink_metadata(dir).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| newest_source(&e.path()))
        .max()
}

/// Whether `deb` is older than hostd's sources (hostd/, protocol/, packaging/hostd/,
/// Cargo.lock): then it does not hold the code under test.
pub fn hostd_deb_is_stale(deb: &Path) -> bool {
    let Ok(built) = std::fs::metadata(deb).and_then(|m| m.modified()) else {
        return true;
    };
    let ws = workspace_dir();
    [
        "hostd/src",
        "hostd/Cargo.toml",
        "protocol/src",
        "packaging/hostd",
        "Cargo.lock",
    ]
    .iter()
    .filter_map(|p| newest_source(&ws.join(p)))
    .any(|t| t > built)
}

/// The switch for real-host tests that used `host.install_hostd(binary)`: installs hostd from
/// its .deb (`dpkg -i`, as operators do) when `packaging/build.sh` built one that is not older
/// than the hostd sources. Without a current .deb it fails under `CI=true` (where .ci/run
/// builds the packages first), and elsewhere copies `binary` with a NOTE on stderr, so a local
/// edit-and-test loop keeps working without rebuilding the package.
pub fn install_hostd_package_or_binary(host: &TestHost, binary: &Path) -> Result<(), String> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let dir = packages_dir();
    let why = match find_one(&dir, "clawfleet-hostd_", ".deb") {
        Some(deb) if !hostd_deb_is_stale(&deb) => return install_hostd_deb(host, &deb),
        Some(deb) => format!("{} is older than the hostd sources", deb.display()),
        None => format!("no clawfleet-hostd_*.deb in {}", dir.display()),
    };
    if ci {
        return Err(format!(
            "CI=true and {why} (run packaging/build.sh; .ci/run does)"
        ));
    }
    eprintln!(
        "NOTE: {why}; installing {} instead (packaging/build.sh makes the package)",
        binary.display()
    );
    host.install_hostd(binary).map_err(|e| e.to_string())
}
