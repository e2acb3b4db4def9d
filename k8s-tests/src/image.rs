//! OCI images built offline from a directory tree: one uncompressed layer (made with GNU tar,
//! reproducible: sorted names, mtime 0, owner 0), an image config, a manifest and an OCI
//! image-layout archive whose index names the image `<repo>@sha256:<manifest digest>`, the
//! by-digest reference the Kubernetes backend requires. `ctr images import` takes the archive
//! ([`crate::Node::import_image`]).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::sys;

/// An image archive written by [`build_archive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// The OCI image-layout tar to import.
    pub archive: PathBuf,
    /// `sha256:<hex>` of the manifest.
    pub manifest_digest: String,
    /// `<repo>@sha256:<hex>` (or `<repo>:<tag>`): the name the image gets in containerd, and
    /// what a Pod uses.
    pub reference: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io("read", path, e))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Ok((hex(&h.finalize()), size))
}

fn tar(args: &[&std::ffi::OsStr], what: &str) -> Result<()> {
    let out = Command::new("tar")
        .args(args)
        .output()
        .map_err(|e| Error::Image {
            reason: format!("cannot run tar for {what}: {e}"),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Image {
            reason: format!(
                "tar for {what} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

fn put_blob(blobs: &Path, bytes: &[u8]) -> Result<(String, u64)> {
    let digest = hex(&Sha256::digest(bytes));
    sys::write_file(&blobs.join(&digest), bytes, 0o644)?;
    Ok((digest, bytes.len() as u64))
}

/// Builds `<work>/image.tar` from the tree at `rootfs` with the image config `config` (the
/// `config` object of an OCI image config: `Entrypoint`, `Env`, `User`, `WorkingDir`). `repo`
/// is the reference's repository, e.g. `clawfleet.test/test-gateway`; the image is named
/// `<repo>@sha256:<manifest digest>`, or `<repo>:<tag>` with a tag (the node's sandbox image is
/// configured by tag). `work` is emptied first.
pub fn build_archive(
    rootfs: &Path,
    config: Value,
    repo: &str,
    tag: Option<&str>,
    work: &Path,
) -> Result<BuiltImage> {
    if work.exists() {
        fs::remove_dir_all(work).map_err(|e| Error::io("remove", work, e))?;
    }
    let layout = work.join("oci");
    let blobs = layout.join("blobs").join("sha256");
    sys::create_dir_all(&blobs)?;
    let layer = work.join("layer.tar");
    tar(
        &[
            "--sort=name".as_ref(),
            "--mtime=@0".as_ref(),
            "--owner=0".as_ref(),
            "--group=0".as_ref(),
            "--numeric-owner".as_ref(),
            "--format=posix".as_ref(),
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime".as_ref(),
            "-C".as_ref(),
            rootfs.as_os_str(),
            "-cf".as_ref(),
            layer.as_os_str(),
            ".".as_ref(),
        ],
        "the layer",
    )?;
    let (layer_digest, layer_size) = sha256_file(&layer)?;
    let layer_blob = blobs.join(&layer_digest);
    fs::rename(&layer, &layer_blob).map_err(|e| Error::io("rename", &layer_blob, e))?;
    let image_config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
        "history": [{ "created_by": "clawfleet-k8s-tests image::build_archive" }],
    });
    let (config_digest, config_size) = put_blob(&blobs, image_config.to_string().as_bytes())?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) = put_blob(&blobs, manifest.to_string().as_bytes())?;
    let reference = match tag {
        Some(t) => format!("{repo}:{t}"),
        None => format!("{repo}@sha256:{manifest_digest}"),
    };
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            // containerd's importer names the image after this annotation.
            "annotations": { "io.containerd.image.name": reference },
        }],
    });
    sys::write_file(
        &layout.join("index.json"),
        index.to_string().as_bytes(),
        0o644,
    )?;
    sys::write_file(
        &layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
    )?;
    let archive = work.join("image.tar");
    tar(
        &[
            "-C".as_ref(),
            layout.as_os_str(),
            "-cf".as_ref(),
            archive.as_os_str(),
            ".".as_ref(),
        ],
        "the archive",
    )?;
    fs::remove_dir_all(&layout).map_err(|e| Error::io("remove", &layout, e))?;
    Ok(BuiltImage {
        archive,
        manifest_digest: format!("sha256:{manifest_digest}"),
        reference,
    })
}

/// A minimal root file system under `root`: `/bin` (busybox's applets as symlinks when
/// `busybox` is given, so `/bin/sh` works for init containers), `/etc/passwd` and
/// `/etc/group` with root and `uid:gid` 1000 (`openclaw`), an empty `/tmp` (1777), and each
/// `(path in the image, file on this machine)` copied with mode 0755.
pub fn minimal_rootfs(root: &Path, busybox: Option<&Path>, files: &[(&str, &Path)]) -> Result<()> {
    if root.exists() {
        fs::remove_dir_all(root).map_err(|e| Error::io("remove", root, e))?;
    }
    for d in [
        "bin",
        "etc",
        "tmp",
        "proc",
        "sys",
        "dev",
        "var/lib/openclaw",
    ] {
        sys::create_dir_all(&root.join(d))?;
    }
    use std::os::unix::fs::PermissionsExt;
    let tmp = root.join("tmp");
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777))
        .map_err(|e| Error::io("chmod", &tmp, e))?;
    sys::write_file(
        &root.join("etc/passwd"),
        b"root:x:0:0:root:/root:/bin/sh\nopenclaw:x:1000:1000:openclaw:/var/lib/openclaw:/bin/sh\n",
        0o644,
    )?;
    sys::write_file(
        &root.join("etc/group"),
        b"root:x:0:\nopenclaw:x:1000:\n",
        0o644,
    )?;
    if let Some(bb) = busybox {
        copy_exec(bb, &root.join("bin/busybox"))?;
        for applet in BUSYBOX_APPLETS {
            let link = root.join("bin").join(applet);
            std::os::unix::fs::symlink("busybox", &link)
                .map_err(|e| Error::io("symlink", &link, e))?;
        }
    }
    for (inside, from) in files {
        let to = root.join(inside.trim_start_matches('/'));
        if let Some(parent) = to.parent() {
            sys::create_dir_all(parent)?;
        }
        copy_exec(from, &to)?;
    }
    Ok(())
}

/// The busybox applets the init containers' scripts use (`/bin/sh -c`), and a few for
/// looking around in a Pod.
const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "cat", "chmod", "cmp", "cp", "id", "ls", "mkdir", "mv", "rm", "sleep", "test", "[",
    "printf", "echo", "env", "head", "wc", "touch", "wget",
];

fn copy_exec(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to).map_err(|e| Error::io("copy", from, e))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(to, fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io("chmod", to, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names_the_image_by_its_manifest_digest() {
        let dir = std::env::temp_dir().join(format!("k8s-tests-image-{}", std::process::id()));
        let root = dir.join("rootfs");
        let bin = dir.join("hello");
        sys::create_dir_all(&dir).unwrap();
        sys::write_file(&bin, b"#!/bin/sh\necho hi\n", 0o755).unwrap();
        minimal_rootfs(&root, None, &[("/hello", &bin)]).unwrap();
        let a = build_archive(
            &root,
            json!({"Entrypoint": ["/hello"]}),
            "clawfleet.test/t",
            None,
            &dir.join("w1"),
        )
        .unwrap();
        let b = build_archive(
            &root,
            json!({"Entrypoint": ["/hello"]}),
            "clawfleet.test/t",
            None,
            &dir.join("w2"),
        )
        .unwrap();
        assert_eq!(
            a.manifest_digest, b.manifest_digest,
            "the build is reproducible"
        );
        assert_eq!(
            a.reference,
            format!("clawfleet.test/t@{}", a.manifest_digest)
        );
        let c = build_archive(
            &root,
            json!({"Entrypoint": ["/other"]}),
            "clawfleet.test/t",
            None,
            &dir.join("w3"),
        )
        .unwrap();
        assert_ne!(a.manifest_digest, c.manifest_digest);
        let listing = Command::new("tar")
            .arg("-tf")
            .arg(&a.archive)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&listing.stdout);
        assert!(listing.contains("index.json"), "{listing}");
        assert!(
            listing.contains(&format!("blobs/sha256/{}", &a.manifest_digest[7..])),
            "{listing}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
