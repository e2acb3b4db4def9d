//! The coordinator's process settings (`/etc/clawfleet/occ.toml`, `--config` or
//! `OCC_CONFIG_PATH`). Hosts, pools and tokens live in the database, not here. Unknown keys
//! are rejected and every value is validated with an error that names its key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::store::database::{Database, PostgresOptions};

/// Default configuration path.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/clawfleet/occ.toml";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/clawfleet-coordinator";

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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    listen: Option<String>,
    state_dir: Option<PathBuf>,
    encryption_key_file: Option<PathBuf>,
    worker: Option<RawWorker>,
    ssh: Option<RawSsh>,
    api: Option<RawApi>,
    drift: Option<RawDrift>,
    rollout: Option<RawRollout>,
    database: Option<String>,
    postgres: Option<RawPostgres>,
    leader: Option<RawLeader>,
    retention: Option<RawRetention>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLeader {
    lease_ms: Option<u64>,
}

/// The leader lease of the singleton loops (`[leader]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderSettings {
    /// How long the lease lasts without renewal: a follower takes over within it after the
    /// leader dies. Renewed every third of it.
    pub lease: Duration,
}

impl Default for LeaderSettings {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    interval_seconds: Option<u64>,
    work_days: Option<u64>,
    audit_days: Option<u64>,
}

/// What the leader removes (`[retention]`): finished work items and audit events past their
/// age, checked every `interval`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    pub interval: Duration,
    pub work: Duration,
    pub audit: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(3600),
            work: Duration::from_secs(30 * 86_400),
            audit: Duration::from_secs(400 * 86_400),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPostgres {
    password_file: Option<PathBuf>,
    pool_size: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRollout {
    interval_ms: Option<u64>,
}

/// The rollout scheduler (`[rollout]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutSettings {
    /// Time between scheduler passes (how soon a finished deploy lets the next one start).
    pub interval: Duration,
}

impl Default for RolloutSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(1000),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDrift {
    interval_seconds: Option<u64>,
}

/// The drift sweep (`[drift]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftSettings {
    /// Time between sweeps (each one jittered by up to a tenth either way).
    pub interval: Duration,
}

impl Default for DriftSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApi {
    request_timeout_seconds: Option<u64>,
    header_timeout_seconds: Option<u64>,
    max_concurrent_requests: Option<usize>,
    allow_plaintext_listen: Option<bool>,
    runtime_reads_per_minute: Option<u32>,
    gateway_streams_per_token: Option<usize>,
    gateway_recheck_seconds: Option<u64>,
    gateway_allowed_origins: Option<Vec<String>>,
    body_timeout_seconds: Option<u64>,
    admin_reserved_requests: Option<usize>,
    token_concurrent_requests: Option<usize>,
    unauthenticated_concurrent_requests: Option<usize>,
    token_requests_per_minute: Option<u32>,
}

/// HTTP API limits (`[api]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiSettings {
    /// A request (body included) must be answered within this, or it gets 408.
    pub request_timeout: Duration,
    /// A connection must send a request's headers within this, or it is closed.
    pub header_timeout: Duration,
    /// Requests of valid tokens in progress at once; more get 503 SERVER_BUSY.
    pub max_concurrent_requests: usize,
    /// Of `max_concurrent_requests`, the part only tokens with the admin role in all
    /// Namespaces may use, so other tokens' requests cannot lock the operator out.
    pub admin_reserved_requests: usize,
    /// Requests in progress at once per token; more get 429 RATE_LIMITED.
    pub token_concurrent_requests: usize,
    /// Requests without a valid token in progress at once (apart from the tokens' share).
    pub unauthenticated_concurrent_requests: usize,
    /// Requests per minute of each token that is not a global admin (bucket of a minute's
    /// worth); more get 429 RATE_LIMITED with Retry-After.
    pub token_requests_per_minute: u32,
    /// A request's body must have arrived within this, or it gets 408.
    pub body_timeout: Duration,
    /// Allows a `listen` address off loopback although occ serves plain HTTP (for a TLS
    /// proxy in front on another machine).
    pub allow_plaintext_listen: bool,
    /// Runtime and log reads per token per minute (each reaches a host or cluster); more get
    /// 429 RATE_LIMITED with Retry-After.
    pub runtime_reads_per_minute: u32,
    /// Gateway streams (`occ agent connect`, the gateway route) one token may have open at
    /// once on this coordinator; more get 429 GATEWAY_STREAM_LIMIT.
    pub gateway_streams_per_token: usize,
    /// How often an open gateway stream re-checks its token and Agent (revoked, stopped,
    /// deleted, new active revision close it).
    pub gateway_recheck: Duration,
    /// Origins (`scheme://host[:port]`) besides the coordinator's own whose pages may use
    /// the gateway route (its WebSocket and its state-changing requests): the console's
    /// address behind a TLS proxy whose `Host` differs, say. Empty: the coordinator's own only.
    pub gateway_allowed_origins: Vec<String>,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            max_concurrent_requests: 256,
            admin_reserved_requests: 32,
            token_concurrent_requests: 32,
            unauthenticated_concurrent_requests: 32,
            token_requests_per_minute: 1200,
            body_timeout: Duration::from_secs(10),
            allow_plaintext_listen: false,
            runtime_reads_per_minute: 120,
            gateway_streams_per_token: 256,
            gateway_recheck: Duration::from_secs(30),
            gateway_allowed_origins: Vec::new(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorker {
    lease_seconds: Option<u64>,
    max_attempts: Option<u32>,
    convergence_deadline_seconds: Option<u64>,
    readiness_recheck_ms: Option<u64>,
    readiness_recheck_max_ms: Option<u64>,
    backoff_initial_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    poll_ms: Option<u64>,
    operation_deadline_seconds: Option<u32>,
    parallelism: Option<usize>,
    yield_parallelism: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSsh {
    connect_timeout_seconds: Option<u64>,
    max_parallel_hosts: Option<usize>,
    max_sessions_per_host: Option<usize>,
    session_idle_timeout_seconds: Option<u64>,
    session_max_age_seconds: Option<u64>,
}

/// Worker timing; the defaults are the design's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSettings {
    pub lease: Duration,
    pub max_attempts: u32,
    pub convergence_deadline: Duration,
    pub readiness_recheck: Duration,
    pub readiness_recheck_max: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub poll: Duration,
    pub operation_deadline_seconds: u32,
    /// Work items in progress at once (each Agent's items stay in order).
    pub parallelism: usize,
    /// Work items in progress at once while API requests are being answered (at most
    /// `parallelism`): background work yields the rest to them (`crate::foreground`).
    pub yield_parallelism: usize,
    /// How long a host or cluster call may go unanswered before the work notes it as
    /// `CALL_IN_PROGRESS`, so status names the step in flight during a hang.
    pub slow_call: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            max_attempts: 5,
            convergence_deadline: Duration::from_secs(15 * 60),
            readiness_recheck: Duration::from_millis(500),
            readiness_recheck_max: Duration::from_secs(5),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            poll: Duration::from_millis(250),
            operation_deadline_seconds: 190,
            parallelism: 16,
            yield_parallelism: YIELD_PARALLELISM_POSTGRES,
            slow_call: Duration::from_secs(3),
        }
    }
}

/// `worker.yield_parallelism`'s default on PostgreSQL (and of [`WorkerSettings::default`]):
/// the share at which both the deploy API's rate and the churn case's drain kept their
/// targets in `coordinator/benches/api_load.rs` on a 2-core machine (a larger share slows
/// the API, a smaller one the drain).
pub const YIELD_PARALLELISM_POSTGRES: usize = 3;
/// `worker.yield_parallelism`'s default on SQLite, larger than PostgreSQL's: there the API
/// and the worker write through one connection in one process, and at a small share the
/// worker fell further behind during a burst of deploys than it caught up after (the churn
/// case of the same bench, which measures both stores at their defaults).
pub const YIELD_PARALLELISM_SQLITE: usize = 8;

/// `worker.yield_parallelism` when it is not set (before it is bounded by
/// `worker.parallelism`).
pub fn default_yield_parallelism(database: &Database) -> usize {
    match database {
        Database::Sqlite(_) => YIELD_PARALLELISM_SQLITE,
        Database::Postgres(_) => YIELD_PARALLELISM_POSTGRES,
    }
}

/// SSH settings (`[ssh]`): the SSH backend's own settings, with its defaults.
pub use crate::ssh::SshSettings;

/// How long the leader lease lasts without renewal.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    pub worker: WorkerSettings,
    pub ssh: SshSettings,
    pub api: ApiSettings,
    pub drift: DriftSettings,
    pub rollout: RolloutSettings,
    /// Where the state lives: SQLite in the state directory, or PostgreSQL.
    pub database: Database,
    pub leader: LeaderSettings,
    pub retention: RetentionSettings,
    /// `[postgres] password_file`, for `occ db migrate --to` too.
    pub postgres_password_file: Option<PathBuf>,
    /// The key that seals cluster credentials and workspace contents in the database
    /// (`store/src/seal.rs`); created by `occ init`; default `keys/encryption.key` in the state
    /// directory.
    pub encryption_key_file: PathBuf,
}

impl Config {
    /// The SSH login key (private, OpenSSH format).
    pub fn login_key(&self) -> PathBuf {
        self.state_dir.join("keys").join("login_ed25519")
    }

    /// The operation-signing key (private, OpenSSH format).
    pub fn signing_key(&self) -> PathBuf {
        self.state_dir.join("keys").join("signing_ed25519")
    }

    /// Reads a configuration file; a missing file at the default path means all defaults.
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
        Self::parse(&text, &shown)
    }

    /// Parses configuration text.
    pub fn parse(text: &str, shown: &str) -> Result<Self, ConfigError> {
        let raw: Raw = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: shown.to_owned(),
            message: e.message().to_owned(),
        })?;
        let invalid = |key: &'static str, message: String| ConfigError::Invalid {
            path: shown.to_owned(),
            key,
            message,
        };
        let listen_text = raw.listen.unwrap_or_else(|| "127.0.0.1:7300".to_owned());
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            invalid(
                "listen",
                format!("{listen_text:?} is not an IP:port address"),
            )
        })?;
        let state_dir = raw
            .state_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        if !state_dir.is_absolute() {
            return Err(invalid("state_dir", "must be an absolute path".to_owned()));
        }
        let encryption_key_file = raw
            .encryption_key_file
            .unwrap_or_else(|| crate::store::seal::default_key_file(&state_dir));
        if !encryption_key_file.is_absolute() {
            return Err(invalid(
                "encryption_key_file",
                "must be an absolute path".to_owned(),
            ));
        }
        let w = raw.worker.unwrap_or_default();
        let d = WorkerSettings::default();
        let ms = |key: &'static str, v: Option<u64>, default: Duration| match v {
            None => Ok(default),
            Some(0) => Err(invalid(key, "must be at least 1".to_owned())),
            Some(v) => Ok(Duration::from_millis(v)),
        };
        let secs = |key: &'static str, v: Option<u64>, default: Duration| match v {
            None => Ok(default),
            Some(0) => Err(invalid(key, "must be at least 1".to_owned())),
            Some(v) => Ok(Duration::from_secs(v)),
        };
        let worker = WorkerSettings {
            lease: secs("worker.lease_seconds", w.lease_seconds, d.lease)?,
            max_attempts: match w.max_attempts {
                Some(0) => {
                    return Err(invalid(
                        "worker.max_attempts",
                        "must be at least 1".to_owned(),
                    ));
                }
                v => v.unwrap_or(d.max_attempts),
            },
            convergence_deadline: secs(
                "worker.convergence_deadline_seconds",
                w.convergence_deadline_seconds,
                d.convergence_deadline,
            )?,
            readiness_recheck: ms(
                "worker.readiness_recheck_ms",
                w.readiness_recheck_ms,
                d.readiness_recheck,
            )?,
            readiness_recheck_max: ms(
                "worker.readiness_recheck_max_ms",
                w.readiness_recheck_max_ms,
                d.readiness_recheck_max,
            )?,
            backoff_initial: ms(
                "worker.backoff_initial_ms",
                w.backoff_initial_ms,
                d.backoff_initial,
            )?,
            backoff_max: ms("worker.backoff_max_ms", w.backoff_max_ms, d.backoff_max)?,
            poll: ms("worker.poll_ms", w.poll_ms, d.poll)?,
            operation_deadline_seconds: match w.operation_deadline_seconds {
                Some(v) if v == 0 || v > clawfleet_protocol::envelope::MAX_DEADLINE_SECONDS => {
                    return Err(invalid(
                        "worker.operation_deadline_seconds",
                        "must be between 1 and 3600".to_owned(),
                    ));
                }
                v => v.unwrap_or(d.operation_deadline_seconds),
            },
            parallelism: match w.parallelism {
                Some(v) if v == 0 || v > 1024 => {
                    return Err(invalid(
                        "worker.parallelism",
                        "must be between 1 and 1024".to_owned(),
                    ));
                }
                v => v.unwrap_or(d.parallelism),
            },
            yield_parallelism: d.yield_parallelism,
            slow_call: d.slow_call,
        };
        // Checked here; its default depends on the store, known below.
        let yield_given = match w.yield_parallelism {
            Some(v) if v == 0 || v > worker.parallelism => {
                return Err(invalid(
                    "worker.yield_parallelism",
                    format!(
                        "must be between 1 and worker.parallelism ({})",
                        worker.parallelism
                    ),
                ));
            }
            v => v,
        };
        if worker.backoff_initial > worker.backoff_max {
            return Err(invalid(
                "worker.backoff_initial_ms",
                "must not exceed worker.backoff_max_ms".to_owned(),
            ));
        }
        let s = raw.ssh.unwrap_or_default();
        let ds = SshSettings::default();
        let count = |key: &'static str, v: Option<usize>, max: usize, default: usize| match v {
            Some(n) if n == 0 || n > max => {
                Err(invalid(key, format!("must be between 1 and {max}")))
            }
            v => Ok(v.unwrap_or(default)),
        };
        let ssh = SshSettings {
            connect_timeout: secs(
                "ssh.connect_timeout_seconds",
                s.connect_timeout_seconds,
                ds.connect_timeout,
            )?,
            max_parallel_hosts: count(
                "ssh.max_parallel_hosts",
                s.max_parallel_hosts,
                65536,
                ds.max_parallel_hosts,
            )?,
            max_sessions_per_host: count(
                "ssh.max_sessions_per_host",
                s.max_sessions_per_host,
                256,
                ds.max_sessions_per_host,
            )?,
            session_idle_timeout: secs(
                "ssh.session_idle_timeout_seconds",
                s.session_idle_timeout_seconds,
                ds.session_idle_timeout,
            )?,
            session_max_age: secs(
                "ssh.session_max_age_seconds",
                s.session_max_age_seconds,
                ds.session_max_age,
            )?,
            ..ds
        };
        let a = raw.api.unwrap_or_default();
        let da = ApiSettings::default();
        let api = ApiSettings {
            request_timeout: secs(
                "api.request_timeout_seconds",
                a.request_timeout_seconds,
                da.request_timeout,
            )?,
            header_timeout: secs(
                "api.header_timeout_seconds",
                a.header_timeout_seconds,
                da.header_timeout,
            )?,
            max_concurrent_requests: match a.max_concurrent_requests {
                Some(0) => {
                    return Err(invalid(
                        "api.max_concurrent_requests",
                        "must be at least 1".to_owned(),
                    ));
                }
                v => v.unwrap_or(da.max_concurrent_requests),
            },
            allow_plaintext_listen: a.allow_plaintext_listen.unwrap_or(false),
            runtime_reads_per_minute: match a.runtime_reads_per_minute {
                Some(0) => {
                    return Err(invalid(
                        "api.runtime_reads_per_minute",
                        "must be at least 1".to_owned(),
                    ));
                }
                v => v.unwrap_or(da.runtime_reads_per_minute),
            },
            body_timeout: secs(
                "api.body_timeout_seconds",
                a.body_timeout_seconds,
                da.body_timeout,
            )?,
            gateway_streams_per_token: count(
                "api.gateway_streams_per_token",
                a.gateway_streams_per_token,
                65536,
                da.gateway_streams_per_token,
            )?,
            gateway_recheck: match a.gateway_recheck_seconds {
                Some(s) if !(1..=30).contains(&s) => {
                    return Err(invalid(
                        "api.gateway_recheck_seconds",
                        format!("{s} is not between 1 and 30"),
                    ));
                }
                v => v.map_or(da.gateway_recheck, Duration::from_secs),
            },
            gateway_allowed_origins: match a.gateway_allowed_origins {
                None => da.gateway_allowed_origins.clone(),
                Some(list) => {
                    for o in &list {
                        if !gateway_origin_is_valid(o) {
                            return Err(invalid(
                                "api.gateway_allowed_origins",
                                format!(
                                    "{o:?} is not an origin (http:// or https://, a host and an optional port, nothing after)"
                                ),
                            ));
                        }
                    }
                    list
                }
            },
            admin_reserved_requests: a
                .admin_reserved_requests
                .unwrap_or(da.admin_reserved_requests),
            token_concurrent_requests: count(
                "api.token_concurrent_requests",
                a.token_concurrent_requests,
                65536,
                da.token_concurrent_requests,
            )?,
            unauthenticated_concurrent_requests: count(
                "api.unauthenticated_concurrent_requests",
                a.unauthenticated_concurrent_requests,
                65536,
                da.unauthenticated_concurrent_requests,
            )?,
            token_requests_per_minute: match a.token_requests_per_minute {
                Some(0) => {
                    return Err(invalid(
                        "api.token_requests_per_minute",
                        "must be at least 1".to_owned(),
                    ));
                }
                v => v.unwrap_or(da.token_requests_per_minute),
            },
        };
        if api.admin_reserved_requests >= api.max_concurrent_requests {
            return Err(invalid(
                "api.admin_reserved_requests",
                format!(
                    "must be less than api.max_concurrent_requests ({}), so other tokens keep a share",
                    api.max_concurrent_requests
                ),
            ));
        }
        if !listen.ip().is_loopback() && !api.allow_plaintext_listen {
            return Err(invalid(
                "listen",
                format!(
                    "{listen} is not a loopback address, and occ serves plain HTTP: tokens would \
                     cross the network in clear. Put a TLS proxy in front on this machine, or \
                     set [api] allow_plaintext_listen = true if the network path is protected"
                ),
            ));
        }
        let drift = DriftSettings {
            interval: match raw.drift.unwrap_or_default().interval_seconds {
                Some(v) if !(1..=86_400).contains(&v) => {
                    return Err(invalid(
                        "drift.interval_seconds",
                        format!("must be between 1 and 86400, got {v}"),
                    ));
                }
                Some(v) => Duration::from_secs(v),
                None => DriftSettings::default().interval,
            },
        };
        let rollout = RolloutSettings {
            interval: match raw.rollout.unwrap_or_default().interval_ms {
                Some(v) if !(10..=60_000).contains(&v) => {
                    return Err(invalid(
                        "rollout.interval_ms",
                        format!("must be between 10 and 60000, got {v}"),
                    ));
                }
                Some(v) => Duration::from_millis(v),
                None => RolloutSettings::default().interval,
            },
        };
        let postgres = raw.postgres.unwrap_or_default();
        let postgres_password_file = postgres.password_file.clone();
        let database = match raw.database {
            // [postgres] may be set before `database` is (`occ db migrate --to` reads it).
            None => Database::sqlite_in(&state_dir),
            Some(url) => Database::parse_url(
                &url,
                &PostgresOptions {
                    password_file: postgres.password_file,
                    pool_size: postgres.pool_size,
                },
                std::env::var("PGPASSWORD").ok(),
            )
            .map_err(|m| invalid("database", m))?,
        };
        let worker = WorkerSettings {
            yield_parallelism: yield_given
                .unwrap_or_else(|| default_yield_parallelism(&database).min(worker.parallelism)),
            ..worker
        };
        let leader = LeaderSettings {
            lease: match raw.leader.unwrap_or_default().lease_ms {
                Some(v) if !(300..=600_000).contains(&v) => {
                    return Err(invalid(
                        "leader.lease_ms",
                        format!("must be between 300 and 600000, got {v}"),
                    ));
                }
                Some(v) => Duration::from_millis(v),
                None => LeaderSettings::default().lease,
            },
        };
        let r = raw.retention.unwrap_or_default();
        let dr = RetentionSettings::default();
        let days = |key: &'static str, v: Option<u64>, default: Duration| match v {
            Some(v) if !(1..=36_500).contains(&v) => Err(invalid(
                key,
                format!("must be between 1 and 36500 days, got {v}"),
            )),
            Some(v) => Ok(Duration::from_secs(v * 86_400)),
            None => Ok(default),
        };
        let retention = RetentionSettings {
            interval: secs(
                "retention.interval_seconds",
                r.interval_seconds,
                dr.interval,
            )?,
            work: days("retention.work_days", r.work_days, dr.work)?,
            audit: days("retention.audit_days", r.audit_days, dr.audit)?,
        };
        Ok(Self {
            listen,
            state_dir,
            worker,
            ssh,
            api,
            drift,
            rollout,
            database,
            leader,
            retention,
            postgres_password_file,
            encryption_key_file,
        })
    }
}

/// Whether an origin of `api.gateway_allowed_origins` is well formed: `http://` or
/// `https://`, a host and an optional port, nothing after.
pub fn gateway_origin_is_valid(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
    else {
        return false;
    };
    !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_origins_are_origins() {
        assert!(gateway_origin_is_valid("https://console.example:8443"));
        assert!(!gateway_origin_is_valid("https://console.example/"));
        assert!(!gateway_origin_is_valid("console.example"));
        assert!(!gateway_origin_is_valid("https://"));
    }

    /// The shipped occ.toml documents only keys that exist, with their default values: with
    /// every `#key = value` and `#[section]` line uncommented it parses to the defaults.
    #[test]
    fn the_shipped_occ_toml_uncommented_is_the_defaults() {
        let shipped = include_str!("../../packaging/coordinator/occ.toml");
        let uncommented: String = shipped
            .lines()
            .filter_map(|l| {
                let body = l.strip_prefix('#')?;
                let is_key = body.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                });
                let is_section = body.starts_with('[') && body.ends_with(']');
                (is_key || is_section).then(|| format!("{body}\n"))
            })
            .collect();
        let parsed = Config::parse(&uncommented, "occ.toml").unwrap();
        let defaults = Config::parse("", "occ.toml").unwrap();
        assert_eq!(parsed.worker, defaults.worker);
        assert_eq!(parsed.api, defaults.api);
        assert_eq!(parsed.drift, defaults.drift);
        assert_eq!(parsed.rollout, defaults.rollout);
        assert_eq!(parsed.leader, defaults.leader);
        assert_eq!(parsed.retention, defaults.retention);
        assert_eq!(parsed.database, defaults.database);
        assert_eq!(parsed.listen, defaults.listen);
        assert_eq!(parsed.ssh, defaults.ssh);
        assert!(uncommented.contains("max_sessions_per_host"));
        assert!(
            uncommented.contains("[drift]")
                && uncommented.contains("[rollout]")
                && uncommented.contains("runtime_reads_per_minute")
        );
    }

    #[test]
    fn defaults_and_errors() {
        let c = Config::parse("", "occ.toml").unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:7300");
        assert_eq!(c.worker.max_attempts, 5);
        for (text, key) in [
            ("listen = \"nowhere\"", "listen"),
            ("state_dir = \"rel\"", "state_dir"),
            (
                "[api]\ngateway_allowed_origins = [\"console.example\"]",
                "api.gateway_allowed_origins",
            ),
            ("[worker]\nmax_attempts = 0", "worker.max_attempts"),
            (
                "[worker]\nbackoff_initial_ms = 9000\nbackoff_max_ms = 10",
                "worker.backoff_initial_ms",
            ),
            ("[ssh]\nmax_parallel_hosts = 0", "ssh.max_parallel_hosts"),
            (
                "[ssh]\nmax_sessions_per_host = 0",
                "ssh.max_sessions_per_host",
            ),
            (
                "[ssh]\nmax_sessions_per_host = 257",
                "ssh.max_sessions_per_host",
            ),
            (
                "[ssh]\nsession_idle_timeout_seconds = 0",
                "ssh.session_idle_timeout_seconds",
            ),
            (
                "[ssh]\nsession_max_age_seconds = 0",
                "ssh.session_max_age_seconds",
            ),
            ("listen = \"0.0.0.0:7300\"", "listen"),
            ("listen = \"192.0.2.1:7300\"", "listen"),
            ("[worker]\nparallelism = 0", "worker.parallelism"),
            (
                "[worker]\nyield_parallelism = 0",
                "worker.yield_parallelism",
            ),
            (
                "[worker]\nparallelism = 4\nyield_parallelism = 5",
                "worker.yield_parallelism",
            ),
            (
                "[api]\nmax_concurrent_requests = 0",
                "api.max_concurrent_requests",
            ),
            (
                "[api]\nheader_timeout_seconds = 0",
                "api.header_timeout_seconds",
            ),
            (
                "[api]\nbody_timeout_seconds = 0",
                "api.body_timeout_seconds",
            ),
            (
                "[api]\nmax_concurrent_requests = 8\nadmin_reserved_requests = 8",
                "api.admin_reserved_requests",
            ),
            (
                "[api]\ntoken_concurrent_requests = 0",
                "api.token_concurrent_requests",
            ),
            (
                "[api]\nunauthenticated_concurrent_requests = 0",
                "api.unauthenticated_concurrent_requests",
            ),
            (
                "[api]\ntoken_requests_per_minute = 0",
                "api.token_requests_per_minute",
            ),
        ] {
            match Config::parse(text, "occ.toml") {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let c = Config::parse(
            "listen = \"0.0.0.0:7300\"\n[api]\nallow_plaintext_listen = true",
            "occ.toml",
        )
        .unwrap();
        assert!(c.api.allow_plaintext_listen);
        assert_eq!(c.worker.parallelism, 16);
        // The default yield share is the store's: SQLite here (no `database`), PostgreSQL
        // with one; a given one is kept on either.
        assert_eq!(c.worker.yield_parallelism, YIELD_PARALLELISM_SQLITE);
        let pg = "database = \"postgres://occ@db.example/occ?sslmode=require\"\n";
        let on_pg = Config::parse(pg, "occ.toml").unwrap();
        assert_eq!(on_pg.worker.yield_parallelism, YIELD_PARALLELISM_POSTGRES);
        let given =
            Config::parse(&format!("{pg}[worker]\nyield_parallelism = 16"), "occ.toml").unwrap();
        assert_eq!(given.worker.yield_parallelism, 16);
        // The default yield share never exceeds a smaller parallelism.
        let small = Config::parse("[worker]\nparallelism = 1", "occ.toml").unwrap();
        assert_eq!(small.worker.yield_parallelism, 1);
        let given = Config::parse("[worker]\nyield_parallelism = 16", "occ.toml").unwrap();
        assert_eq!(given.worker.yield_parallelism, 16);
        assert!(matches!(
            Config::parse("bogus = 1", "x"),
            Err(ConfigError::Syntax { .. })
        ));
    }
}
