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
