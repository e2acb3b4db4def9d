//! Harness settings. Defaults suit CI; every limit can be changed from the environment so a slow
//! machine can wait longer without code changes.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// Where the harness keeps its files and how long it waits.
#[derive(Debug, Clone)]
pub struct HarnessConfig {
    /// Base rootfs builds, the client key, downloaded .debs and the OpenClaw bundle
    /// (`CLAWFLEET_VM_CACHE_DIR`, default `/var/cache/clawfleet-vm-tests`).
    pub cache_dir: PathBuf,
    /// Slot locks and records plus per-host overlay dirs; shared by all test processes of the
    /// machine (`CLAWFLEET_VM_STATE_DIR`, default `/var/lib/clawfleet-vm-tests`).
    pub state_dir: PathBuf,
    /// Debian suite to debootstrap (`CLAWFLEET_VM_SUITE`, default `bookworm`).
    pub suite: String,
    /// Mirror URI; `None` takes it from the machine's apt sources (`CLAWFLEET_VM_MIRROR`).
    pub mirror: Option<String>,
    /// From nspawn start to sshd up and boot finished (`CLAWFLEET_VM_BOOT_TIMEOUT_SECS`, 90).
    pub boot_timeout: Duration,
    /// Graceful poweroff before SIGKILL (`CLAWFLEET_VM_SHUTDOWN_TIMEOUT_SECS`, 15).
    pub shutdown_timeout: Duration,
    /// ssh `ConnectTimeout` (`CLAWFLEET_VM_SSH_CONNECT_TIMEOUT_SECS`, 5).
    pub ssh_connect_timeout: Duration,
    /// How often readiness is polled (`CLAWFLEET_VM_POLL_MS`, 50).
    pub poll_interval: Duration,
    /// Highest host number; 63 fits the 169.254.77.0/24 /30 layout (`CLAWFLEET_VM_MAX_SLOTS`).
    pub max_slots: u32,
    /// Give containers a pure cgroup2 tree like a real Debian 12 host
    /// (`SYSTEMD_NSPAWN_UNIFIED_HIERARCHY`, default on).
    pub unified_cgroup: bool,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        HarnessConfig {
            cache_dir: PathBuf::from("/var/cache/clawfleet-vm-tests"),
            state_dir: PathBuf::from("/var/lib/clawfleet-vm-tests"),
            suite: "bookworm".into(),
            mirror: None,
            boot_timeout: Duration::from_secs(90),
            shutdown_timeout: Duration::from_secs(15),
            ssh_connect_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(50),
            max_slots: 63,
            unified_cgroup: true,
        }
    }
}

fn secs(name: &'static str, value: String) -> Result<Duration> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or(Error::InvalidSetting {
            name,
            value,
            reason: "expected a positive number of seconds",
        })
}

impl HarnessConfig {
    /// Defaults overridden by the `CLAWFLEET_VM_*` environment variables.
    pub fn from_env() -> Result<Self> {
        let mut c = HarnessConfig::default();
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("CLAWFLEET_VM_CACHE_DIR") {
            c.cache_dir = PathBuf::from(v);
        }
        if let Some(v) = var("CLAWFLEET_VM_STATE_DIR") {
            c.state_dir = PathBuf::from(v);
        }
        for (name, dir) in [
            ("CLAWFLEET_VM_CACHE_DIR", &c.cache_dir),
            ("CLAWFLEET_VM_STATE_DIR", &c.state_dir),
        ] {
            if !dir.is_absolute() {
                return Err(Error::InvalidSetting {
                    name,
                    value: dir.display().to_string(),
                    reason: "expected an absolute path",
                });
            }
        }
        if let Some(v) = var("CLAWFLEET_VM_SUITE") {
            c.suite = v;
        }
        c.mirror = var("CLAWFLEET_VM_MIRROR");
        if let Some(v) = var("CLAWFLEET_VM_BOOT_TIMEOUT_SECS") {
            c.boot_timeout = secs("CLAWFLEET_VM_BOOT_TIMEOUT_SECS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_VM_SHUTDOWN_TIMEOUT_SECS") {
            c.shutdown_timeout = secs("CLAWFLEET_VM_SHUTDOWN_TIMEOUT_SECS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_VM_SSH_CONNECT_TIMEOUT_SECS") {
            c.ssh_connect_timeout = secs("CLAWFLEET_VM_SSH_CONNECT_TIMEOUT_SECS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_VM_POLL_MS") {
            let ms = v.trim().parse::<u64>().ok().filter(|m| *m > 0);
            c.poll_interval = Duration::from_millis(ms.ok_or(Error::InvalidSetting {
                name: "CLAWFLEET_VM_POLL_MS",
                value: v,
                reason: "expected a positive number of milliseconds",
            })?);
        }
        if let Some(v) = var("CLAWFLEET_VM_MAX_SLOTS") {
            let n = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=63).contains(n));
            c.max_slots = n.ok_or(Error::InvalidSetting {
                name: "CLAWFLEET_VM_MAX_SLOTS",
                value: v,
                reason: "expected a number from 1 to 63",
            })?;
        }
        if let Some(v) = var("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY") {
            c.unified_cgroup = !matches!(v.trim(), "0" | "no" | "false");
        }
        Ok(c)
    }

    pub(crate) fn slots_dir(&self) -> PathBuf {
        self.state_dir.join("slots")
    }

    pub(crate) fn hosts_dir(&self) -> PathBuf {
        self.state_dir.join("hosts")
    }
}
