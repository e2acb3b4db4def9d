//! Ctrl-C / SIGTERM / SIGHUP: tear down this process's control planes before exiting, because a
//! killed test run would otherwise leave etcd and the apiserver running until the next start
//! reclaims them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::run;

static LIVE: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
static INSTALL: Once = Once::new();

fn live() -> MutexGuard<'static, BTreeMap<String, PathBuf>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records that this process owns run `id` (its record file says what to stop and remove).
pub(crate) fn register(id: &str, record_path: PathBuf) {
    INSTALL.call_once(install);
    live().insert(id.to_string(), record_path);
}

pub(crate) fn unregister(id: &str) {
    live().remove(id);
}

fn install() {
    match Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(mut signals) => {
            let spawned = std::thread::Builder::new()
                .name("clawfleet-k8s-tests-signals".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        eprintln!("clawfleet-k8s-tests: signal {sig}: tearing down control planes");
                        teardown_all();
                        std::process::exit(128 + sig);
                    }
                });
            if let Err(e) = spawned {
                eprintln!(
                    "clawfleet-k8s-tests: no signal handler thread ({e}); run `k8scp clean` after Ctrl-C"
                );
            }
        }
        Err(e) => eprintln!(
            "clawfleet-k8s-tests: cannot install signal handlers ({e}); run `k8scp clean` after Ctrl-C"
        ),
    }
}

/// Tears down every registered run from its on-disk record, in parallel.
fn teardown_all() {
    let entries: Vec<(String, PathBuf)> =
        live().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    std::thread::scope(|s| {
        for (id, path) in &entries {
            s.spawn(move || match run::read_record(path) {
                Ok(Some(rec)) => match run::teardown(&rec, Duration::from_secs(3)) {
                    Ok(()) => {
                        let _ = std::fs::remove_file(path);
                        let _ = std::fs::remove_file(path.with_extension("lock"));
                        eprintln!(
                            "clawfleet-k8s-tests: control plane {id} stopped; logs in {}",
                            rec.logs_dir.display()
                        );
                    }
                    Err(e) => eprintln!("clawfleet-k8s-tests: {e}"),
                },
                Ok(None) => {}
                Err(e) => eprintln!("clawfleet-k8s-tests: {e}"),
            });
        }
    });
}
