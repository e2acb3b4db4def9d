//! Ctrl-C / SIGTERM / SIGHUP: tear down this process's hosts before exiting, because a killed
//! test run would otherwise leave booted containers until the next run reclaims them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::slot;

#[derive(Debug, Clone)]
struct Registered {
    record_path: PathBuf,
    shutdown_timeout: Duration,
}

static LIVE: Mutex<BTreeMap<u32, Registered>> = Mutex::new(BTreeMap::new());
static INSTALL: Once = Once::new();

fn live() -> MutexGuard<'static, BTreeMap<u32, Registered>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records that this process owns slot `n` (its record file says what to remove).
pub(crate) fn register(n: u32, record_path: PathBuf, shutdown_timeout: Duration) {
    INSTALL.call_once(install);
    live().insert(
        n,
        Registered {
            record_path,
            shutdown_timeout,
        },
    );
}

pub(crate) fn unregister(n: u32) {
    live().remove(&n);
}

fn install() {
    match Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(mut signals) => {
            let spawned = std::thread::Builder::new()
                .name("clawfleet-vm-tests-signals".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        eprintln!("clawfleet-vm-tests: signal {sig}: tearing down test hosts");
                        teardown_all();
                        std::process::exit(128 + sig);
                    }
                });
            if let Err(e) = spawned {
                eprintln!(
                    "clawfleet-vm-tests: no signal handler thread ({e}); run `vmhosts clean` after Ctrl-C"
                );
            }
        }
        Err(e) => eprintln!(
            "clawfleet-vm-tests: cannot install signal handlers ({e}); run `vmhosts clean` after Ctrl-C"
        ),
    }
}

/// Tears down every registered host from its on-disk record, in parallel.
fn teardown_all() {
    let entries: Vec<(u32, Registered)> = live().iter().map(|(k, v)| (*k, v.clone())).collect();
    std::thread::scope(|s| {
        for (n, reg) in &entries {
            s.spawn(move || match slot::read_record(&reg.record_path) {
                Ok(Some(rec)) => {
                    // Be quick: the user is waiting, and an unclean guest poweroff is harmless.
                    let limit = reg.shutdown_timeout.min(Duration::from_secs(5));
                    match slot::teardown(&rec, None, limit) {
                        Ok(()) => {
                            let _ = std::fs::remove_file(&reg.record_path);
                        }
                        Err(e) => eprintln!("clawfleet-vm-tests: slot {n}: {e}"),
                    }
                }
                Ok(None) => {}
                Err(e) => eprintln!("clawfleet-vm-tests: slot {n}: {e}"),
            });
        }
    });
}
