//! The configuration file watched and applied live, as OpenClaw's `hybrid` reload mode does
//! (issue 28): the gateway re-reads `OPENCLAW_CONFIG_PATH` when the file there is replaced,
//! applies a change that leaves `gateway`, `secrets` and `x-clawfleet-test` (its switches)
//! alone without a restart, and for any other change ends its sessions with 1012 and exits 0
//! so its supervisor restarts it (OpenClaw restarts itself then, closing its clients with
//! 1012 too). hostd replaces the file just before it restarts the unit on such a revision, so
//! either this or the stop's SIGTERM comes first, and clients see 1012 either way. `config.get` reports what it read and what it applied,
//! with OpenClaw's field names (`raw`, `valid`, `configRevisionHash`, `appliedConfigHash`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::sha256_hex;

/// How often the file is looked at unless the configuration says (`configPollMs`). One
/// `stat` per tick.
pub const POLL: Duration = Duration::from_millis(100);
/// The top-level keys whose change needs a restart here.
const RESTART_KEYS: &[&str] = &["gateway", "secrets", "x-clawfleet-test"];

/// What the gateway read last and what it applied.
#[derive(Debug)]
pub struct LiveConfig {
    path: PathBuf,
    state: Mutex<Read>,
}

#[derive(Debug, Clone)]
struct Read {
    raw: Vec<u8>,
    valid: bool,
    read_sha256: String,
    applied_sha256: String,
    applied: Value,
    reloads: u64,
}

fn lock(m: &Mutex<Read>) -> MutexGuard<'_, Read> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LiveConfig {
    /// The configuration the gateway started with.
    pub fn new(path: PathBuf, raw: Vec<u8>) -> Arc<LiveConfig> {
        let sha = sha256_hex(&raw);
        let applied = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        Arc::new(LiveConfig {
            path,
            state: Mutex::new(Read {
                raw,
                valid: true,
                read_sha256: sha.clone(),
                applied_sha256: sha,
                applied,
                reloads: 0,
            }),
        })
    }

    /// The sha256 of the configuration in effect.
    pub fn applied_sha256(&self) -> String {
        lock(&self.state).applied_sha256.clone()
    }

    /// How many changes were applied without a restart.
    pub fn reloads(&self) -> u64 {
        lock(&self.state).reloads
    }

    /// `config.get`'s answer.
    pub fn get(&self) -> Value {
        let s = lock(&self.state);
        json!({
            "path": self.path.to_string_lossy(),
            "exists": true,
            "raw": String::from_utf8_lossy(&s.raw),
            "valid": s.valid,
            "issues": if s.valid { json!([]) } else { json!(["not a JSON object"]) },
            "configRevisionHash": format!("sha256:{}", s.read_sha256),
            "appliedConfigHash": format!("sha256:{}", s.applied_sha256),
        })
    }

    /// Looks at the file every `poll` from a thread of its own; `restart` ends the process
    /// for a change that needs a restart.
    pub fn watch(self: &Arc<Self>, poll: Duration, restart: impl Fn() + Send + 'static) {
        let me = Arc::clone(self);
        // Taken now, and compared by content once: a file replaced between the start's read
        // and this point is not missed.
        let mut seen = self.stamp();
        let spawned = std::thread::Builder::new().spawn(move || {
            let mut changed = true;
            loop {
                if changed && me.reread() == Reread::Restart {
                    restart();
                }
                std::thread::sleep(poll);
                let now = me.stamp();
                changed = now != seen;
                seen = now;
            }
        });
        if let Err(e) = spawned {
            eprintln!(
                "clawfleet-test-gateway: cannot start the configuration watch ({e}); changes apply at the next start"
            );
        }
    }

    /// What identifies the file now: a replaced file has a new inode; an edited one a new
    /// modification time or size.
    fn stamp(&self) -> Option<(u64, i64, i64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&self.path).ok()?;
        Some((m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
    }

    fn reread(&self) -> Reread {
        let Ok(raw) = std::fs::read(&self.path) else {
            return Reread::Kept;
        };
        let mut s = lock(&self.state);
        if raw == s.raw {
            return Reread::Kept;
        }
        let sha = sha256_hex(&raw);
        let parsed: Option<Value> = serde_json::from_slice(&raw).ok().filter(Value::is_object);
        let Some(config) = parsed else {
            // OpenClaw keeps its last good configuration and reports the file as invalid.
            eprintln!("clawfleet-test-gateway: config reload skipped (invalid config)");
            s.raw = raw;
            s.valid = false;
            s.read_sha256 = sha;
            return Reread::Kept;
        };
        if let Some(key) = RESTART_KEYS
            .iter()
            .find(|k| config.get(**k) != s.applied.get(**k))
        {
            eprintln!("clawfleet-test-gateway: config change at {key} needs a restart");
            return Reread::Restart;
        }
        s.raw = raw;
        s.valid = true;
        s.read_sha256 = sha.clone();
        s.applied_sha256 = sha;
        s.applied = config;
        s.reloads += 1;
        eprintln!(
            "clawfleet-test-gateway: config hot reload applied ({} so far)",
            s.reloads
        );
        Reread::Applied
    }
}

/// What a re-read of the file did.
#[derive(Debug, PartialEq, Eq)]
enum Reread {
    /// Nothing new, or a file that is not valid (the last good one stays).
    Kept,
    Applied,
    Restart,
}
