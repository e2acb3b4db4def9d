//! hostd's configuration file (`/etc/clawfleet/hostd.toml`).
//!
//! Every key is optional and has the design's default; unknown keys are rejected, and every
//! path, range and limit is validated with an error that names the key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clawfleet_protocol::HostName;
use serde::Deserialize;
use thiserror::Error;

/// Default location of the configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/clawfleet/hostd.toml";

/// Why the configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Syntax { path: String, message: String },
    #[error("{path}: `{key}` {message}")]
    Invalid {
        path: String,
        key: &'static str,
        message: String,
    },
}

/// The file as written; everything optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
struct RawConfig {
    host_name: Option<String>,
    host_key: Option<PathBuf>,
    allowed_signers: Option<PathBuf>,
    state_root: Option<PathBuf>,
    unit_dir: Option<PathBuf>,
    gateway_command: Option<Vec<String>>,
    port_range: Option<[u32; 2]>,
    max_agents: Option<u32>,
    limits: Option<RawLimits>,
    unit: Option<RawUnit>,
    journal: Option<RawJournal>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
struct RawLimits {
    lock_timeout_ms: Option<u64>,
    unit_stop_timeout_ms: Option<u64>,
    unit_start_timeout_ms: Option<u64>,
    readiness_timeout_ms: Option<u64>,
    clock_skew_seconds: Option<u64>,
    max_envelope_lifetime_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
struct RawUnit {
    memory_max: Option<String>,
    cpu_quota: Option<String>,
    tasks_max: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
struct RawJournal {
    max_entries: Option<usize>,
}

/// Limits on waiting, all configurable so tests wait seconds, not minutes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub lock_timeout: Duration,
    pub unit_stop_timeout: Duration,
    pub unit_start_timeout: Duration,
    pub readiness_timeout: Duration,
    pub clock_skew_seconds: u64,
    pub max_envelope_lifetime_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            lock_timeout: Duration::from_secs(30),
            unit_stop_timeout: Duration::from_secs(30),
            unit_start_timeout: Duration::from_secs(30),
            readiness_timeout: Duration::from_secs(120),
            clock_skew_seconds: 60,
            max_envelope_lifetime_seconds: 3600,
        }
    }
}

/// Resource limits written into every Agent unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitResources {
    pub memory_max: Option<String>,
    pub cpu_quota: Option<String>,
    pub tasks_max: Option<u32>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The name envelopes must address; defaults to the system host name.
    pub host_name: HostName,
    pub host_key: PathBuf,
    pub allowed_signers: PathBuf,
    pub state_root: PathBuf,
    pub unit_dir: PathBuf,
    /// The gateway's `ExecStart=` words.
    pub gateway_command: Vec<String>,
    pub port_range: (u16, u16),
    pub max_agents: u32,
    pub limits: Limits,
    pub unit: UnitResources,
    pub journal_max_entries: usize,
}

/// Default gateway command: the OpenClaw gateway as the design's launch contract runs it.
pub const DEFAULT_GATEWAY_COMMAND: [&str; 4] = [
    "/usr/bin/node",
    "/usr/lib/node_modules/openclaw/openclaw.mjs",
    "gateway",
    "run",
];

impl Config {
    /// Reads the file at `path`. A missing file at the default path means "all defaults";
    /// a missing file named explicitly is an error.
    pub fn load(path: &Path, explicit: bool) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => String::new(),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: shown,
                    source,
                });
            }
        };
        Self::parse(&text, &shown, system_host_name)
    }

    /// Parses configuration text; `default_host_name` is asked only when the file sets none.
    pub fn parse(
        text: &str,
        shown: &str,
        default_host_name: impl FnOnce() -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: shown.to_owned(),
            message: e.message().to_owned()
                + &e.span()
                    .map(|s| format!(" (at byte {})", s.start))
                    .unwrap_or_default(),
        })?;
        let invalid = |key: &'static str, message: String| ConfigError::Invalid {
            path: shown.to_owned(),
            key,
            message,
        };
        let host_name_text = match raw.host_name {
            Some(n) => n,
            None => default_host_name().ok_or_else(|| {
                invalid(
                    "host_name",
                    "is not set and the system host name cannot be read".to_owned(),
                )
            })?,
        };
        let host_name = HostName::new(host_name_text.trim())
            .map_err(|e| invalid("host_name", format!("is invalid: {e}")))?;

        let abs = |key: &'static str, p: Option<PathBuf>, default: &str| {
            let p = p.unwrap_or_else(|| PathBuf::from(default));
            check_abs_path(&p).map_err(|m| invalid(key, m))?;
            Ok::<_, ConfigError>(p)
        };
        let host_key = abs(
            "host_key",
            raw.host_key,
            "/etc/ssh/ssh_host_ed25519_key.pub",
        )?;
        let allowed_signers = abs(
            "allowed_signers",
            raw.allowed_signers,
            "/etc/clawfleet/allowed_signers",
        )?;
        let state_root = abs("state_root", raw.state_root, "/var/lib/clawfleet")?;
        for forbidden in ["/tmp", "/var/tmp", "/dev/shm"] {
            if state_root.starts_with(forbidden) {
                return Err(invalid(
                    "state_root",
                    format!(
                        "must not be under {forbidden}: the units' PrivateTmp would hide it from the gateways"
                    ),
                ));
            }
        }
        if state_root == Path::new("/") {
            return Err(invalid("state_root", "must not be /".to_owned()));
        }
        let unit_dir = abs("unit_dir", raw.unit_dir, "/etc/systemd/system")?;

        let gateway_command = raw.gateway_command.unwrap_or_else(|| {
            DEFAULT_GATEWAY_COMMAND
                .iter()
                .map(|s| s.to_string())
                .collect()
        });
        match gateway_command.first() {
            None => return Err(invalid("gateway_command", "must not be empty".to_owned())),
            Some(exe) => check_abs_path(Path::new(exe))
                .map_err(|m| invalid("gateway_command", format!("first word {m}")))?,
        }
        for word in &gateway_command {
            if word.is_empty()
                || word.chars().any(|c| {
                    c.is_whitespace()
                        || c.is_control()
                        || matches!(c, '"' | '\'' | '\\' | '%' | '$' | ';')
                })
            {
                return Err(invalid(
                    "gateway_command",
                    format!(
                        "word {word:?} must be non-empty without whitespace, quotes, '\\\\', '%', '$' or ';'"
                    ),
                ));
            }
        }

        let (start, end) = match raw.port_range {
            None => (18700, 18999),
            Some([s, e]) => {
                if !(1024..=65535).contains(&s) || !(1024..=65535).contains(&e) {
                    return Err(invalid(
                        "port_range",
                        format!("must lie within 1024..=65535, got [{s}, {e}]"),
                    ));
                }
                if s > e {
                    return Err(invalid(
                        "port_range",
                        format!("start {s} must not exceed end {e}"),
                    ));
                }
                (s as u16, e as u16)
            }
        };
        let max_agents = raw.max_agents.unwrap_or(1000);
        if max_agents == 0 {
            return Err(invalid("max_agents", "must be at least 1".to_owned()));
        }

        let l = raw.limits.unwrap_or_default();
        let d = Limits::default();
        let ms = |key: &'static str, v: Option<u64>, default: Duration, max_ms: u64| match v {
            None => Ok(default),
            Some(0) => Err(invalid(key, "must be at least 1 ms".to_owned())),
            Some(v) if v > max_ms => Err(invalid(key, format!("must be at most {max_ms} ms"))),
            Some(v) => Ok(Duration::from_millis(v)),
        };
        let limits = Limits {
            lock_timeout: ms(
                "limits.lock_timeout_ms",
                l.lock_timeout_ms,
                d.lock_timeout,
                600_000,
            )?,
            unit_stop_timeout: ms(
                "limits.unit_stop_timeout_ms",
                l.unit_stop_timeout_ms,
                d.unit_stop_timeout,
                600_000,
            )?,
            unit_start_timeout: ms(
                "limits.unit_start_timeout_ms",
                l.unit_start_timeout_ms,
                d.unit_start_timeout,
                600_000,
            )?,
            readiness_timeout: ms(
                "limits.readiness_timeout_ms",
                l.readiness_timeout_ms,
                d.readiness_timeout,
                3_600_000,
            )?,
            clock_skew_seconds: match l.clock_skew_seconds {
                Some(v) if v > 3600 => {
                    return Err(invalid(
                        "limits.clock_skew_seconds",
                        "must be at most 3600".to_owned(),
                    ));
                }
                v => v.unwrap_or(d.clock_skew_seconds),
            },
            max_envelope_lifetime_seconds: match l.max_envelope_lifetime_seconds {
                Some(v) if v == 0 || v > 86_400 => {
                    return Err(invalid(
                        "limits.max_envelope_lifetime_seconds",
                        "must be between 1 and 86400".to_owned(),
                    ));
                }
                v => v.unwrap_or(d.max_envelope_lifetime_seconds),
            },
        };

        let u = raw.unit.unwrap_or_default();
        if let Some(m) = &u.memory_max
            && !valid_size(m)
        {
            return Err(invalid(
                "unit.memory_max",
                format!("{m:?} is not a size such as 512M, 2G or infinity"),
            ));
        }
        if let Some(c) = &u.cpu_quota
            && !valid_percent(c)
        {
            return Err(invalid(
                "unit.cpu_quota",
                format!("{c:?} is not a percentage such as 50% or 200%"),
            ));
        }
        if u.tasks_max == Some(0) {
            return Err(invalid("unit.tasks_max", "must be at least 1".to_owned()));
        }
        let journal_max_entries = raw.journal.and_then(|j| j.max_entries).unwrap_or(10_000);
        if !(16..=1_000_000).contains(&journal_max_entries) {
            return Err(invalid(
                "journal.max_entries",
                "must be between 16 and 1000000".to_owned(),
            ));
        }

        Ok(Self {
            host_name,
            host_key,
            allowed_signers,
            state_root,
            unit_dir,
            gateway_command,
            port_range: (start, end),
            max_agents,
            limits,
            unit: UnitResources {
                memory_max: u.memory_max,
                cpu_quota: u.cpu_quota,
                tasks_max: u.tasks_max,
            },
            journal_max_entries,
        })
    }
}

/// The system host name from `/etc/hostname`, falling back to the kernel's.
pub fn system_host_name() -> Option<String> {
    ["/etc/hostname", "/proc/sys/kernel/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_owned())
        .find(|s| !s.is_empty())
}

fn check_abs_path(p: &Path) -> Result<(), String> {
    let text = p.to_str().ok_or_else(|| "must be UTF-8".to_owned())?;
    if !text.starts_with('/') {
        return Err(format!("{text:?} must be an absolute path"));
    }
    if text.split('/').any(|c| c == ".." || c == ".") {
        return Err(format!("{text:?} must not contain . or .. components"));
    }
    if !text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+' | '@' | ':'))
    {
        return Err(format!(
            "{text:?} may hold only letters, digits and / . _ - + @ :"
        ));
    }
    Ok(())
}

fn valid_size(s: &str) -> bool {
    if s == "infinity" {
        return true;
    }
    let digits = s.trim_end_matches(['K', 'M', 'G', 'T']);
    !digits.is_empty() && digits.len() + 1 >= s.len() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn valid_percent(s: &str) -> bool {
    s.strip_suffix('%').is_some_and(|d| {
        !d.is_empty() && d.len() <= 6 && d.bytes().all(|b| b.is_ascii_digit()) && d != "0"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "hostd.toml", || Some("h1".to_owned()))
    }

    fn key_of(err: ConfigError) -> String {
        match err {
            ConfigError::Invalid { key, .. } => key.to_owned(),
            ConfigError::Syntax { message, .. } => format!("syntax: {message}"),
            other => format!("{other}"),
        }
    }

    #[test]
    fn empty_file_gives_the_design_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.host_name.as_str(), "h1");
        assert_eq!(c.state_root, PathBuf::from("/var/lib/clawfleet"));
        assert_eq!(c.unit_dir, PathBuf::from("/etc/systemd/system"));
        assert_eq!(c.port_range, (18700, 18999));
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.gateway_command.len(), 4);
    }

    #[test]
    fn a_full_file_parses() {
        let c = parse(
            r#"
host_name = "web-1.example"
state_root = "/srv/clawfleet"
gateway_command = ["/usr/local/bin/clawfleet-test-gateway"]
port_range = [20000, 20010]
max_agents = 5
[limits]
lock_timeout_ms = 2000
readiness_timeout_ms = 5000
[unit]
memory_max = "2G"
cpu_quota = "150%"
tasks_max = 256
[journal]
max_entries = 100
"#,
        )
        .unwrap();
        assert_eq!(c.port_range, (20000, 20010));
        assert_eq!(c.limits.lock_timeout, Duration::from_secs(2));
        assert_eq!(c.unit.memory_max.as_deref(), Some("2G"));
        assert_eq!(c.journal_max_entries, 100);
    }

    #[test]
    fn every_bad_value_names_its_key() {
        let cases = [
            ("surprise = 1", "syntax"),
            ("[limits]\nlock_timeout = 1", "syntax"),
            ("port_range = \"1-2\"", "syntax"),
            ("host_name = \"bad name\"", "host_name"),
            ("state_root = \"relative\"", "state_root"),
            ("state_root = \"/tmp/x\"", "state_root"),
            ("state_root = \"/var/lib/../tmp\"", "state_root"),
            ("state_root = \"/\"", "state_root"),
            ("unit_dir = \"/etc/sys temd\"", "unit_dir"),
            ("gateway_command = []", "gateway_command"),
            ("gateway_command = [\"node\"]", "gateway_command"),
            ("gateway_command = [\"/bin/x\", \"a b\"]", "gateway_command"),
            (
                "gateway_command = [\"/bin/x\", \"$HOME\"]",
                "gateway_command",
            ),
            ("port_range = [80, 90]", "port_range"),
            ("port_range = [20000, 19000]", "port_range"),
            ("port_range = [20000, 70000]", "port_range"),
            ("max_agents = 0", "max_agents"),
            ("[limits]\nlock_timeout_ms = 0", "limits.lock_timeout_ms"),
            (
                "[limits]\nreadiness_timeout_ms = 99999999",
                "limits.readiness_timeout_ms",
            ),
            (
                "[limits]\nclock_skew_seconds = 7200",
                "limits.clock_skew_seconds",
            ),
            ("[unit]\nmemory_max = \"lots\"", "unit.memory_max"),
            ("[unit]\ncpu_quota = \"50\"", "unit.cpu_quota"),
            ("[unit]\ntasks_max = 0", "unit.tasks_max"),
            ("[journal]\nmax_entries = 1", "journal.max_entries"),
        ];
        for (text, key) in cases {
            let got = key_of(parse(text).unwrap_err());
            assert!(got.starts_with(key), "{text:?}: expected {key}, got {got}");
        }
    }

    #[test]
    fn missing_default_file_is_all_defaults_but_an_explicit_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        assert!(Config::load(&missing, false).is_ok() || system_host_name().is_none());
        assert!(matches!(
            Config::load(&missing, true),
            Err(ConfigError::Read { .. })
        ));
    }
}
