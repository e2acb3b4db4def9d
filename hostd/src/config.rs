//! hostd's configuration file (`/etc/clawfleet/hostd.toml`).
//!
//! Every key is optional and has the design's default; unknown keys are rejected, and every
//! path, range and limit is validated with an error that names the key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clawfleet_protocol::HostName;
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
        key: String,
        message: String,
    },
}

/// The file as written; everything optional. Read by hand from a [`toml::Table`] rather than
/// derived, so that every wrong type, fraction, negative or out-of-range number and unknown
/// key is refused with an error naming its key (a derived reader reports only a byte offset).
#[derive(Debug, Default)]
struct RawConfig {
    host_name: Option<String>,
    host_key: Option<PathBuf>,
    allowed_signers: Option<PathBuf>,
    state_root: Option<PathBuf>,
    unit_dir: Option<PathBuf>,
    hooks_dir: Option<PathBuf>,
    gateway_command: Option<Vec<String>>,
    port_range: Option<(u16, u16)>,
    max_agents: Option<u32>,
    protocol_versions: Option<Vec<u64>>,
    limits: RawLimits,
    unit: RawUnit,
    accounts: RawAccounts,
    journal: RawJournal,
    quota: RawQuota,
    network: RawNetwork,
}

#[derive(Debug, Default)]
struct RawNetwork {
    hold_ms: Option<u64>,
    egress_ports: Option<Vec<u64>>,
    egress_allow: Option<Vec<String>>,
    dns: Option<Vec<String>>,
}

#[derive(Debug, Default)]
struct RawQuota {
    max_bytes: Option<u64>,
    max_inodes: Option<u64>,
}

#[derive(Debug, Default)]
struct RawLimits {
    lock_timeout_ms: Option<u64>,
    unit_stop_timeout_ms: Option<u64>,
    unit_start_timeout_ms: Option<u64>,
    readiness_timeout_ms: Option<u64>,
    hook_timeout_ms: Option<u64>,
    clock_skew_seconds: Option<u64>,
    max_envelope_lifetime_seconds: Option<u64>,
    max_sessions: Option<u64>,
    session_idle_timeout_seconds: Option<u64>,
    max_relay_streams: Option<u64>,
    relay_idle_timeout_seconds: Option<u64>,
}

#[derive(Debug, Default)]
struct RawUnit {
    memory_max: Option<String>,
    cpu_quota: Option<String>,
    tasks_max: Option<u32>,
    log_rate_limit_interval_seconds: Option<u64>,
    log_rate_limit_burst: Option<u32>,
}

#[derive(Debug, Default)]
struct RawAccounts {
    uid_range: Option<(u32, u32)>,
}

#[derive(Debug, Default)]
struct RawJournal {
    max_entries: Option<usize>,
}

/// Takes typed values out of one table of the file, naming each key in its errors.
struct TableReader<'a> {
    shown: &'a str,
    /// `""` for the top level, `"limits."` for `[limits]`.
    prefix: &'static str,
    table: toml::Table,
}

impl<'a> TableReader<'a> {
    fn invalid(&self, key: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.shown.to_owned(),
            key: format!("{}{key}", self.prefix),
            message,
        }
    }

    fn string(&mut self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(other) => {
                Err(self.invalid(key, format!("must be a string, got {}", describe(&other))))
            }
        }
    }

    fn path(&mut self, key: &str) -> Result<Option<PathBuf>, ConfigError> {
        Ok(self.string(key)?.map(PathBuf::from))
    }

    /// An array whose every element `each` accepts; refusals name the key and the element.
    fn array<T>(
        &mut self,
        key: &str,
        of: &str,
        each: impl Fn(&toml::Value) -> Result<T, String>,
    ) -> Result<Option<Vec<T>>, ConfigError> {
        let items = match self.table.remove(key) {
            None => return Ok(None),
            Some(toml::Value::Array(items)) => items,
            Some(other) => {
                return Err(self.invalid(
                    key,
                    format!("must be an array of {of}, got {}", describe(&other)),
                ));
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            out.push(each(item).map_err(|m| self.invalid(key, format!("element {} {m}", i + 1)))?);
        }
        Ok(Some(out))
    }

    fn strings(&mut self, key: &str) -> Result<Option<Vec<String>>, ConfigError> {
        self.array(key, "strings", |item| match item {
            toml::Value::String(s) => Ok(s.clone()),
            other => Err(format!("must be a string, got {}", describe(other))),
        })
    }

    /// An array of whole numbers, each within `min..=max`.
    fn integers(&mut self, key: &str, min: u64, max: u64) -> Result<Option<Vec<u64>>, ConfigError> {
        self.array(key, "numbers", |item| whole(item, min, max))
    }

    /// A whole number within `min..=max`.
    fn integer(&mut self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(v) => whole(&v, min, max)
                .map(Some)
                .map_err(|m| self.invalid(key, m)),
        }
    }

    fn port_range(&mut self, key: &str) -> Result<Option<(u16, u16)>, ConfigError> {
        let range = self.range(key, "port numbers", 1024, 65535)?;
        Ok(range.map(|(s, e)| (s as u16, e as u16)))
    }

    /// `[start, end]` of Agent uids: above every range the distribution and systemd hand
    /// out themselves (see [`UID_FLOOR`]), below 2^31 (tools that keep ids signed).
    fn uid_range(&mut self, key: &str) -> Result<Option<(u32, u32)>, ConfigError> {
        let range = self.range(key, "uids", u64::from(UID_FLOOR), u64::from(UID_CEILING))?;
        Ok(range.map(|(s, e)| (s as u32, e as u32)))
    }

    /// `[start, end]` of whole numbers within `lo..=hi` (`what` names them in errors), with
    /// `start <= end`.
    fn range(
        &mut self,
        key: &str,
        what: &str,
        lo: u64,
        hi: u64,
    ) -> Result<Option<(u64, u64)>, ConfigError> {
        let items = match self.table.remove(key) {
            None => return Ok(None),
            Some(toml::Value::Array(items)) => items,
            Some(other) => {
                return Err(self.invalid(
                    key,
                    format!(
                        "must be an array of two {what} [start, end], got {}",
                        describe(&other)
                    ),
                ));
            }
        };
        let [s, e] = items.as_slice() else {
            return Err(self.invalid(
                key,
                format!(
                    "must be an array of exactly two {what} [start, end], got {} elements",
                    items.len()
                ),
            ));
        };
        let bound = |which: &str, v: &toml::Value| {
            whole(v, lo, hi).map_err(|m| self.invalid(key, format!("{which} {m}")))
        };
        let (s, e) = (bound("start", s)?, bound("end", e)?);
        if s > e {
            return Err(self.invalid(key, format!("start {s} must not exceed end {e}")));
        }
        Ok(Some((s, e)))
    }

    /// A sub-table such as `[limits]`.
    fn table(&mut self, key: &'static str, prefix: &'static str) -> Result<Self, ConfigError> {
        let table = match self.table.remove(key) {
            None => toml::Table::new(),
            Some(toml::Value::Table(t)) => t,
            Some(other) => {
                return Err(self.invalid(
                    key,
                    format!("must be a table ([{key}]), got {}", describe(&other)),
                ));
            }
        };
        Ok(Self {
            shown: self.shown,
            prefix,
            table,
        })
    }

    /// Refuses whatever key was not taken.
    fn finish(self) -> Result<(), ConfigError> {
        match self.table.keys().next() {
            None => Ok(()),
            Some(key) => Err(self.invalid(key, "is not a hostd.toml key".to_owned())),
        }
    }
}

/// A TOML value as a short phrase for error messages.
fn describe(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("the string {s:?}"),
        toml::Value::Integer(i) => format!("the number {i}"),
        toml::Value::Float(f) => format!("the fractional number {f}"),
        other => format!("a {}", other.type_str()),
    }
}

/// A whole number within `min..=max`, or a sentence saying why not.
fn whole(v: &toml::Value, min: u64, max: u64) -> Result<u64, String> {
    let range = format!("a whole number from {min} to {max}");
    match v {
        toml::Value::Integer(i) => match u64::try_from(*i) {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(format!("must be {range}, got {i}")),
        },
        other => Err(format!("must be {range}, got {}", describe(other))),
    }
}

impl RawConfig {
    fn read(text: &str, shown: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: shown.to_owned(),
            message: e.message().to_owned()
                + &e.span()
                    .map(|s| format!(" ({})", locate(text, s.start)))
                    .unwrap_or_default(),
        })?;
        let mut top = TableReader {
            shown,
            prefix: "",
            table,
        };
        let u32_max = u64::from(u32::MAX);
        let mut raw = RawConfig {
            host_name: top.string("host_name")?,
            host_key: top.path("host_key")?,
            allowed_signers: top.path("allowed_signers")?,
            state_root: top.path("state_root")?,
            unit_dir: top.path("unit_dir")?,
            hooks_dir: top.path("hooks_dir")?,
            gateway_command: top.strings("gateway_command")?,
            port_range: top.port_range("port_range")?,
            max_agents: top.integer("max_agents", 1, u32_max)?.map(|n| n as u32),
            protocol_versions: top.integers("protocol_versions", 1, u32_max)?,
            ..RawConfig::default()
        };
        let mut limits = top.table("limits", "limits.")?;
        raw.limits = RawLimits {
            lock_timeout_ms: limits.integer("lock_timeout_ms", 1, 600_000)?,
            unit_stop_timeout_ms: limits.integer("unit_stop_timeout_ms", 1, 600_000)?,
            unit_start_timeout_ms: limits.integer("unit_start_timeout_ms", 1, 600_000)?,
            readiness_timeout_ms: limits.integer("readiness_timeout_ms", 1, 3_600_000)?,
            hook_timeout_ms: limits.integer("hook_timeout_ms", 1, 600_000)?,
            clock_skew_seconds: limits.integer("clock_skew_seconds", 0, 3600)?,
            max_envelope_lifetime_seconds: limits.integer(
                "max_envelope_lifetime_seconds",
                1,
                86_400,
            )?,
            max_sessions: limits.integer("max_sessions", 1, 10_000)?,
            session_idle_timeout_seconds: limits.integer(
                "session_idle_timeout_seconds",
                1,
                86_400,
            )?,
            max_relay_streams: limits.integer("max_relay_streams", 1, 65_536)?,
            relay_idle_timeout_seconds: limits.integer("relay_idle_timeout_seconds", 1, 86_400)?,
        };
        limits.finish()?;
        let mut unit = top.table("unit", "unit.")?;
        raw.unit = RawUnit {
            memory_max: unit.string("memory_max")?,
            cpu_quota: unit.string("cpu_quota")?,
            tasks_max: unit.integer("tasks_max", 1, u32_max)?.map(|n| n as u32),
            log_rate_limit_interval_seconds: unit.integer(
                "log_rate_limit_interval_seconds",
                1,
                3600,
            )?,
            log_rate_limit_burst: unit
                .integer("log_rate_limit_burst", 1, 1_000_000)?
                .map(|n| n as u32),
        };
        unit.finish()?;
        let mut accounts = top.table("accounts", "accounts.")?;
        raw.accounts = RawAccounts {
            uid_range: accounts.uid_range("uid_range")?,
        };
        accounts.finish()?;
        let mut journal = top.table("journal", "journal.")?;
        raw.journal = RawJournal {
            max_entries: journal
                .integer("max_entries", 16, 1_000_000)?
                .map(|n| n as usize),
        };
        journal.finish()?;
        let mut quota = top.table("quota", "quota.")?;
        raw.quota = RawQuota {
            max_bytes: quota.integer("max_bytes", 1024 * 1024, u64::MAX / 2)?,
            max_inodes: quota.integer("max_inodes", 100, u64::MAX / 2)?,
        };
        quota.finish()?;
        let mut network = top.table("network", "network.")?;
        raw.network = RawNetwork {
            hold_ms: network.integer("hold_ms", 100, 600_000)?,
            egress_ports: network.integers("egress_ports", 1, 65535)?,
            egress_allow: network.strings("egress_allow")?,
            dns: network.strings("dns")?,
        };
        network.finish()?;
        top.finish()?;
        Ok(raw)
    }
}

/// "line L, column C", plus the key being set on that line when it has one (syntax errors
/// inside a value, such as a number too large for TOML, still name their key).
fn locate(text: &str, offset: usize) -> String {
    let before = text.get(..offset).unwrap_or(text);
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let mut out = format!("line {line_no}, column {column}");
    let line = text[line_start..].lines().next().unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim())
        .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    if let Some(key) = key {
        let section = before[..line_start]
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| l.starts_with('[') && l.ends_with(']'))
            .map(|l| format!("{}.", l.trim_matches(['[', ']']).trim()))
            .unwrap_or_default();
        out.push_str(&format!(", in `{section}{key}`"));
    }
    out
}

/// Limits on waiting, all configurable so tests wait seconds, not minutes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub lock_timeout: Duration,
    pub unit_stop_timeout: Duration,
    pub unit_start_timeout: Duration,
    pub readiness_timeout: Duration,
    /// How long one host hook may run before it is killed (hooks.rs).
    pub hook_timeout: Duration,
    pub clock_skew_seconds: u64,
    pub max_envelope_lifetime_seconds: u64,
    /// Most `hostd serve` sessions open at once on the host, whoever logged in
    /// (session.rs): each costs a root process of about 15 MiB.
    pub max_sessions: u32,
    /// A session that receives no frame for this long ends itself (session.rs). Above the
    /// coordinator's own idle close (120 s), which replaces an ended session transparently.
    pub session_idle_timeout: Duration,
    /// Gateway streams the host carries at once, all relay channels (`hostd relay`,
    /// relay.rs) together.
    pub max_relay_streams: u32,
    /// A relayed gateway stream without a byte either way for this long is closed.
    pub relay_idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            lock_timeout: Duration::from_secs(30),
            unit_stop_timeout: Duration::from_secs(30),
            unit_start_timeout: Duration::from_secs(30),
            readiness_timeout: Duration::from_secs(120),
            hook_timeout: Duration::from_secs(30),
            clock_skew_seconds: 60,
            max_envelope_lifetime_seconds: 3600,
            max_sessions: 32,
            session_idle_timeout: Duration::from_secs(600),
            max_relay_streams: 512,
            relay_idle_timeout: Duration::from_secs(900),
        }
    }
}

/// `[unit] memory_max` when unset: the real gateway needs about 1 GB.
pub const DEFAULT_MEMORY_MAX: &str = "2G";
/// `[unit] tasks_max` when unset.
pub const DEFAULT_TASKS_MAX: u32 = 512;

/// `[unit] log_rate_limit_interval_seconds` when unset.
pub const DEFAULT_LOG_RATE_LIMIT_INTERVAL_SECONDS: u64 = 30;
/// `[unit] log_rate_limit_burst` when unset: messages per interval, well below journald's
/// own per-service default (10,000), which let one Agent write 100 MB in 2 s.
pub const DEFAULT_LOG_RATE_LIMIT_BURST: u32 = 1000;

/// Resource limits written into every Agent unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitResources {
    pub memory_max: Option<String>,
    pub cpu_quota: Option<String>,
    pub tasks_max: Option<u32>,
    /// journald's rate limit for the unit (`LogRateLimitIntervalSec=`,
    /// `LogRateLimitBurst=`): messages beyond the burst within the interval are dropped.
    pub log_rate_limit: Option<(u64, u32)>,
}

/// Lowest uid `[accounts] uid_range` may start at: above the distributions' system and
/// regular ranges (up to 60000), systemd's portable (60001–60513) and dynamic users
/// (61184–65519) and `nobody` (65534).
pub const UID_FLOOR: u32 = 65_536;
/// Highest uid it may end at (2^31 - 1): some tools keep ids signed.
pub const UID_CEILING: u32 = 0x7fff_ffff;
/// `[accounts] uid_range` when unset: a block no distribution or systemd allocates from
/// (systemd-nspawn's `--private-users=pick` starts at 524288).
pub const DEFAULT_UID_RANGE: (u32, u32) = (400_000, 499_999);

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The name envelopes must address; defaults to the system host name.
    pub host_name: HostName,
    pub host_key: PathBuf,
    pub allowed_signers: PathBuf,
    pub state_root: PathBuf,
    pub unit_dir: PathBuf,
    /// The operator's host hooks, one directory per event (hooks.rs).
    pub hooks_dir: PathBuf,
    /// The gateway's `ExecStart=` words.
    pub gateway_command: Vec<String>,
    pub port_range: (u16, u16),
    pub max_agents: u32,
    /// The protocol versions this host speaks, ascending (default: all that hostd supports).
    /// `[1]` makes a test host behave like a hostd that predates fencing: hello and probe
    /// advertise only these, and envelopes of other versions are refused.
    pub protocol_versions: Vec<u32>,
    pub limits: Limits,
    pub unit: UnitResources,
    /// Where Agent uids (and their groups' gids) come from; each is used once per host
    /// (`crate::uids`).
    pub uid_range: (u32, u32),
    pub journal_max_entries: usize,
    /// Each Agent's disk and inode limits, where the state root has project quotas
    /// (`crate::quota`).
    pub quota: crate::quota::QuotaLimits,
    /// `[network] hold_ms`: how long a connection to an Agent's port waits for its gateway
    /// during a cutover before the front answers 503 (issue 28).
    pub front_hold_ms: u64,
    /// `[network] egress_ports`: TCP ports each Agent may reach on public addresses.
    pub egress_ports: Vec<u16>,
    /// `[network] egress_allow`: IPv4 CIDRs each Agent may reach on any port (an internal
    /// proxy or model gateway), which the private ranges would otherwise deny.
    pub egress_allow: Vec<String>,
    /// `[network] dns`: the resolvers each Agent's `resolv.conf` names (`crate::resolv`);
    /// empty: the host's own reachable ones.
    pub dns: Vec<std::net::Ipv4Addr>,
}

/// `[network] egress_ports` when unset: HTTPS only, as the Kubernetes backend's policy.
pub const DEFAULT_EGRESS_PORTS: [u16; 1] = [443];

/// `[network] hold_ms` when unset: longer than the real gateway's 20-40 s start.
pub const DEFAULT_FRONT_HOLD_MS: u64 = 60_000;

/// `[quota] max_bytes` when unset: 10 GiB per Agent.
pub const DEFAULT_QUOTA_MAX_BYTES: u64 = 10 * 1024 * 1024 * 1024;
/// `[quota] max_inodes` when unset.
pub const DEFAULT_QUOTA_MAX_INODES: u64 = 1_000_000;

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
        let raw = RawConfig::read(text, shown)?;
        let invalid = |key: &'static str, message: String| ConfigError::Invalid {
            path: shown.to_owned(),
            key: key.to_owned(),
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
        let hooks_dir = abs("hooks_dir", raw.hooks_dir, "/etc/clawfleet/hooks.d")?;

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

        let (start, end) = raw.port_range.unwrap_or((18700, 18999));
        let max_agents = raw.max_agents.unwrap_or(1000);
        let protocol_versions = protocol_versions(raw.protocol_versions)
            .map_err(|m| invalid("protocol_versions", m))?;

        // Ranges were checked while reading.
        let l = raw.limits;
        let d = Limits::default();
        let ms = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
        let limits = Limits {
            lock_timeout: ms(l.lock_timeout_ms, d.lock_timeout),
            unit_stop_timeout: ms(l.unit_stop_timeout_ms, d.unit_stop_timeout),
            unit_start_timeout: ms(l.unit_start_timeout_ms, d.unit_start_timeout),
            readiness_timeout: ms(l.readiness_timeout_ms, d.readiness_timeout),
            hook_timeout: ms(l.hook_timeout_ms, d.hook_timeout),
            clock_skew_seconds: l.clock_skew_seconds.unwrap_or(d.clock_skew_seconds),
            max_envelope_lifetime_seconds: l
                .max_envelope_lifetime_seconds
                .unwrap_or(d.max_envelope_lifetime_seconds),
            max_sessions: l.max_sessions.map_or(d.max_sessions, |n| n as u32),
            session_idle_timeout: l
                .session_idle_timeout_seconds
                .map_or(d.session_idle_timeout, Duration::from_secs),
            max_relay_streams: l
                .max_relay_streams
                .map_or(d.max_relay_streams, |n| n as u32),
            relay_idle_timeout: l
                .relay_idle_timeout_seconds
                .map_or(d.relay_idle_timeout, Duration::from_secs),
        };

        let u = raw.unit;
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
        let journal_max_entries = raw.journal.max_entries.unwrap_or(10_000);
        let egress_allow = raw.network.egress_allow.clone().unwrap_or_default();
        for c in &egress_allow {
            if let Err(why) = c.parse::<clawfleet_protocol::egress::Cidr>() {
                return Err(invalid("network.egress_allow", why));
            }
        }
        let mut dns = Vec::new();
        for a in raw.network.dns.iter().flatten() {
            match a.parse::<std::net::Ipv4Addr>() {
                Ok(ip) if !ip.is_loopback() && !ip.is_unspecified() => dns.push(ip),
                _ => {
                    return Err(invalid(
                        "network.dns",
                        format!(
                            "{a:?} is not an IPv4 address an Agent's network can reach, such as \"10.0.0.2\" (a loopback resolver is the host's own, out of an Agent's reach)"
                        ),
                    ));
                }
            }
        }

        Ok(Self {
            host_name,
            host_key,
            allowed_signers,
            state_root,
            unit_dir,
            hooks_dir,
            gateway_command,
            port_range: (start, end),
            max_agents,
            protocol_versions,
            limits,
            unit: UnitResources {
                memory_max: Some(
                    u.memory_max
                        .unwrap_or_else(|| DEFAULT_MEMORY_MAX.to_owned()),
                ),
                cpu_quota: u.cpu_quota,
                tasks_max: Some(u.tasks_max.unwrap_or(DEFAULT_TASKS_MAX)),
                log_rate_limit: Some((
                    u.log_rate_limit_interval_seconds
                        .unwrap_or(DEFAULT_LOG_RATE_LIMIT_INTERVAL_SECONDS),
                    u.log_rate_limit_burst
                        .unwrap_or(DEFAULT_LOG_RATE_LIMIT_BURST),
                )),
            },
            uid_range: raw.accounts.uid_range.unwrap_or(DEFAULT_UID_RANGE),
            journal_max_entries,
            quota: crate::quota::QuotaLimits {
                max_bytes: raw.quota.max_bytes.unwrap_or(DEFAULT_QUOTA_MAX_BYTES),
                max_inodes: raw.quota.max_inodes.unwrap_or(DEFAULT_QUOTA_MAX_INODES),
            },
            front_hold_ms: raw.network.hold_ms.unwrap_or(DEFAULT_FRONT_HOLD_MS),
            egress_ports: raw
                .network
                .egress_ports
                .map(|v| {
                    v.into_iter()
                        .filter_map(|p| u16::try_from(p).ok())
                        .collect()
                })
                .unwrap_or_else(|| DEFAULT_EGRESS_PORTS.to_vec()),
            egress_allow,
            dns,
        })
    }
}

/// `protocol_versions`: every version hostd supports when unset; otherwise a non-empty set
/// of supported versions, returned ascending.
fn protocol_versions(raw: Option<Vec<u64>>) -> Result<Vec<u32>, String> {
    let supported = clawfleet_protocol::SUPPORTED_VERSIONS;
    let Some(raw) = raw else {
        return Ok(supported.to_vec());
    };
    if raw.is_empty() {
        return Err(format!(
            "must name at least one protocol version (this hostd supports {supported:?})"
        ));
    }
    let mut out = Vec::with_capacity(raw.len());
    for v in raw {
        match u32::try_from(v) {
            Ok(v) if supported.contains(&v) => {
                if out.contains(&v) {
                    return Err(format!("names version {v} twice"));
                }
                out.push(v);
            }
            _ => {
                return Err(format!(
                    "names version {v}, which this hostd does not support (it supports {supported:?})"
                ));
            }
        }
    }
    out.sort_unstable();
    Ok(out)
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
        assert_eq!(c.unit.memory_max.as_deref(), Some(DEFAULT_MEMORY_MAX));
        assert_eq!(c.unit.tasks_max, Some(DEFAULT_TASKS_MAX));
        assert_eq!(c.unit.cpu_quota, None);
        assert_eq!(
            c.protocol_versions,
            clawfleet_protocol::SUPPORTED_VERSIONS.to_vec()
        );
    }

    #[test]
    fn protocol_versions_can_be_narrowed_to_emulate_an_older_hostd() {
        assert_eq!(
            parse("protocol_versions = [1]").unwrap().protocol_versions,
            vec![1]
        );
        assert_eq!(
            parse("protocol_versions = [2, 1]")
                .unwrap()
                .protocol_versions,
            vec![1, 2]
        );
        let (key, shown) = refusal("protocol_versions = [1, 3]");
        assert_eq!(key, "protocol_versions");
        assert!(
            shown.contains("version 3") && shown.contains("[1, 2]"),
            "{shown}"
        );
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
[quota]
max_bytes = 1073741824
max_inodes = 20000
[network]
hold_ms = 5000
egress_ports = [443, 8443]
egress_allow = ["10.1.2.0/24"]
dns = ["10.0.0.2"]
"#,
        )
        .unwrap();
        assert_eq!(c.quota.max_bytes, 1 << 30);
        assert_eq!(c.quota.max_inodes, 20_000);
        assert_eq!(c.front_hold_ms, 5000);
        assert_eq!(c.egress_ports, [443, 8443]);
        assert_eq!(c.egress_allow, ["10.1.2.0/24"]);
        assert_eq!(c.dns, [std::net::Ipv4Addr::new(10, 0, 0, 2)]);
        assert_eq!(
            refusal("[network]\ndns = [\"127.0.0.53\"]").0,
            "network.dns"
        );
        assert_eq!(
            refusal("[network]\negress_allow = [\"10.1.2.0\"]").0,
            "network.egress_allow"
        );
        // Host bits set: refused with the network it would be, not cut to it silently.
        let (key, why) = refusal("[network]\negress_allow = [\"10.1.2.5/24\"]");
        assert_eq!(key, "network.egress_allow");
        assert!(why.contains("\"10.1.2.0/24\""), "{why}");
        assert_eq!(
            refusal("[network]\negress_ports = [0]").0,
            "network.egress_ports"
        );
        assert_eq!(
            refusal("[quota]\nmax_inodes = 5").0,
            "quota.max_inodes",
            "too few inodes is refused naming the key"
        );
        assert_eq!(c.port_range, (20000, 20010));
        assert_eq!(c.limits.lock_timeout, Duration::from_secs(2));
        assert_eq!(c.unit.memory_max.as_deref(), Some("2G"));
        assert_eq!(c.journal_max_entries, 100);
    }

    #[test]
    fn every_bad_value_names_its_key() {
        let cases = [
            ("surprise = 1", "surprise"),
            ("[limits]\nlock_timeout = 1", "limits.lock_timeout"),
            ("limits = 5", "limits"),
            ("port_range = \"1-2\"", "port_range"),
            ("host_name = \"bad name\"", "host_name"),
            ("state_root = \"relative\"", "state_root"),
            ("state_root = \"/tmp/x\"", "state_root"),
            ("state_root = \"/var/lib/../tmp\"", "state_root"),
            ("state_root = \"/\"", "state_root"),
            ("unit_dir = \"/etc/sys temd\"", "unit_dir"),
            ("hooks_dir = \"hooks.d\"", "hooks_dir"),
            ("[limits]\nhook_timeout_ms = 0", "limits.hook_timeout_ms"),
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
            ("protocol_versions = []", "protocol_versions"),
            ("protocol_versions = [3]", "protocol_versions"),
            ("protocol_versions = [0]", "protocol_versions"),
            ("protocol_versions = [1, 1]", "protocol_versions"),
            ("protocol_versions = 1", "protocol_versions"),
            ("protocol_versions = [\"1\"]", "protocol_versions"),
        ];
        for (text, key) in cases {
            let got = key_of(parse(text).unwrap_err());
            assert!(got.starts_with(key), "{text:?}: expected {key}, got {got}");
        }
    }

    /// The refusal of `text`: which key it names, and its whole message.
    fn refusal(text: &str) -> (String, String) {
        let err = parse(text).unwrap_err();
        let shown = err.to_string();
        (key_of(err), shown)
    }

    #[test]
    fn a_fractional_number_names_its_key() {
        let (key, shown) = refusal("[limits]\nlock_timeout_ms = 1.5");
        assert_eq!(key, "limits.lock_timeout_ms", "{shown}");
        assert!(
            shown.contains("whole number") && shown.contains("1.5"),
            "{shown}"
        );
    }

    #[test]
    fn a_fractional_port_names_its_key() {
        let (key, shown) = refusal("port_range = [1.5, 18710]");
        assert_eq!(key, "port_range", "{shown}");
        assert!(shown.contains("start") && shown.contains("1.5"), "{shown}");
    }

    #[test]
    fn a_negative_number_names_its_key() {
        let (key, shown) = refusal("[limits]\nunit_start_timeout_ms = -5");
        assert_eq!(key, "limits.unit_start_timeout_ms", "{shown}");
        assert!(shown.contains("-5"), "{shown}");
        let (key, _) = refusal("port_range = [18700, -1]");
        assert_eq!(key, "port_range");
    }

    #[test]
    fn an_overflowing_number_names_its_key() {
        // Beyond the field's type.
        let (key, shown) = refusal("max_agents = 5000000000");
        assert_eq!(key, "max_agents", "{shown}");
        let (key, _) = refusal("[unit]\ntasks_max = 4294967296");
        assert_eq!(key, "unit.tasks_max");
        let (key, _) = refusal("port_range = [18700, 4294967297]");
        assert_eq!(key, "port_range");
        // Beyond what TOML can hold at all: a syntax error, which still names the key.
        let (key, shown) = refusal("[limits]\nlock_timeout_ms = 99999999999999999999999");
        assert!(key.starts_with("syntax"), "{shown}");
        assert!(shown.contains("`limits.lock_timeout_ms`"), "{shown}");
        assert!(shown.contains("line 2"), "{shown}");
    }

    #[test]
    fn a_wrong_type_names_its_key() {
        for (text, key) in [
            (
                "[limits]\nlock_timeout_ms = \"300\"",
                "limits.lock_timeout_ms",
            ),
            (
                "[limits]\nreadiness_timeout_ms = true",
                "limits.readiness_timeout_ms",
            ),
            ("max_agents = [1]", "max_agents"),
            ("host_name = 7", "host_name"),
            ("state_root = [\"/srv\"]", "state_root"),
            ("gateway_command = \"/usr/bin/node\"", "gateway_command"),
            (
                "gateway_command = [\"/usr/bin/node\", 1]",
                "gateway_command",
            ),
            ("port_range = [\"18700\", \"18710\"]", "port_range"),
            ("[unit]\nmemory_max = 512", "unit.memory_max"),
            ("[journal]\nmax_entries = 1e3", "journal.max_entries"),
        ] {
            let (got, shown) = refusal(text);
            assert_eq!(got, key, "{text:?}: {shown}");
        }
    }

    #[test]
    fn a_port_range_needs_exactly_two_elements() {
        for text in [
            "port_range = [18700, 18705, 18710]",
            "port_range = [18700]",
            "port_range = []",
        ] {
            let (key, shown) = refusal(text);
            assert_eq!(key, "port_range", "{text}: {shown}");
            assert!(shown.contains("exactly two"), "{shown}");
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
