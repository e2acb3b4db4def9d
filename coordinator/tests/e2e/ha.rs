//! Several coordinators on one PostgreSQL database, driving real test hosts (issue 13): three
//! `occ serve` processes deploy 30 Agents over three hosts and each revision is prepared and
//! activated once (counted in the hosts' own journals); the leader is killed and a follower
//! runs the singleton loops within one lease; the coordinator holding a claim is SIGKILLed
//! mid-activation and another finishes it after the lease; PostgreSQL restarts during a
//! deploy and nothing acknowledged is lost; and a fleet that started on SQLite moves to
//! PostgreSQL with `occ db migrate` and keeps converging.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clawfleet_pg_tests::TestPostgres;
use fleet::{Fleet, FleetOptions, NS, Want, document, journal_field};
use serde_json::{Value, json};

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}

/// The database and its owner role.
const DB: &str = "occ";

/// A PostgreSQL server with the role and database the coordinators use, and the password file
/// they read.
fn postgres(dir: &std::path::Path) -> (TestPostgres, String, std::path::PathBuf) {
    let pg = TestPostgres::start().expect("cannot start PostgreSQL");
    pg.create_role(DB, Some("ha-s3cret")).unwrap();
    pg.create_database_owned_by(DB, DB).unwrap();
    let file = dir.join("db-password");
    std::fs::write(&file, "ha-s3cret\n").unwrap();
    let url = pg.url(DB, DB);
    (pg, url, file)
}

fn options(url: &str, password_file: &std::path::Path) -> FleetOptions {
    FleetOptions {
        hosts: 3,
        coordinators: 3,
        database: Some(url.to_owned()),
        password_file: Some(password_file.to_owned()),
        // Leases long enough for a machine at a load of 8 (the worker's 3 s default of the
        // other suites lapsed there once, and a lapsed lease means a legitimate second run).
        extra_toml: "[leader]\nlease_ms = 4000\n[drift]\ninterval_seconds = 2\n".to_owned(),
        lease_seconds: 15,
        ..FleetOptions::default()
    }
}

fn sql(pg: &TestPostgres, query: &str) -> String {
    pg.psql_in(DB, query)
        .unwrap_or_else(|e| panic!("{query}: {e}"))
}

/// The pid in a lease owner (`<pid>@<host>:<ms>`).
fn owner_pid(owner: &str) -> u32 {
    owner
        .split('@')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("lease owner {owner:?} names no pid"))
}

/// `(holder, term)` of the leader lease.
fn leader(pg: &TestPostgres) -> (String, i64) {
    let row = sql(pg, "SELECT holder || '|' || term FROM leader");
    let (holder, term) = row
        .split_once('|')
        .unwrap_or_else(|| panic!("no leader row: {row:?}"));
    (holder.to_owned(), term.parse().unwrap())
}

/// Per (operation kind, Agent, revision): how many times hostd ran it to success on every
/// host since `since` (Unix seconds), and how many times it was received at all (a retry after
/// a retryable refusal such as LOCK_TIMEOUT is received again), from its journal: "operation
/// received" names the Agent and revision, "operation succeeded" the same operation id.
fn operations_per_revision(
    fleet: &Fleet,
    since: u64,
) -> BTreeMap<(String, String, String), (usize, usize)> {
    let mut out: BTreeMap<(String, String, String), (usize, usize)> = BTreeMap::new();
    for host in fleet.hosts.iter() {
        let text = host
            .run_ok(&format!(
                "journalctl -t hostd -o json --no-pager --since @{since}"
            ))
            .unwrap();
        let mut received: BTreeMap<String, (String, String, String)> = BTreeMap::new();
        let mut succeeded: Vec<String> = Vec::new();
        for line in text.lines() {
            let Ok(e) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(id) = journal_field(&e, "OPERATION_ID") else {
                continue;
            };
            match journal_field(&e, "MESSAGE") {
                Some("operation received") => {
                    if let (Some(op), Some(agent), Some(rev)) = (
                        journal_field(&e, "OP"),
                        journal_field(&e, "AGENT"),
                        journal_field(&e, "REVISION"),
                    ) {
                        let key = (op.to_owned(), agent.to_owned(), rev.to_owned());
                        out.entry(key.clone()).or_default().1 += 1;
                        received.insert(id.to_owned(), key);
                    }
                }
                Some("operation succeeded") => succeeded.push(id.to_owned()),
                _ => {}
            }
        }
        for id in succeeded {
            if let Some(key) = received.get(&id) {
                out.entry(key.clone()).or_default().0 += 1;
            }
        }
    }
    out
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn three_coordinators_share_one_fleet_and_survive_kills_and_a_database_restart() {
    clawfleet_vm_tests::skip_unless_hosts!();
    clawfleet_pg_tests::skip_unless_postgres!();
    let work = tempfile::tempdir().unwrap();
    let (pg, url, password_file) = postgres(work.path());
    let mut fleet = Fleet::start_with(options(&url, &password_file));

    // 1. Thirty Agents, their deploys sent to the three coordinators in turn: every revision
    // is prepared and activated exactly once over all hosts.
    let t = Instant::now();
    let since = now_unix();
    let agents: Vec<String> = (0..30).map(|i| format!("h{i:02}")).collect();
    for a in &agents {
        fleet.create_agent(a, &document(&format!("{a}-v1"), json!({})));
    }
    let mut wants = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let api = &fleet.apis[i % 3];
        let rev = api
            .request("POST", &format!("/namespaces/{NS}/agents/{a}/deploy"), None)
            .unwrap_or_else(|e| panic!("deploy of {a}: {e}"));
        wants.push((
            a.as_str(),
            Want::Running {
                rev: rev["id"].as_str().unwrap().to_owned(),
                label: format!("{a}-v1"),
            },
        ));
    }
    fleet.wait_converged(&wants, t, Duration::from_secs(240));
    // No activation ran twice. A retried item (after a retryable refusal such as LOCK_TIMEOUT
    // from a busy host lock) runs its idempotent prepare again, which changes nothing: every
    // extra prepare must follow such a refusal of the same revision.
    let ops = operations_per_revision(&fleet, since);
    let first: BTreeMap<&str, String> = wants
        .iter()
        .map(|(a, w)| match w {
            Want::Running { rev, .. } | Want::Stopped { rev } => (*a, rev.clone()),
        })
        .collect();
    let mut retried = 0;
    for a in &agents {
        let get = |op: &str| {
            ops.get(&(op.to_owned(), a.clone(), first[a.as_str()].clone()))
                .copied()
                .unwrap_or((0, 0))
        };
        let (activated, activations) = get("activate-revision");
        let (prepared, prepares) = get("prepare-revision");
        assert_eq!(
            activated, 1,
            "{a}: rev-1 activated {activated} times ({activations} received)"
        );
        let refused = (activations - activated) + (prepares - prepared);
        assert!(
            prepared >= 1 && prepared - 1 <= refused,
            "{a}: rev-1 prepared {prepared} times with {refused} refusals to explain the extra ones"
        );
        retried += refused;
    }
    eprintln!("every revision activated once; {retried} operations refused and retried");
    // The work spread over the coordinators (each logs the items it finished).
    let per_coordinator: Vec<usize> = (0..3)
        .map(|i| fleet.serve_log_lines_at(i, "REVISION_ACTIVATED").len())
        .collect();
    eprintln!("activations finished per coordinator: {per_coordinator:?}");
    assert!(
        per_coordinator.iter().filter(|n| **n > 0).count() >= 2,
        "the work did not spread: {per_coordinator:?}"
    );
    fleet::phase_done("30 Agents converged once over 3 coordinators", t);

    // 2. Kill the leader: a follower holds the lease within one lease (2 s, plus a renewal
    // period and slack on this busy machine), with a higher term, and runs the drift sweep.
    let t = Instant::now();
    let (holder, term) = leader(&pg);
    let dead = fleet
        .coordinator_of(owner_pid(&holder))
        .unwrap_or_else(|| panic!("the leader {holder} is none of our coordinators"));
    fleet.kill_serve_at(dead);
    let killed_at = Instant::now();
    let (new_holder, new_term) = loop {
        let (h, term_now) = leader(&pg);
        if h != holder {
            break (h, term_now);
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(10),
            "no follower took the lease within 10 s of the leader's death"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = killed_at.elapsed();
    assert!(new_term > term, "term {new_term} after {term}");
    let successor = fleet.coordinator_of(owner_pid(&new_holder)).unwrap();
    eprintln!("leader {dead} killed; {successor} leads after {took:?}");
    loop {
        let swept = fleet
            .serve_log_lines_at(successor, "drift sweep done")
            .len();
        if swept > 0 {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(15),
            "the new leader ran no drift sweep"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    fleet.start_serve_at(dead);
    fleet::phase_done("leader killed, a follower leads and sweeps", t);

    // 3. SIGKILL the coordinator holding an Agent's claim mid-activation (its gateway takes
    // 6 s to become ready): another takes the item after the lease and converges.
    let t = Instant::now();
    fleet.update_configuration("h00", &document("h00-v2", json!({"readyAfterMs": 6000})));
    let rev = fleet.deploy("h00");
    let holder = loop {
        let owner = sql(
            &pg,
            "SELECT coalesce(max(lease_owner), '') FROM work WHERE agent_id = 'h00' AND state = 'running'",
        );
        if !owner.is_empty() {
            break owner;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "nobody claimed h00's deploy"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Wait until the activation is under way on the host.
    std::thread::sleep(Duration::from_millis(1500));
    let victim = fleet.coordinator_of(owner_pid(&holder)).unwrap();
    fleet.kill_serve_at(victim);
    // Ask a coordinator that is still up.
    fleet.use_coordinator(if victim == 0 { 1 } else { 0 });
    fleet.wait_converged(
        &[(
            "h00",
            Want::Running {
                rev: rev.clone(),
                label: "h00-v2".into(),
            },
        )],
        t,
        Duration::from_secs(120),
    );
    let finisher = sql(
        &pg,
        &format!(
            "SELECT lease_owner IS NULL FROM work WHERE agent_id = 'h00' AND revision_id = '{rev}' AND state = 'done'"
        ),
    );
    assert_eq!(finisher, "t", "h00's deploy is done");
    fleet.start_serve_at(victim);
    fleet.use_coordinator(0);
    fleet::phase_done("claim holder killed mid-activation, another finished", t);

    // 4. PostgreSQL restarts while ten deploys are in flight: every acknowledged deploy
    // converges, nothing is lost.
    let t = Instant::now();
    let mut wants = Vec::new();
    for a in agents.iter().skip(10).take(10) {
        fleet.update_configuration(
            a,
            &document(&format!("{a}-v2"), json!({"readyAfterMs": 500})),
        );
        let rev = fleet.deploy(a);
        wants.push((
            a.as_str(),
            Want::Running {
                rev,
                label: format!("{a}-v2"),
            },
        ));
    }
    let down = pg.restart().expect("PostgreSQL did not restart");
    eprintln!("PostgreSQL was back after {down:?}");
    let wants: Vec<(&str, Want)> = wants;
    fleet.wait_converged(&wants, t, Duration::from_secs(240));
    for (a, want) in &wants {
        let Want::Running { rev, .. } = want else {
            unreachable!()
        };
        let rows = sql(
            &pg,
            &format!("SELECT count(*) FROM revisions WHERE agent_id = '{a}' AND id = '{rev}'"),
        );
        assert_eq!(rows, "1", "{a}'s acknowledged {rev} is stored");
    }
    fleet::phase_done("PostgreSQL restarted mid-deploy, all converged", t);
    let model = agents
        .iter()
        .map(|a| {
            let s = fleet.status(a).unwrap();
            let rev = s["activeRevisionId"].as_str().unwrap().to_owned();
            let label = if a == "h00" {
                "h00-v2".to_owned()
            } else if agents.iter().skip(10).take(10).any(|x| x == a) {
                format!("{a}-v2")
            } else {
                format!("{a}-v1")
            };
            (a.clone(), Want::Running { rev, label })
        })
        .collect();
    let per_host = fleet.check_hosts(&model, true);
    assert_eq!(per_host.values().sum::<usize>(), 30);
}

/// A fleet on the embedded SQLite database moves to PostgreSQL: `occ db migrate`, then two
/// coordinators on PostgreSQL keep converging what SQLite's deployed and what comes next.
#[test]
fn a_sqlite_fleet_moves_to_postgres_with_occ_db_migrate_and_keeps_converging() {
    clawfleet_vm_tests::skip_unless_hosts!();
    clawfleet_pg_tests::skip_unless_postgres!();
    let work = tempfile::tempdir().unwrap();
    let (pg, url, password_file) = postgres(work.path());
    let mut fleet = Fleet::start(2);
    let t = Instant::now();
    let agents = ["m1", "m2", "m3", "m4"];
    let mut wants = Vec::new();
    for a in agents {
        fleet.create_agent(a, &document(&format!("{a}-v1"), json!({})));
        let rev = fleet.deploy(a);
        wants.push((
            a,
            Want::Running {
                rev,
                label: format!("{a}-v1"),
            },
        ));
    }
    fleet.wait_converged(&wants, t, Duration::from_secs(120));
    fleet.stop_serve();
    // A target that is not empty is refused; an empty one takes the copy.
    let config = fleet.config.display().to_string();
    let out = fleet.occ(&[
        "db",
        "migrate",
        "--to",
        "postgres://nobody@127.0.0.1:1/x?sslmode=disable",
    ]);
    assert!(!out.status.success(), "a migrate to nowhere succeeded");
    let out = std::process::Command::new(&fleet.occ_bin)
        .args(["--config", &config, "db", "migrate", "--to", &url])
        .env("PGPASSWORD", "ha-s3cret")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "occ db migrate failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("every table counted the same"),
        "{printed}"
    );
    assert_eq!(sql(&pg, "SELECT count(*) FROM agents"), "4");
    let again = std::process::Command::new(&fleet.occ_bin)
        .args(["--config", &config, "db", "migrate", "--to", &url])
        .env("PGPASSWORD", "ha-s3cret")
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
    // The same coordinator, now on PostgreSQL, with the same keys and token.
    let text = std::fs::read_to_string(&fleet.config).unwrap();
    std::fs::write(
        &fleet.config,
        format!(
            "database = \"{url}\"\n{text}[postgres]\npassword_file = \"{}\"\n",
            password_file.display()
        ),
    )
    .unwrap();
    fleet.start_serve();
    let t = Instant::now();
    let mut wants = Vec::new();
    for a in agents {
        fleet.update_configuration(a, &document(&format!("{a}-v2"), json!({})));
        let rev = fleet.deploy(a);
        assert_eq!(
            rev_num(Some(&rev)),
            Some(2),
            "{a}: numbering goes on from SQLite's"
        );
        wants.push((
            a,
            Want::Running {
                rev,
                label: format!("{a}-v2"),
            },
        ));
    }
    fleet.wait_converged(&wants, t, Duration::from_secs(120));
    let model = wants
        .iter()
        .map(|(a, w)| ((*a).to_owned(), w.clone()))
        .collect();
    fleet.check_hosts(&model, true);
}

/// Every hostd journal line since `since` (Unix seconds) on the fleet's first host, as JSON.
fn journal(fleet: &Fleet, since: u64) -> Vec<Value> {
    fleet
        .hosts
        .iter()
        .next()
        .unwrap()
        .run_ok(&format!(
            "journalctl -t hostd -o json --no-pager --since @{since}"
        ))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Fencing end to end, and a hostd from before fencing. A coordinator stopped (SIGSTOP) right
/// before an activation, holding the claim, is continued after its lease lapsed and another
/// coordinator deployed two revisions: hostd refuses its stale call with FENCE_STALE, the
/// coordinator records the claim as lost, and the host keeps the newer revision. Then the
/// host's hostd speaks only protocol version 1 (as one from before fencing): the host shows
/// "unfenced", and a new Agent still deploys there, its operations carrying no fence.
#[test]
fn a_paused_coordinator_is_fenced_off_and_an_unfenced_host_keeps_working() {
    clawfleet_vm_tests::skip_unless_hosts!();
    clawfleet_pg_tests::skip_unless_postgres!();
    let work = tempfile::tempdir().unwrap();
    let (_pg, url, password_file) = postgres(work.path());
    let mut fleet = Fleet::start_with(FleetOptions {
        hosts: 1,
        coordinators: 2,
        lease_seconds: 4,
        ..options(&url, &password_file)
    });
    let host = fleet.host_names()[0].clone();

    // 1. Coordinator 0 alone takes f1's deploy and stops itself before the activation.
    let t = Instant::now();
    fleet.create_agent("f1", &document("f1-v1", json!({})));
    fleet.stop_serve_at(1);
    fleet.stop_serve_at(0);
    fleet.start_serve_with(0, &[("OCC_FAULT_STOP_BEFORE", "activate-revision")]);
    let rev1 = fleet.deploy("f1");
    while !fleet.is_stopped(0) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "coordinator 0 never reached the activation"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Coordinator 1 takes over after the lease, then deploys a second revision.
    fleet.start_serve_at(1);
    fleet.use_coordinator(1);
    let running = |rev: &str, label: &str| {
        vec![(
            "f1",
            Want::Running {
                rev: rev.to_owned(),
                label: label.to_owned(),
            },
        )]
    };
    fleet.wait_converged(&running(&rev1, "f1-v1"), t, Duration::from_secs(120));
    fleet.update_configuration("f1", &document("f1-v2", json!({})));
    let rev2 = fleet.deploy("f1");
    fleet.wait_converged(&running(&rev2, "f1-v2"), t, Duration::from_secs(120));
    fleet::phase_done(
        "coordinator 0 paused, coordinator 1 took over and moved on",
        t,
    );

    // 2. Continued, coordinator 0 sends its stale activation of rev1: refused by hostd.
    let t = Instant::now();
    let since = now_unix().saturating_sub(1);
    fleet.signal_only(0, "-CONT");
    loop {
        if !fleet.serve_log_lines_at(0, "CLAIM_LOST").is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "coordinator 0 did not record its claim as lost: {:?}",
            fleet.serve_log_lines_at(0, "f1")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // journald stores hostd's line on its own time, which can trail the answer that made
    // coordinator 0 log CLAIM_LOST: the refusal must show up, but is looked for a while.
    let logged = Instant::now();
    loop {
        let refused = journal(&fleet, since)
            .into_iter()
            .any(|e| e.to_string().contains("FENCE_STALE"));
        if refused {
            break;
        }
        assert!(
            logged.elapsed() < Duration::from_secs(15),
            "hostd logged no FENCE_STALE refusal since coordinator 0 continued"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let s = fleet.status("f1").unwrap();
    assert_eq!(s["activeRevisionId"], rev2.as_str(), "{s}");
    assert_eq!(s["servedRevisionId"], rev2.as_str(), "{s}");
    let inventory = fleet.inventory(fleet.host(&host));
    let f1 = inventory.to_string();
    assert!(
        f1.contains(&format!("\"current\":\"{rev2}\"")),
        "the host no longer has {rev2} current: {inventory}"
    );
    fleet::phase_done("the stale activation was refused with FENCE_STALE", t);

    // 3. The host's hostd speaks only version 1: shown unfenced, and still deploys.
    let t = Instant::now();
    fleet
        .host(&host)
        .run_ok("sed -i '1i protocol_versions = [1]' /etc/clawfleet/hostd.toml")
        .unwrap();
    // New hostd sessions read the changed configuration.
    for i in 0..2 {
        fleet.stop_serve_at(i);
        fleet.start_serve_at(i);
    }
    let probe = fleet.occ(&["host", "probe", &host]);
    assert!(probe.status.success(), "{probe:?}");
    assert!(
        String::from_utf8_lossy(&probe.stderr).contains("unfenced"),
        "occ host probe did not warn: {probe:?}"
    );
    let hosts = fleet.occ_json(&["host", "list"]);
    assert_eq!(hosts[0]["fencing"], "unfenced", "{hosts}");
    let table = fleet.occ_ok(&["host", "list"]);
    assert!(
        table.contains("FENCING") && table.contains("unfenced"),
        "{table}"
    );
    let since = now_unix().saturating_sub(1);
    fleet.create_agent("u1", &document("u1-v1", json!({})));
    let rev = fleet.deploy("u1");
    fleet.wait_converged(
        &[(
            "u1",
            Want::Running {
                rev,
                label: "u1-v1".into(),
            },
        )],
        t,
        Duration::from_secs(120),
    );
    let fences: Vec<String> = journal(&fleet, since)
        .iter()
        .filter(|e| {
            journal_field(e, "MESSAGE") == Some("operation received")
                && journal_field(e, "AGENT") == Some("u1")
        })
        .map(|e| journal_field(e, "FENCE").unwrap_or("none").to_owned())
        .collect();
    assert!(!fences.is_empty(), "hostd received no operation for u1");
    assert!(
        fences.iter().all(|f| f == "0" || f == "none"),
        "operations to a version-1 hostd carried fences: {fences:?}"
    );
    fleet::phase_done("a version-1 hostd shows unfenced and deploys", t);
}
