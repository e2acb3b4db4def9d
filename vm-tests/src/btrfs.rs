//! A loop-mounted btrfs image with quotas enabled, for a test host's state root
//! ([`HostOptions::btrfs_state_root`](crate::HostOptions::btrfs_state_root)): the file system
//! Fedora and openSUSE install by default, on which hostd limits each Agent with btrfs quota
//! groups. The harness makes it by its own ids (the image file, the loop device `losetup`
//! attached it to, the mount point) and tears down exactly those: unmounted, loop device
//! detached, image deleted, each checked.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::sys;

/// A btrfs image attached to a loop device of its own and mounted, with quotas enabled.
#[derive(Debug)]
pub struct BtrfsImage {
    dir: PathBuf,
    image: PathBuf,
    mount: PathBuf,
    /// `/dev/loopN`, as `losetup --find --show` answered.
    device: Option<String>,
    mounted: bool,
}

impl BtrfsImage {
    /// Makes a `size`-byte btrfs image in a fresh directory under `/var/tmp`, attaches it to a
    /// free loop device, mounts it and runs `btrfs quota enable` on it.
    pub fn create(size: u64) -> Result<BtrfsImage> {
        let dir = PathBuf::from(format!(
            "/var/tmp/clawfleet-vm-btrfs-{}",
            sys::random_hex(8)?
        ));
        std::fs::create_dir(&dir).map_err(|e| Error::io("create", &dir, e))?;
        let mut fs = BtrfsImage {
            image: dir.join("state.img"),
            mount: dir.join("mnt"),
            dir,
            device: None,
            mounted: false,
        };
        std::fs::create_dir(&fs.mount).map_err(|e| Error::io("create", &fs.mount, e))?;
        let file =
            std::fs::File::create(&fs.image).map_err(|e| Error::io("create", &fs.image, e))?;
        file.set_len(size)
            .map_err(|e| Error::io("size", &fs.image, e))?;
        drop(file);
        sys::run(Command::new("mkfs.btrfs").arg("-q").arg(&fs.image))?;
        let out = sys::run(
            Command::new("losetup")
                .args(["--find", "--show"])
                .arg(&fs.image),
        )?;
        let device = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !device.starts_with("/dev/loop") {
            return Err(Error::CommandFailed {
                command: format!("losetup --find --show {}", fs.image.display()),
                status: "unexpected answer".to_owned(),
                stderr: device,
            });
        }
        fs.device = Some(device.clone());
        // No async discard: the kernel would finish discarding the freed space of the image
        // before releasing the device.
        sys::run(
            Command::new("mount")
                .args(["-o", "nodiscard"])
                .arg(&device)
                .arg(&fs.mount),
        )?;
        fs.mounted = true;
        sys::run(
            Command::new("btrfs")
                .args(["quota", "enable"])
                .arg(&fs.mount),
        )?;
        Ok(fs)
    }

    /// Where it is mounted on the runner.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// Unmounts it, detaches its loop device and deletes the image, and checks that each is
    /// gone. Idempotent.
    pub fn teardown(&mut self) -> Result<()> {
        if self.mounted {
            sys::run(Command::new("umount").arg(&self.mount))?;
            self.mounted = false;
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| Error::io("read", "/proc/self/mountinfo", e))?;
        let mount = self.mount.display().to_string();
        if mounts
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(mount.as_str()))
        {
            return Err(Error::CommandFailed {
                command: format!("umount {mount}"),
                status: "still mounted".to_owned(),
                stderr: String::new(),
            });
        }
        if let Some(device) = self.device.take() {
            sys::run(Command::new("losetup").arg("-d").arg(&device))?;
            // Detaching is deferred while the device is busy (the kernel releases the file
            // system after the last mount of it, the host's included, is gone, and btrfs
            // finishes its cleaner's work first): wait until it no longer backs our image.
            let image = self.image.display().to_string();
            let started = std::time::Instant::now();
            let mut reported = false;
            let detached = sys::wait_until(
                std::time::Duration::from_secs(300),
                std::time::Duration::from_millis(100),
                || {
                    if !reported && started.elapsed() > std::time::Duration::from_secs(5) {
                        reported = true;
                        eprintln!(
                            "clawfleet-vm-tests: {device} is still busy; processes whose mount namespace still has it: {:?}",
                            holders(&device)
                        );
                    }
                    sys::output(Command::new("losetup").args([
                        "--noheadings",
                        "-O",
                        "NAME,BACK-FILE",
                    ]))
                    .map(|o| {
                        !String::from_utf8_lossy(&o.stdout).lines().any(|l| {
                            let mut w = l.split_whitespace();
                            w.next() == Some(device.as_str())
                                && w.next().is_some_and(|b| b.starts_with(&image))
                        })
                    })
                    .unwrap_or(false)
                },
            );
            let waited = started.elapsed();
            if waited > std::time::Duration::from_secs(5) {
                eprintln!(
                    "clawfleet-vm-tests: loop device {device} detached after {:.1} s",
                    waited.as_secs_f64()
                );
            }
            if !detached {
                self.device = Some(device.clone());
                return Err(Error::CommandFailed {
                    command: format!("losetup -d {device}"),
                    status: "still attached".to_owned(),
                    stderr: String::new(),
                });
            }
        }
        match std::fs::remove_file(&self.image) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", &self.image, e)),
        }
        for d in [&self.mount, &self.dir] {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove", d, e)),
            }
        }
        if self.dir.exists() {
            return Err(Error::io(
                "remove",
                &self.dir,
                std::io::Error::other("still there"),
            ));
        }
        Ok(())
    }
}

/// The processes (pid, name) in whose mount namespace `device` is still mounted: what keeps
/// the loop device busy after the runner's own mount is gone.
fn holders(device: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let mounted = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
            .map(|m| {
                m.lines().any(|l| {
                    l.split(" - ").nth(1).and_then(|t| t.split(' ').nth(1)) == Some(device)
                })
            })
            .unwrap_or(false);
        if mounted {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_owned()));
        }
    }
    found
}

impl Drop for BtrfsImage {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("clawfleet-vm-tests: cannot tear down the btrfs state root: {e}");
        }
    }
}
