//! An in-memory [`System`] for unit tests: accounts, units and readiness as plain data, and a
//! log of every privileged call so tests can assert what happened (or that nothing did).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::system::{
    Ids, JournalQuery, JournalRecord, JournalStart, System, SystemError, UnitRuntime, UnitState,
};

/// How a fake unit behaves when started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Behaviour {
    /// Starts and answers /readyz with 200.
    #[default]
    Ready,
    /// Starts but never answers 200.
    NeverReady,
    /// Exits with status 78 at start (configuration error).
    ExitConfig,
    /// Exits with status 1 soon after every start; systemd keeps restarting it.
    CrashLoop,
}

#[derive(Debug, Default)]
struct State {
    users: BTreeMap<String, Ids>,
    groups: BTreeMap<String, u32>,
    units: BTreeMap<String, UnitState>,
    behaviour: BTreeMap<u16, Behaviour>,
    unit_ports: BTreeMap<String, u16>,
    calls: Vec<String>,
    /// Reads that the real layer makes over D-Bus (unit state, runtime, version).
    bus_reads: usize,
    fail_next: BTreeSet<&'static str>,
    squatters: BTreeMap<u16, u32>,
    /// Every unit's journal, oldest first, as (unit, entry).
    journal: Vec<(String, JournalRecord)>,
    /// Each unit's invocation count: a (re)start begins a new run.
    invocations: BTreeMap<String, u32>,
    clock_usec: u64,
    /// Whether a unit file that appears is loaded when referenced, without `daemon-reload`
    /// (systemd 246 and later); off, every new unit file needs a reload.
    loads_new_units: bool,
    /// Behaviour by revision directory name, over the port's (a candidate that fails while
    /// its predecessor works).
    revision_behaviour: BTreeMap<String, Behaviour>,
    /// [`FakeSystem::set_netns_support`].
    netns: bool,
    /// [`FakeSystem::remove_netns`].
    netns_gone: bool,
    /// The revision directory each unit was last started on (from its `current`).
    unit_revision: BTreeMap<String, String>,
    /// Units whose gateway a relaunch stopped, by the launcher's pid, until it starts again.
    relaunching: BTreeMap<String, u32>,
    /// What each unit's live configuration file held when a relaunch last stopped its
    /// gateway: the last the old gateway could see.
    config_at_relaunch_stop: BTreeMap<String, String>,
}

impl State {
    /// How the gateway a unit runs behaves: its revision's, else its port's.
    fn behaviour_of(&self, unit: &str, port: u16) -> Behaviour {
        self.unit_revision
            .get(unit)
            .and_then(|r| self.revision_behaviour.get(r))
            .or_else(|| self.behaviour.get(&port))
            .copied()
            .unwrap_or_default()
    }
}

/// The fake.
#[derive(Debug, Default)]
pub struct FakeSystem {
    state: Mutex<State>,
    unit_dir: PathBuf,
}

impl FakeSystem {
    /// An empty host whose units live in `unit_dir`: starting a unit reads its
    /// `OPENCLAW_GATEWAY_PORT` from the file there, as a gateway would. Accounts get the ids
    /// hostd asks for (`crate::uids`).
    pub fn new(unit_dir: &Path) -> Self {
        Self {
            state: Mutex::default(),
            unit_dir: unit_dir.to_path_buf(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    fn log(&self, call: String) {
        self.with(|s| s.calls.push(call));
    }

    fn injected(&self, what: &'static str) -> bool {
        self.with(|s| s.fail_next.remove(what))
    }

    /// Every privileged call so far, like `restart clawfleet-agent-….service`.
    pub fn calls(&self) -> Vec<String> {
        self.with(|s| s.calls.clone())
    }

    /// Behave like a host that gives each Agent a network namespace of its own (issue 28):
    /// the gateway of a unit that joins one listens there, and its port on the host is held
    /// by root (the Agent's socket unit).
    pub fn set_netns_support(&self, on: bool) {
        self.with(|s| s.netns = on);
    }

    /// Every Agent's network namespace disappears (its net unit stopped by hand); `false`
    /// brings them back.
    pub fn remove_netns(&self, gone: bool) {
        self.with(|s| s.netns_gone = gone);
    }

    /// Behave like a systemd that loads a new unit file when it is referenced.
    pub fn set_loads_new_units(&self, on: bool) {
        self.with(|s| s.loads_new_units = on);
    }

    /// Forgets the call log and the read count.
    pub fn clear_calls(&self) {
        self.with(|s| {
            s.calls.clear();
            s.bus_reads = 0;
        });
    }

    /// How many reads the real layer would make over D-Bus (`unit_state`, `unit_runtime`,
    /// `systemd_version`) since the last [`FakeSystem::clear_calls`]; [`FakeSystem::calls`]
    /// has every change.
    pub fn bus_reads(&self) -> usize {
        self.with(|s| s.bus_reads)
    }

    /// Adds an account that hostd did not create (to test refusal of foreign accounts).
    pub fn add_foreign_user(&self, name: &str, ids: Ids) {
        self.with(|s| {
            s.users.insert(name.to_owned(), ids);
            s.groups.insert(name.to_owned(), ids.gid);
        });
    }

    /// Makes the next call of `what` (e.g. "groupdel", "restart") fail once.
    pub fn fail_next(&self, what: &'static str) {
        self.with(|s| {
            s.fail_next.insert(what);
        });
    }

    /// Tells the fake which port a unit's gateway listens on (hostd tests read it from the
    /// unit file they just wrote) and how it behaves.
    /// A unit already running on that port follows at once, as a real gateway would at its
    /// next (re)start by systemd: `ExitConfig` leaves it failed with status 78, `Ready` and
    /// `NeverReady` bring a crash-looping one up.
    pub fn set_behaviour(&self, port: u16, behaviour: Behaviour) {
        self.with(|s| {
            s.behaviour.insert(port, behaviour);
            let units: Vec<String> = s
                .unit_ports
                .iter()
                .filter(|(_, p)| **p == port)
                .map(|(u, _)| u.clone())
                .collect();
            for name in units {
                let Some(u) = s.units.get_mut(&name) else {
                    continue;
                };
                if u.active_state == "inactive" || !u.loaded {
                    continue;
                }
                match behaviour {
                    Behaviour::ExitConfig => {
                        u.active_state = "failed".to_owned();
                        u.sub_state = "failed".to_owned();
                        u.exec_main_status = 78;
                    }
                    Behaviour::Ready | Behaviour::NeverReady if u.active_state == "activating" => {
                        u.active_state = "active".to_owned();
                        u.sub_state = "running".to_owned();
                        u.exec_main_status = 0;
                    }
                    _ => {}
                }
            }
        });
    }

    /// Appends a line to a unit's journal, written by its gateway in the current run.
    pub fn log_line(&self, unit: &str, message: &str) {
        self.with(|s| {
            let run = s.invocations.get(unit).copied().unwrap_or(0);
            push_entry(s, unit, message, false, run);
        });
    }

    /// Appends an entry journald cut at its line limit (the line goes on in the next).
    pub fn log_cut(&self, unit: &str, message: &str) {
        self.with(|s| {
            let run = s.invocations.get(unit).copied().unwrap_or(0);
            push_entry(s, unit, message, false, run);
            if let Some((_, record)) = s.journal.last_mut() {
                record.cut = true;
            }
        });
    }

    /// The current run's invocation id of a unit (what `InvocationID` would say).
    pub fn invocation_of(&self, unit: &str) -> Option<String> {
        self.with(|s| s.invocations.get(unit).map(|n| invocation_id(unit, *n)))
    }

    /// Makes the gateway of one revision (by its directory name under `revisions/`) behave so,
    /// whatever its port's behaviour.
    pub fn set_revision_behaviour(&self, revision_dir: &str, behaviour: Behaviour) {
        self.with(|s| {
            s.revision_behaviour
                .insert(revision_dir.to_owned(), behaviour)
        });
    }

    /// The revision directory `current` names for a unit, from its unit file.
    fn current_revision_of(&self, unit: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.unit_dir.join(unit)).ok()?;
        let config = text
            .lines()
            .find_map(|l| l.strip_prefix("Environment=OPENCLAW_CONFIG_PATH="))?;
        // `<agent dir>/config/openclaw.json`: `current` is beside `config`.
        let current = Path::new(config).parent()?.parent()?.join("current");
        let target = std::fs::read_link(current).ok()?;
        Some(target.file_name()?.to_str()?.to_owned())
    }

    /// What a unit's live configuration file (its `OPENCLAW_CONFIG_PATH`) holds now.
    fn live_config_of(&self, unit: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.unit_dir.join(unit)).ok()?;
        let config = text
            .lines()
            .find_map(|l| l.strip_prefix("Environment=OPENCLAW_CONFIG_PATH="))?;
        std::fs::read_to_string(config).ok()
    }

    /// What a unit's live configuration file held when a relaunch last stopped its gateway.
    pub fn config_at_relaunch_stop(&self, unit: &str) -> Option<String> {
        self.with(|s| s.config_at_relaunch_stop.get(unit).cloned())
    }

    /// How many restart jobs a unit got so far.
    pub fn restarts(&self, unit: &str) -> usize {
        let call = format!("restart {unit}");
        self.with(|s| s.calls.iter().filter(|c| **c == call).count())
    }

    /// A unit's current fake state.
    pub fn unit(&self, unit: &str) -> UnitState {
        self.with(|s| s.units.get(unit).cloned().unwrap_or_default())
    }

    /// Another uid listens on `port` and answers /readyz with 200 (a squatter).
    pub fn set_squatter(&self, port: u16, uid: u32) {
        self.with(|s| s.squatters.insert(port, uid));
    }

    /// The squatter leaves the port.
    pub fn clear_squatter(&self, port: u16) {
        self.with(|s| s.squatters.remove(&port));
    }

    /// Whether an account exists.
    pub fn has_user(&self, name: &str) -> bool {
        self.with(|s| s.users.contains_key(name))
    }

    /// Whether a group exists.
    pub fn has_group(&self, name: &str) -> bool {
        self.with(|s| s.groups.contains_key(name))
    }

    fn port_of(&self, unit: &str) -> Option<u16> {
        let text = std::fs::read_to_string(self.unit_dir.join(unit)).ok()?;
        let port = text
            .lines()
            .find_map(|l| l.strip_prefix("Environment=OPENCLAW_GATEWAY_PORT="))?
            .parse()
            .ok()?;
        self.with(|s| s.unit_ports.insert(unit.to_owned(), port));
        Some(port)
    }
}

fn relaunch_refused(unit: &str, detail: &str) -> SystemError {
    SystemError::Relaunch {
        unit: unit.to_owned(),
        detail: detail.to_owned(),
    }
}

/// A stable 32-hex invocation id for run `n` of a unit.
fn invocation_id(unit: &str, n: u32) -> String {
    let key = format!("{unit}#{n}");
    let mut h: u128 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u128::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:032x}")
}

fn push_entry(s: &mut State, unit: &str, message: &str, supervisor: bool, run: u32) {
    s.clock_usec += 1000;
    let n = s.journal.len();
    s.journal.push((
        unit.to_owned(),
        JournalRecord {
            cursor: format!("fake;i={n}"),
            realtime_usec: 1_767_225_600_000_000 + s.clock_usec,
            message: message.to_owned(),
            from_supervisor: supervisor,
            cut: false,
            invocation: Some(invocation_id(unit, run)),
            exit: (supervisor && message.starts_with("Main process exited"))
                .then(|| ("exited".to_owned(), 1)),
        },
    ));
}

fn fail(action: &'static str, unit: &str) -> SystemError {
    SystemError::Systemd {
        action,
        unit: unit.to_owned(),
        detail: "injected failure".to_owned(),
    }
}

impl System for FakeSystem {
    fn user(&self, name: &str) -> Result<Option<Ids>, SystemError> {
        Ok(self.with(|s| s.users.get(name).copied()))
    }

    fn group(&self, name: &str) -> Result<Option<u32>, SystemError> {
        Ok(self.with(|s| s.groups.get(name).copied()))
    }

    fn id_in_use(&self, id: u32) -> Result<bool, SystemError> {
        Ok(self
            .with(|s| s.users.values().any(|i| i.uid == id) || s.groups.values().any(|g| *g == id)))
    }

    fn create_account(&self, name: &str, home: &Path, id: u32) -> Result<Ids, SystemError> {
        self.log(format!(
            "create-account {name} id={id} home={}",
            home.display()
        ));
        if self.injected("useradd") {
            return Err(SystemError::AccountTool {
                tool: "useradd",
                account: name.to_owned(),
                detail: "injected failure".to_owned(),
            });
        }
        Ok(self.with(|s| {
            let ids = Ids { uid: id, gid: id };
            s.users.insert(name.to_owned(), ids);
            s.groups.insert(name.to_owned(), id);
            ids
        }))
    }

    fn delete_user(&self, name: &str) -> Result<(), SystemError> {
        self.log(format!("userdel {name}"));
        if self.injected("userdel") {
            return Err(SystemError::AccountTool {
                tool: "userdel",
                account: name.to_owned(),
                detail: "injected failure".to_owned(),
            });
        }
        self.with(|s| s.users.remove(name));
        Ok(())
    }

    fn delete_group(&self, name: &str) -> Result<(), SystemError> {
        self.log(format!("groupdel {name}"));
        if self.injected("groupdel") {
            return Err(SystemError::AccountTool {
                tool: "groupdel",
                account: name.to_owned(),
                detail: "injected failure".to_owned(),
            });
        }
        self.with(|s| s.groups.remove(name));
        Ok(())
    }

    fn chown(&self, _path: &Path, _ids: Ids) -> Result<(), SystemError> {
        Ok(())
    }

    fn daemon_reload(&self) -> Result<(), SystemError> {
        self.log("daemon-reload".to_owned());
        if self.injected("daemon-reload") {
            return Err(fail("reload", "manager"));
        }
        Ok(())
    }

    fn enable_unit(&self, unit: &str) -> Result<(), SystemError> {
        self.log(format!("enable {unit}"));
        self.with(|s| {
            let u = s.units.entry(unit.to_owned()).or_default();
            u.enabled = true;
            u.loaded = true;
        });
        Ok(())
    }

    fn disable_unit(&self, unit: &str) -> Result<(), SystemError> {
        self.log(format!("disable {unit}"));
        self.with(|s| {
            if let Some(u) = s.units.get_mut(unit) {
                u.enabled = false;
            }
        });
        Ok(())
    }

    fn restart_unit(&self, unit: &str, _timeout: Duration) -> Result<(), SystemError> {
        self.log(format!("restart {unit}"));
        if self.injected("restart") {
            return Err(fail("restart", unit));
        }
        if unit.starts_with("clawfleet-net-") || unit.starts_with("clawfleet-front-") {
            return self.start_unit(unit, _timeout);
        }
        let Some(port) = self.port_of(unit) else {
            return Err(fail("restart", unit));
        };
        let revision = self.current_revision_of(unit);
        let behaviour = self.with(|s| {
            match revision {
                Some(r) => s.unit_revision.insert(unit.to_owned(), r),
                None => s.unit_revision.remove(unit),
            };
            s.behaviour_of(unit, port)
        });
        self.with(|s| {
            let run = s.invocations.get(unit).map_or(1, |n| n + 1);
            s.invocations.insert(unit.to_owned(), run);
            push_entry(s, unit, &format!("Started {unit}."), true, run);
            let u = s.units.entry(unit.to_owned()).or_default();
            u.loaded = true;
            match behaviour {
                Behaviour::ExitConfig => {
                    u.active_state = "failed".to_owned();
                    u.sub_state = "failed".to_owned();
                    u.exec_main_status = 78;
                }
                _ => {
                    u.active_state = "active".to_owned();
                    u.sub_state = "running".to_owned();
                    u.exec_main_status = 0;
                }
            }
        });
        Ok(())
    }

    fn stop_for_relaunch(&self, unit: &str, _timeout: Duration) -> Result<u32, SystemError> {
        self.log(format!("relaunch {unit}"));
        let refuse = |detail: &str| relaunch_refused(unit, detail);
        if self.injected("relaunch") {
            return Err(refuse("injected failure"));
        }
        if !self.unit_state(unit)?.is_active() {
            return Err(refuse("nothing runs"));
        }
        if self.port_of(unit).is_none() {
            return Err(refuse("no port"));
        }
        let seen = self.live_config_of(unit).unwrap_or_default();
        Ok(self.with(|s| {
            let launcher = 4000 + s.invocations.get(unit).copied().unwrap_or(0);
            s.relaunching.insert(unit.to_owned(), launcher);
            s.config_at_relaunch_stop.insert(unit.to_owned(), seen);
            launcher
        }))
    }

    fn start_relaunched(&self, unit: &str, launcher: u32) -> Result<(), SystemError> {
        self.log(format!("relaunch-start {unit}"));
        let refuse = |detail: &str| relaunch_refused(unit, detail);
        if self.injected("relaunch-start") {
            return Err(refuse("injected failure"));
        }
        if self.with(|s| s.relaunching.remove(unit)) != Some(launcher) {
            return Err(refuse("not stopped for a relaunch by this launcher"));
        }
        let Some(port) = self.port_of(unit) else {
            return Err(refuse("no port"));
        };
        // The same unit run (no "Started", the same invocation): only the gateway is new, and
        // the launcher says so in the unit's journal.
        let revision = self.current_revision_of(unit);
        self.with(|s| {
            let run = s.invocations.get(unit).copied().unwrap_or(0);
            let line = format!(
                "{} (start {})",
                crate::supervise::RELAUNCHED,
                2 + s.journal.len()
            );
            push_entry(s, unit, &line, false, run);
            match revision {
                Some(r) => s.unit_revision.insert(unit.to_owned(), r),
                None => s.unit_revision.remove(unit),
            };
            let behaviour = s.behaviour_of(unit, port);
            let u = s.units.entry(unit.to_owned()).or_default();
            if matches!(behaviour, Behaviour::ExitConfig) {
                u.active_state = "failed".to_owned();
                u.sub_state = "failed".to_owned();
                u.exec_main_status = 78;
            }
        });
        Ok(())
    }

    fn stop_unit(&self, unit: &str, _timeout: Duration) -> Result<(), SystemError> {
        self.log(format!("stop {unit}"));
        self.with(|s| {
            if let Some(u) = s.units.get_mut(unit) {
                u.active_state = "inactive".to_owned();
                u.sub_state = "dead".to_owned();
            }
        });
        Ok(())
    }

    fn reset_failed_unit(&self, unit: &str) -> Result<(), SystemError> {
        self.log(format!("reset-failed {unit}"));
        self.with(|s| {
            if let Some(u) = s.units.get_mut(unit)
                && u.active_state == "failed"
            {
                u.active_state = "inactive".to_owned();
                u.sub_state = "dead".to_owned();
            }
        });
        Ok(())
    }

    fn unit_file_loaded(&self, unit: &str, file: &Path) -> Result<bool, SystemError> {
        self.with(|s| s.bus_reads += 1);
        Ok(self.with(|s| s.loads_new_units) && file == self.unit_dir.join(unit) && file.is_file())
    }

    fn unit_state(&self, unit: &str) -> Result<UnitState, SystemError> {
        self.with(|s| s.bus_reads += 1);
        let port = self.with(|s| s.unit_ports.get(unit).copied());
        let crashing =
            port.is_some_and(|p| self.with(|s| s.behaviour_of(unit, p) == Behaviour::CrashLoop));
        if crashing {
            // Every look finds one more restart, as a crash loop under Restart=always would.
            self.with(|s| {
                let run = s.invocations.get(unit).copied().unwrap_or(0);
                push_entry(s, unit, "gateway: fatal: cannot start", false, run);
                push_entry(
                    s,
                    unit,
                    "Main process exited, code=exited, status=1/FAILURE",
                    true,
                    run,
                );
                s.invocations.insert(unit.to_owned(), run + 1);
                if let Some(u) = s.units.get_mut(unit) {
                    u.n_restarts += 1;
                    u.active_state = "activating".to_owned();
                    u.sub_state = "auto-restart".to_owned();
                    u.exec_main_status = 1;
                }
            });
        }
        Ok(self.unit(unit))
    }

    fn systemd_version(&self) -> Result<String, SystemError> {
        self.with(|s| s.bus_reads += 1);
        Ok("252 (fake)".to_owned())
    }

    fn probe_ready(&self, port: u16, _timeout: Duration) -> bool {
        self.with(|s| {
            if s.squatters.contains_key(&port) {
                return true;
            }
            s.unit_ports
                .iter()
                .filter(|(_, p)| **p == port)
                .any(|(u, _)| {
                    s.units.get(u).is_some_and(|u| u.active_state == "active")
                        && s.behaviour_of(u, port) == Behaviour::Ready
                })
        })
    }

    fn netns_support(&self) -> Result<(), String> {
        if self.with(|s| s.netns) {
            Ok(())
        } else {
            Err("the fake system has no network namespaces".into())
        }
    }

    fn netns_held(&self, _net_unit: &str) -> bool {
        !self.with(|s| s.netns_gone)
    }

    fn reload_unit(&self, unit: &str, _timeout: Duration) -> Result<(), SystemError> {
        self.log(format!("reload {unit}"));
        if self.injected("reload") {
            return Err(fail("reload", unit));
        }
        Ok(())
    }

    fn start_unit(&self, unit: &str, _timeout: Duration) -> Result<(), SystemError> {
        self.log(format!("start {unit}"));
        self.with(|s| {
            let u = s.units.entry(unit.to_owned()).or_default();
            u.loaded = true;
            u.active_state = "active".to_owned();
            u.sub_state = "listening".to_owned();
        });
        Ok(())
    }

    fn listeners(
        &self,
        port: u16,
        netns: Option<&str>,
    ) -> Result<Vec<crate::listener::Listener>, SystemError> {
        // An active unit's gateway listens as the unit's User=.
        let units: Vec<String> = self.with(|s| {
            s.unit_ports
                .iter()
                .filter(|(u, p)| {
                    **p == port && s.units.get(*u).is_some_and(|u| u.active_state == "active")
                })
                .map(|(u, _)| u.clone())
                .collect()
        });
        let mut out = Vec::new();
        for unit in units {
            let text = std::fs::read_to_string(self.unit_dir.join(&unit)).unwrap_or_default();
            let own_netns = text.contains("\nJoinsNamespaceOf=");
            match (own_netns, netns.is_some()) {
                // The gateway listens in its own namespace; on the host, root's socket unit.
                (true, false) => {
                    out.push(crate::listener::Listener { uid: 0, inode: 3 });
                    continue;
                }
                (false, true) => continue,
                _ => {}
            }
            let user = text.lines().find_map(|l| l.strip_prefix("User="));
            if let Some(ids) = user.and_then(|u| self.with(|s| s.users.get(u).copied())) {
                out.push(crate::listener::Listener {
                    uid: ids.uid,
                    inode: 1,
                });
            }
        }
        if netns.is_none()
            && let Some(uid) = self.with(|s| s.squatters.get(&port).copied())
        {
            out.push(crate::listener::Listener { uid, inode: 2 });
        }
        Ok(out)
    }

    fn missing_tools(&self) -> Vec<String> {
        Vec::new()
    }

    fn unit_runtime(&self, unit: &str) -> Result<UnitRuntime, SystemError> {
        self.with(|s| s.bus_reads += 1);
        let state = self.unit_state(unit)?;
        let running = state.is_active();
        let run = self.with(|s| s.invocations.get(unit).copied());
        Ok(UnitRuntime {
            main_pid: if running { 4000 + run.unwrap_or(0) } else { 0 },
            exec_main_code: if state.exec_main_status != 0 { 1 } else { 0 },
            exec_main_start_usec: if running { 1_767_225_600_000_000 } else { 0 },
            result: if state.is_failed() {
                "exit-code"
            } else {
                "success"
            }
            .to_owned(),
            memory_current: running.then_some(64 << 20),
            tasks_current: running.then_some(7),
            invocation_id: run.map(|n| invocation_id(unit, n)).unwrap_or_default(),
            state,
            ..UnitRuntime::default()
        })
    }

    fn process_uid(&self, pid: u32) -> Option<u32> {
        // The running unit with this main pid runs as its unit file's User=.
        let units: Vec<(String, u32)> =
            self.with(|s| s.invocations.iter().map(|(u, n)| (u.clone(), *n)).collect());
        let (unit, _) = units.into_iter().find(|(_, n)| 4000 + n == pid)?;
        let text = std::fs::read_to_string(self.unit_dir.join(&unit)).ok()?;
        let user = text.lines().find_map(|l| l.strip_prefix("User="))?;
        self.with(|s| s.users.get(user).map(|ids| ids.uid))
    }

    fn read_journal(
        &self,
        query: &JournalQuery,
        _deadline: std::time::Instant,
        visit: &mut dyn FnMut(JournalRecord) -> bool,
    ) -> Result<(), SystemError> {
        let mut entries: Vec<JournalRecord> = self.with(|s| {
            s.journal
                .iter()
                .filter(|(u, r)| {
                    let (from, until) = query.span.unwrap_or((None, None));
                    u == &query.unit
                        && (!query.supervisor_only || r.from_supervisor)
                        && query
                            .invocation
                            .as_ref()
                            .is_none_or(|i| r.invocation.as_ref() == Some(i))
                        && query
                            .message_prefix
                            .is_none_or(|p| r.message.starts_with(p))
                        && from.is_none_or(|f| r.realtime_usec >= f)
                        && until.is_none_or(|t| r.realtime_usec < t)
                })
                .map(|(_, r)| r.clone())
                .collect()
        });
        match &query.start {
            JournalStart::Head => {}
            JournalStart::Tail { n, since } => {
                if let Some(since) = since {
                    entries.retain(|e| e.realtime_usec >= since * 1_000_000);
                }
                let skip = entries.len().saturating_sub(*n as usize);
                entries.drain(..skip);
            }
            JournalStart::Since(since) => entries.retain(|e| e.realtime_usec >= since * 1_000_000),
            JournalStart::After(cursor) => {
                let at = self
                    .with(|s| s.journal.iter().position(|(_, r)| &r.cursor == cursor))
                    .ok_or_else(|| SystemError::JournalCursor {
                        detail: "no such cursor".to_owned(),
                    })?;
                let position = |c: &str| {
                    c.strip_prefix("fake;i=")
                        .and_then(|n| n.parse::<usize>().ok())
                };
                entries.retain(|e| position(&e.cursor).is_some_and(|n| n > at));
            }
        }
        if query.reverse {
            entries.reverse();
        }
        for e in entries {
            if !visit(e) {
                break;
            }
        }
        Ok(())
    }
}

/// Why [`test_config`] could not set a test host up.
#[derive(Debug, thiserror::Error)]
pub enum TestConfigError {
    #[error("cannot create the test host's files: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// A validated hostd configuration for running the engine over [`FakeSystem`] in tests:
/// `text` (hostd.toml) parsed, then the state root, unit directory (`dir/units`, created) and
/// gateway command (`dir/gw`, an executable that exits 0, followed by `gateway_args`) pointed
/// into `dir`. hostd refuses state roots under /tmp, which a unit's PrivateTmp would hide;
/// no real unit runs here, so any `dir` works, wherever the checkout or TMPDIR is.
pub fn test_config(
    dir: &Path,
    text: &str,
    gateway_args: &[&str],
) -> Result<crate::config::Config, TestConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let units = dir.join("units");
    std::fs::create_dir_all(&units)?;
    let gateway = dir.join("gw");
    std::fs::write(&gateway, "#!/bin/sh\nexit 0\n")?;
    std::fs::set_permissions(&gateway, std::fs::Permissions::from_mode(0o755))?;
    let mut config = crate::config::Config::parse(text, "test", || None)?;
    config.state_root = dir.join("state");
    config.unit_dir = units;
    config.hooks_dir = dir.join("hooks.d");
    config.gateway_command = std::iter::once(gateway.display().to_string())
        .chain(gateway_args.iter().map(|a| (*a).to_owned()))
        .collect();
    Ok(config)
}
