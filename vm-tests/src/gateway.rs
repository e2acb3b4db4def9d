//! Locating (building if needed) workspace binaries, the test gateway first of all, from any
//! crate's tests. Cargo cannot hand one package's binary to another package's tests, so the
//! harness asks cargo to build it and reads the artifact path from cargo's JSON messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::sys;

/// Where [`TestHost::install_test_gateway`](crate::TestHost::install_test_gateway) puts it.
pub const TEST_GATEWAY_REMOTE_PATH: &str = "/usr/local/bin/clawfleet-test-gateway";

const PACKAGE: &str = "clawfleet-test-gateway";

static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Path of the test gateway binary: `$CLAWFLEET_TEST_GATEWAY_BIN` if set, else built with
/// `cargo build -p clawfleet-test-gateway` (same profile as the running test) once per process.
pub fn test_gateway_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CLAWFLEET_TEST_GATEWAY_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::Build {
                target: PACKAGE.to_owned(),
                detail: format!("CLAWFLEET_TEST_GATEWAY_BIN={} is not a file", p.display()),
            })
        };
    }
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = built.as_ref() {
        return Ok(p.clone());
    }
    let exe = cargo_build(PACKAGE, Artifact::Bin, PACKAGE)?;
    *built = Some(exe.clone());
    Ok(exe)
}

/// What kind of cargo target to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Artifact {
    /// A `[[bin]]` target (`--bin`).
    Bin,
    /// An example (`--example`).
    Example,
}

/// A directory inside this workspace for cargo to run in: the package whose tests are running
/// (cargo sets `CARGO_MANIFEST_DIR` for them at run time), else this crate's directory at build
/// time. The run-time value comes first because a build of this crate can be
/// reused from another checkout that shares the target directory, and that checkout may be gone.
fn workspace_member_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|d| d.join("Cargo.toml").is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Builds one target of a workspace package with the cargo running this process, in the same
/// profile (release when the running executable is a release build), and returns the
/// executable's path from cargo's JSON messages. Where the build goes: see
/// [`build_target_dir`].
pub fn cargo_build(package: &str, artifact: Artifact, name: &str) -> Result<PathBuf> {
    let failed = |detail: String| Error::Build {
        target: format!("{package} {name}"),
        detail,
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    let kind = match artifact {
        Artifact::Bin => "--bin",
        Artifact::Example => "--example",
    };
    cmd.args(["build", "--quiet", "-p", package, kind, name])
        .arg("--message-format=json-render-diagnostics")
        .current_dir(workspace_member_dir())
        .stderr(Stdio::piped());
    let release = std::env::current_exe()
        .ok()
        .is_some_and(|p| p.components().any(|c| c.as_os_str() == "release"));
    if release {
        cmd.arg("--release");
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| build_target_dir(&exe))
    {
        cmd.arg("--target-dir").arg(dir);
    }
    let out = sys::run(&mut cmd).map_err(|e| failed(e.to_string()))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == name)
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| failed("cargo reported no executable".to_owned()))
}

/// The target directory for [`cargo_build`], from the running executable's path.
///
/// A test (`<target>/<profile>/deps/<test>`) builds into `<target>/nested`, never into the
/// directory itself: there, `target/debug/hostd` is the binary hostd's own tests run (built
/// with its test-only fault hooks), and a build of the package alone (without them) would
/// replace it under the tests running in parallel. A binary such as the demo
/// (`<target>/<profile>/<bin>`) builds into its own target directory, so `cargo run --release
/// -p clawfleet-demo` reuses the release binaries `packaging/build.sh` builds there (and the
/// other way round) instead of building them all again elsewhere.
fn build_target_dir(exe: &Path) -> Option<PathBuf> {
    let profile_dir = exe.parent()?;
    if profile_dir.file_name()? == "deps" {
        Some(profile_dir.parent()?.parent()?.join("nested"))
    } else {
        profile_dir.parent().map(Path::to_path_buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_builds_into_nested_and_a_binary_into_its_own_target_dir() {
        assert_eq!(
            build_target_dir(Path::new("/w/target/debug/deps/real_system-0123abcd")),
            Some(PathBuf::from("/w/target/nested"))
        );
        assert_eq!(
            build_target_dir(Path::new("/w/target/release/clawfleet-demo")),
            Some(PathBuf::from("/w/target"))
        );
    }
}
