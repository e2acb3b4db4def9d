//! The store's behaviour, written once against the `Store` trait and run against every
//! implementation (`coordinator/tests/in_process/store_suite.rs`): SQLite in memory and on a file, and a
//! real PostgreSQL server. Each case starts from an empty, migrated store. Test code, built
//! only with the `suite` feature.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::model::{
    Agent, DesiredState, DriftReason, DriftRow, DriftState, Grant, Host, RestorePolicy, Revision,
    RevisionStatus, Role, RolloutAgentState, RolloutState, RolloutSubject, WorkspaceState,
};
use crate::{
    Enqueue, NamespaceInsert, NewTokenRow, RevisionInsert, RolloutInsert, RolloutRow, SharedStore,
    StoreError, Work, WorkEnd, WorkKind, WorkState,
};
use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::workspace::{WorkspaceFile, WorkspaceName};
use clawfleet_protocol::{Ident, SecretFingerprint, SecretName, Sha256Hex};
use serde_json::json;

/// One case of the suite.
pub type Case = fn(SharedStore) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        /// Every case, by name.
        pub const CASES: &[(&str, Case)] = &[$((stringify!($name), |s| Box::pin($name(s)))),*];
    };
}

cases!(
    migrations_reach_the_same_version,
    hosts_are_unique_and_in_use_hosts_stay,
    clusters_are_replaced_keeping_name_and_creation,
    namespaces_queue_their_work_and_single_tenant_pools_are_exclusive,
    tokens_are_found_by_hash_until_revoked,
    configurations_count_generations,
    revisions_are_numbered_inside_the_transaction_even_when_concurrent,
    claims_respect_lanes_and_barriers,
    a_batch_claim_takes_one_item_per_lane_in_queue_order,
    runnable_work_behind_a_long_busy_lane_is_claimed,
    a_replaced_claim_can_write_nothing,
    a_commit_settles_older_revisions_queued_deploys,
    placement_takes_the_least_loaded_host_with_room_once,
    concurrent_claimers_never_share_a_lane_and_claim_each_item_once,
    fences_only_grow_even_across_a_re_created_agent,
    the_leader_lease_changes_hands_with_a_higher_term,
    workspace_files_are_stored_with_the_agent_and_dropped,
    rollouts_own_their_agents_until_done,
    retention_prunes_old_finished_work_and_audit,
    audit_and_drift_read_back,
    row_counts_cover_every_table,
    secrets_are_versioned_sealed_and_deleted,
    unstaged_revisions_retire_in_one_write_and_agents_page_by_id,
    agents_keep_their_egress_and_restore_policy,
);

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtlzZ3MFfuteL1oS3yr1Yx72/TNBkiGm1NN+JwrXN+M";

/// A typed id from a test's literal.
fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

fn host(name: &str) -> Host {
    Host {
        name: clawfleet_protocol::HostName::new(name).unwrap(),
        address: "127.0.0.1".into(),
        port: 22,
        host_key: KEY.into(),
        fingerprint: "SHA256:x".into(),
        max_agents: 10,
        enrolled_at: 1,
        last_probe: None,
        login_user: None,
        jump: None,
        fencing: Default::default(),
    }
}

fn agent(agent: &str) -> Agent {
    Agent {
        namespace_id: id("ns"),
        id: id(agent),
        service_principal_id: id(&format!("sp-{agent}")),
        configuration_id: id("cfg"),
        desired_state: DesiredState::Stopped,
        host: None,
        port: None,
        active_revision_id: None,
        served_revision_id: None,
        restore: RestorePolicy::None,
        created_at: 1,
        egress: None,
    }
}

fn revision(agent: &str) -> Revision {
    Revision {
        namespace_id: id("ns"),
        agent_id: id(agent),
        id: id("rev-0"),
        number: 0,
        configuration_id: id("cfg"),
        configuration_generation: 1,
        configuration_hash: Sha256Hex::new("0".repeat(64)).unwrap(),
        status: RevisionStatus::Pending,
        last_attempt: None,
        created_at: 1,
        runtime_failure: None,
        rendered: json!({"gateway": {}}),
        secrets: Vec::new(),
        staged: false,
    }
}

/// A Namespace `ns` on host `h1` (its ensure work finished) with Agents `a1..=an`.
async fn world(s: &SharedStore, agents: usize) {
    assert!(s.insert_host(&host("h1")).await.unwrap());
    let inserted = s
        .insert_namespace(
            "ns",
            "ns",
            &["h1".into()],
            None,
            false,
            1,
            &Enqueue::namespace(WorkKind::EnsureNamespace, "ns"),
        )
        .await
        .unwrap();
    assert_eq!(inserted, NamespaceInsert::Inserted);
    let w = s
        .claim_work("setup", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert!(
        s.end_work(
            &w.claim,
            WorkEnd::Finished {
                state: WorkState::Done,
                code: "OK",
                message: ""
            }
        )
        .await
        .unwrap()
    );
    for i in 1..=agents {
        assert!(
            s.insert_agent(&agent(&format!("a{i}")), &[], 1)
                .await
                .unwrap()
        );
    }
}

fn done() -> WorkEnd<'static> {
    WorkEnd::Finished {
        state: WorkState::Done,
        code: "OK",
        message: "",
    }
}

pub async fn migrations_reach_the_same_version(s: SharedStore) {
    assert_eq!(
        s.schema_version().await.unwrap(),
        crate::postgres::latest_version()
    );
    assert_eq!(
        crate::postgres::latest_version(),
        crate::sqlite::MIGRATIONS.len() as i64,
        "a migration is missing from one of the two stores"
    );
}

/// `update_cluster` replaces server, credentials, settings and probe; name and creation stay.
pub async fn clusters_are_replaced_keeping_name_and_creation(s: SharedStore) {
    let record = |server: &str, token: &str| crate::model::ClusterRecord {
        cluster: crate::model::Cluster {
            name: "c1".into(),
            server: server.into(),
            settings: json!({"gatewayImage": server}),
            created_at: 7,
            last_probe: None,
        },
        credentials: json!({"token": token}),
    };
    assert!(!s.update_cluster(&record("https://a", "t1")).await.unwrap());
    assert!(s.insert_cluster(&record("https://a", "t1")).await.unwrap());
    let mut new = record("https://b", "t2");
    new.cluster.created_at = 99;
    new.cluster.last_probe = Some(json!({"probed": true}));
    assert!(s.update_cluster(&new).await.unwrap());
    let got = s.cluster("c1").await.unwrap().unwrap();
    assert_eq!(got.cluster.server, "https://b");
    assert_eq!(got.cluster.created_at, 7);
    assert_eq!(got.cluster.settings, json!({"gatewayImage": "https://b"}));
    assert_eq!(got.cluster.last_probe, Some(json!({"probed": true})));
    assert_eq!(got.credentials, json!({"token": "t2"}));
}

pub async fn hosts_are_unique_and_in_use_hosts_stay(s: SharedStore) {
    assert!(s.insert_host(&host("h1")).await.unwrap());
    assert!(!s.insert_host(&host("h1")).await.unwrap());
    assert!(s.insert_host(&host("h2")).await.unwrap());
    let mut changed = host("h2");
    changed.port = 2222;
    changed.login_user = Some("clawfleet".into());
    changed.jump = Some(crate::model::Jump {
        address: "bastion.example".into(),
        port: 2200,
        host_key: KEY.into(),
        login_user: Some("jump".into()),
    });
    assert!(s.update_host(&changed).await.unwrap());
    assert!(!s.update_host(&host("nope")).await.unwrap());
    s.set_host_probe("h1", &json!({"hostdVersion": "1"}))
        .await
        .unwrap();
    let hosts = s.hosts().await.unwrap();
    assert_eq!(
        hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        ["h1", "h2"]
    );
    assert_eq!(hosts[0].last_probe, Some(json!({"hostdVersion": "1"})));
    let h2 = s.host("h2").await.unwrap().unwrap();
    assert_eq!(
        (h2.port, &h2.login_user, &h2.jump),
        (2222, &changed.login_user, &changed.jump)
    );
    // The probe's protocol versions say whether the host enforces fences.
    assert_eq!(hosts[0].fencing, crate::model::Fencing::Unknown);
    s.set_host_probe("h1", &json!({"protocolVersions": [1]}))
        .await
        .unwrap();
    assert_eq!(
        s.host("h1").await.unwrap().unwrap().fencing,
        crate::model::Fencing::Unfenced
    );
    s.set_host_probe("h1", &json!({"protocolVersions": [1, 2]}))
        .await
        .unwrap();
    assert_eq!(
        s.host("h1").await.unwrap().unwrap().fencing,
        crate::model::Fencing::Fenced
    );
    s.insert_namespace(
        "ns",
        "ns",
        &["h1".into()],
        None,
        false,
        1,
        &Enqueue::namespace(WorkKind::EnsureNamespace, "ns"),
    )
    .await
    .unwrap();
    assert_eq!(s.delete_host("h1").await.unwrap(), Some(false));
    assert_eq!(s.delete_host("h2").await.unwrap(), Some(true));
    assert_eq!(s.delete_host("h2").await.unwrap(), None);
    assert_eq!(s.agents_on_host("h1").await.unwrap(), 0);
}

pub async fn namespaces_queue_their_work_and_single_tenant_pools_are_exclusive(s: SharedStore) {
    for h in ["h1", "h2"] {
        s.insert_host(&host(h)).await.unwrap();
    }
    let ensure = |ns: &str| Enqueue::namespace(WorkKind::EnsureNamespace, ns);
    assert_eq!(
        s.insert_namespace("a", "a", &["h1".into()], None, true, 5, &ensure("a"))
            .await
            .unwrap(),
        NamespaceInsert::Inserted
    );
    assert_eq!(
        s.insert_namespace("a", "a", &["h2".into()], None, false, 5, &ensure("a"))
            .await
            .unwrap(),
        NamespaceInsert::Exists
    );
    assert_eq!(
        s.insert_namespace("b", "b", &["h1".into()], None, false, 5, &ensure("b"))
            .await
            .unwrap(),
        NamespaceInsert::HostShared {
            host: "h1".into(),
            namespace: "a".into()
        }
    );
    assert!(s.namespace("b").await.unwrap().is_none());
    assert_eq!(s.pending_work().await.unwrap(), 1, "one ensure, none for b");
    let ns = s.namespace("a").await.unwrap().unwrap();
    assert_eq!(
        (ns.created_at, ns.ready, ns.single_tenant),
        (5, false, true)
    );
    let w = s
        .claim_work("w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((w.kind, w.fence), (WorkKind::EnsureNamespace, None));
    s.set_namespace_host_ready(&w.claim, "a", "h1", true)
        .await
        .unwrap();
    assert!(s.namespace("a").await.unwrap().unwrap().ready);
    s.end_work(&w.claim, done()).await.unwrap();
    s.insert_agent(
        &Agent {
            namespace_id: id("a"),
            ..agent("x")
        },
        &[],
        1,
    )
    .await
    .unwrap();
    let delete = Enqueue::namespace(WorkKind::DeleteNamespace, "a");
    assert!(!s.mark_namespace_deleting("a", &delete).await.unwrap());
    assert_eq!(s.pending_work().await.unwrap(), 0);
    assert_eq!(s.namespaces().await.unwrap().len(), 1);
}

pub async fn tokens_are_found_by_hash_until_revoked(s: SharedStore) {
    let grants = [
        Grant {
            namespace: "*".into(),
            role: Role::Read,
        },
        Grant {
            namespace: "ns".into(),
            role: Role::Deploy,
        },
    ];
    s.create_token(&NewTokenRow {
        id: "t1",
        name: "ci",
        secret_hash: "hash1",
        grants: &grants,
        created_at: 3,
        expires_at: Some(99),
    })
    .await
    .unwrap();
    let t = s.token_by_hash("hash1").await.unwrap().unwrap();
    assert_eq!((t.id.as_str(), t.expires_at), ("t1", Some(99)));
    let mut got = t.grants.clone();
    got.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    assert_eq!(got, grants);
    assert!(s.token_by_hash("other").await.unwrap().is_none());
    // A duplicate grant is refused by the database, and nothing of the token is stored.
    let dup = [grants[1].clone(), grants[1].clone()];
    assert!(
        s.create_token(&NewTokenRow {
            id: "t2",
            name: "dup",
            secret_hash: "hash2",
            grants: &dup,
            created_at: 3,
            expires_at: None,
        })
        .await
        .is_err()
    );
    assert!(s.token_by_hash("hash2").await.unwrap().is_none());
    // A token without grants is found, with none.
    s.create_token(&NewTokenRow {
        id: "t3",
        name: "bare",
        secret_hash: "hash3",
        grants: &[],
        created_at: 3,
        expires_at: None,
    })
    .await
    .unwrap();
    let t = s.token_by_hash("hash3").await.unwrap().unwrap();
    assert_eq!(
        (t.id.as_str(), t.expires_at, t.grants.len()),
        ("t3", None, 0)
    );
    assert!(s.revoke_token("t1").await.unwrap());
    assert!(!s.revoke_token("t1").await.unwrap());
    assert!(s.token_by_hash("hash1").await.unwrap().is_none());
    assert_eq!(s.token_count().await.unwrap(), 2);
}

pub async fn configurations_count_generations(s: SharedStore) {
    world(&s, 0).await;
    assert_eq!(
        s.put_configuration("ns", "c", &json!({"v": 1}), true, 1)
            .await
            .unwrap(),
        Some(1)
    );
    assert_eq!(
        s.put_configuration("ns", "c", &json!({"v": 1}), true, 1)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.put_configuration("ns", "d", &json!({}), false, 1)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.put_configuration("ns", "c", &json!({"v": 2}), false, 2)
            .await
            .unwrap(),
        Some(2)
    );
    let latest = s.configuration(&id("ns"), &id("c")).await.unwrap().unwrap();
    assert_eq!((latest.generation, latest.document), (2, json!({"v": 2})));
    let first = s
        .configuration_at(&id("ns"), &id("c"), Some(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.document, json!({"v": 1}));
    assert!(
        s.configuration_at(&id("ns"), &id("c"), Some(3))
            .await
            .unwrap()
            .is_none()
    );
}

pub async fn revisions_are_numbered_inside_the_transaction_even_when_concurrent(s: SharedStore) {
    world(&s, 1).await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = revision("a1");
            match s.create_revision(&mut r).await.unwrap() {
                RevisionInsert::Queued(_) => r.number,
                other => panic!("{other:?}"),
            }
        }));
    }
    let mut numbers = Vec::new();
    for t in tasks {
        numbers.push(t.await.unwrap());
    }
    numbers.sort();
    assert_eq!(numbers, (1..=16).collect::<Vec<u64>>());
    let revs = s.revisions("ns", "a1").await.unwrap();
    assert_eq!(revs.len(), 16);
    // The id names the number and the content (the first 8 hex digits of its hash).
    assert_eq!(
        revs[15].id,
        format!("rev-16-{}", &revs[15].configuration_hash[..8])
    );
    assert_eq!(revs[0].rendered, json!({"gateway": {}}));
    assert_eq!(
        s.agent("ns", "a1").await.unwrap().unwrap().desired_state,
        DesiredState::Running
    );
    assert_eq!(s.open_work("ns", "a1").await.unwrap().len(), 16);
    // A target's revision the database never issued raises the Agent's floor (never lowers
    // it), and numbering goes on above it.
    assert_eq!(s.next_revision_number("ns", "a1").await.unwrap(), 17);
    let w = s
        .claim_work("w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    s.raise_revision_floor(&w.claim, "ns", "a1", 40)
        .await
        .unwrap();
    s.raise_revision_floor(&w.claim, "ns", "a1", 20)
        .await
        .unwrap();
    assert_eq!(s.next_revision_number("ns", "a1").await.unwrap(), 41);
    let mut r = revision("a1");
    s.create_revision(&mut r).await.unwrap();
    assert_eq!(r.number, 41);
    assert!(r.id.starts_with("rev-41-"), "{}", r.id);
    assert_eq!(s.next_revision_number("ns", "a1").await.unwrap(), 42);
}

pub async fn claims_respect_lanes_and_barriers(s: SharedStore) {
    world(&s, 2).await;
    let lease = Duration::from_secs(30);
    let mut r = revision("a1");
    s.create_revision(&mut r).await.unwrap();
    let stop = s
        .set_desired(
            "ns",
            "a1",
            DesiredState::Stopped,
            Some(&Enqueue::agent(WorkKind::Stop, "ns", "a1")),
        )
        .await
        .unwrap()
        .unwrap();
    let mut r2 = revision("a2");
    s.create_revision(&mut r2).await.unwrap();
    // a1's deploy, then a2's deploy (a1's stop waits behind its deploy in a1's lane).
    let first = s.claim_work("w", lease).await.unwrap().unwrap();
    assert_eq!(
        (first.kind, first.agent_id.as_deref()),
        (WorkKind::Deploy, Some("a1"))
    );
    assert_eq!(first.fence, Some(1));
    let second = s.claim_work("w", lease).await.unwrap().unwrap();
    assert_eq!(second.agent_id.as_deref(), Some("a2"));
    assert!(s.claim_work("w", lease).await.unwrap().is_none());
    s.end_work(&first.claim, done()).await.unwrap();
    let third = s.claim_work("w", lease).await.unwrap().unwrap();
    assert_eq!((third.id, third.kind), (stop, WorkKind::Stop));
    assert!(
        third.fence > first.fence,
        "every claim of the Agent's work takes a higher fence: {:?} then {:?}",
        first.fence,
        third.fence
    );
    s.end_work(&third.claim, done()).await.unwrap();
    s.end_work(&second.claim, done()).await.unwrap();
    // A Namespace-level barrier holds the whole Namespace: nothing queued after it runs first.
    let del = s
        .set_desired(
            "ns",
            "a2",
            DesiredState::Deleted,
            Some(&Enqueue::agent(WorkKind::DeleteAgent, "ns", "a2")),
        )
        .await
        .unwrap()
        .unwrap();
    let mut r3 = revision("a2");
    s.create_revision(&mut r3).await.unwrap();
    let w = s.claim_work("w", lease).await.unwrap().unwrap();
    assert_eq!(w.id, del);
    assert!(
        s.claim_work("w", lease).await.unwrap().is_none(),
        "a2's deploy waits for its delete"
    );
    // A requeued item waits for its delay.
    assert!(
        s.end_work(
            &w.claim,
            WorkEnd::Requeued {
                delay: Duration::from_secs(60),
                count_attempt: true,
                code: "HOST_UNREACHABLE",
                message: "later"
            }
        )
        .await
        .unwrap()
    );
    let rec = s.work_item("ns", "a2", del).await.unwrap().unwrap();
    assert_eq!((rec.state, rec.attempts), (WorkState::Queued, 1));
    assert_eq!(rec.last_attempt.unwrap().code, "HOST_UNREACHABLE");
    assert!(s.claim_work("w", lease).await.unwrap().is_none());
}

/// One claim of several items takes them in queue order, never two of one lane, nor
/// anything of a Namespace behind its barrier, and never more than asked for.
pub async fn a_batch_claim_takes_one_item_per_lane_in_queue_order(s: SharedStore) {
    world(&s, 4).await;
    let lease = Duration::from_secs(30);
    let mut ids = Vec::new();
    for a in ["a1", "a1", "a2", "a3"] {
        let mut r = revision(a);
        s.create_revision(&mut r).await.unwrap();
        ids.push(r.id.to_string());
    }
    assert!(s.claim_batch("w", lease, 0).await.unwrap().is_empty());
    let batch = s.claim_batch("w", lease, 10).await.unwrap();
    let got: Vec<_> = batch
        .iter()
        .map(|w| (w.agent_id.clone().unwrap(), w.revision_id.clone().unwrap()))
        .collect();
    let want: Vec<_> = [(0, "a1"), (2, "a2"), (3, "a3")]
        .iter()
        .map(|(i, a)| (a.to_string(), ids[*i].clone()))
        .collect();
    assert_eq!(got, want, "a1's second deploy waits behind its first");
    let fences: HashSet<_> = batch.iter().map(|w| w.fence.unwrap()).collect();
    assert_eq!(fences.len(), 3, "each Agent's fence raised: {fences:?}");
    assert!(s.claim_batch("w", lease, 10).await.unwrap().is_empty());
    assert!(s.end_work(&batch[0].claim, done()).await.unwrap());
    let next = s.claim_batch("w", lease, 10).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].revision_id.as_deref(), Some(ids[1].as_str()));
    for w in batch[1..].iter().chain(&next) {
        assert!(s.end_work(&w.claim, done()).await.unwrap());
    }
    // A Namespace-level barrier queued between Agents' deploys holds everything behind it,
    // and a batch stops at `max`.
    let mut r = revision("a1");
    s.create_revision(&mut r).await.unwrap();
    let ensure = s
        .enqueue(&Enqueue::namespace(WorkKind::EnsureNamespace, "ns"))
        .await
        .unwrap();
    for a in ["a2", "a3", "a4"] {
        let mut r = revision(a);
        s.create_revision(&mut r).await.unwrap();
    }
    let batch = s.claim_batch("w", lease, 10).await.unwrap();
    assert_eq!(
        batch.len(),
        1,
        "the barrier waits for a1's deploy: {batch:?}"
    );
    assert!(s.end_work(&batch[0].claim, done()).await.unwrap());
    let batch = s.claim_batch("w", lease, 10).await.unwrap();
    assert_eq!(batch.iter().map(|w| w.id).collect::<Vec<_>>(), [ensure]);
    assert!(s.end_work(&batch[0].claim, done()).await.unwrap());
    let batch = s.claim_batch("w", lease, 2).await.unwrap();
    assert_eq!(batch.len(), 2, "no more than asked for");
    let rest = s.claim_batch("w", lease, 2).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(s.pending_work().await.unwrap(), 3);
}

/// More blocked items at the head of the queue than a claim reads at once (PostgreSQL reads
/// pages of 32) never hide a runnable item behind them, and a lapsed claim is taken again.
pub async fn runnable_work_behind_a_long_busy_lane_is_claimed(s: SharedStore) {
    world(&s, 2).await;
    for _ in 0..40 {
        let mut r = revision("a1");
        s.create_revision(&mut r).await.unwrap();
    }
    let mut r = revision("a2");
    s.create_revision(&mut r).await.unwrap();
    let first = s.claim_work("w", Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(first.agent_id.as_deref(), Some("a1"));
    // The first claim's lease lapses at once: it is claimed again, before anything queued.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = s
        .claim_work("w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.id, first.id, "a lapsed claim is taken again first");
    assert!(again.claim.token > first.claim.token);
    let behind = s
        .claim_work("w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        behind.agent_id.as_deref(),
        Some("a2"),
        "a2's deploy is claimed past a1's 39 queued items"
    );
    assert!(
        s.claim_work("w", Duration::from_secs(30))
            .await
            .unwrap()
            .is_none()
    );
    s.end_work(&again.claim, done()).await.unwrap();
    let next = s
        .claim_work("w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (next.agent_id.as_deref(), next.id > first.id),
        (Some("a1"), true)
    );
}

pub async fn a_replaced_claim_can_write_nothing(s: SharedStore) {
    world(&s, 1).await;
    let mut r = revision("a1");
    s.create_revision(&mut r).await.unwrap();
    let old = s
        .claim_work("paused", Duration::from_millis(200))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = s
        .claim_work("other", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(new.id, old.id, "the lapsed lease is claimed again");
    assert_eq!(new.claim.token, old.claim.token + 1);
    assert_eq!(new.fence, Some(old.fence.unwrap() + 1));
    let lost = |e: StoreError| matches!(e, StoreError::ClaimLost { .. });
    assert!(
        !s.renew_lease(&old.claim, Duration::from_secs(30))
            .await
            .unwrap()
    );
    assert!(lost(
        s.set_revision_status(&old.claim, "ns", "a1", &r.id, RevisionStatus::Failed)
            .await
            .unwrap_err()
    ));
    assert!(lost(
        s.commit_revision(&old.claim, "ns", "a1", None, &r.id)
            .await
            .unwrap_err()
    ));
    assert!(lost(
        s.place_agent(&old.claim, "ns", "a1", &["h1".into()])
            .await
            .unwrap_err()
    ));
    assert!(lost(
        s.set_activated(&old.claim, "ns", "a1", &r.id, Some(18_001), Some(&r.id))
            .await
            .unwrap_err()
    ));
    assert!(lost(
        s.audit_work(&old.claim, "worker", "x", "y", &json!({}), 1)
            .await
            .unwrap_err()
    ));
    assert!(!s.end_work(&old.claim, done()).await.unwrap());
    // The current claim still writes, and its end is the one recorded.
    assert!(
        s.commit_revision(&new.claim, "ns", "a1", None, &r.id)
            .await
            .unwrap()
    );
    assert!(
        s.renew_lease(&new.claim, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let a1 = s.agent("ns", "a1").await.unwrap().unwrap();
    assert_eq!((a1.port, a1.served_revision_id), (None, None));
    let rev = s.revision("ns", "a1", &r.id).await.unwrap().unwrap();
    assert_eq!(rev.status, RevisionStatus::Activating);
    // The activation's record: the revision active, the Agent's port and served revision.
    s.set_activated(&new.claim, "ns", "a1", &r.id, Some(18_001), Some(&r.id))
        .await
        .unwrap();
    // A later answer without a port keeps the one on record.
    s.set_activated(&new.claim, "ns", "a1", &r.id, None, Some(&r.id))
        .await
        .unwrap();
    // A call in flight is noted on the item and as the revision's newest attempt, counting
    // none; a replaced claim notes nothing.
    assert!(
        !s.note_work(&old.claim, "CALL_IN_PROGRESS", "stale")
            .await
            .unwrap()
    );
    assert!(
        s.note_work(&new.claim, "CALL_IN_PROGRESS", "slow")
            .await
            .unwrap()
    );
    let noted = s
        .revision("ns", "a1", &r.id)
        .await
        .unwrap()
        .unwrap()
        .last_attempt
        .unwrap();
    assert_eq!(
        (noted.code.as_str(), noted.message.as_str(), noted.attempts),
        ("CALL_IN_PROGRESS", "slow", 0)
    );
    let item = s.work_item("ns", "a1", new.id).await.unwrap().unwrap();
    assert_eq!(item.state, WorkState::Running);
    assert_eq!(
        item.last_attempt.map(|a| a.code),
        Some("CALL_IN_PROGRESS".to_owned())
    );
    let a1 = s.agent("ns", "a1").await.unwrap().unwrap();
    assert_eq!(a1.port, Some(18_001));
    assert_eq!(a1.served_revision_id.as_deref(), Some(r.id.as_str()));
    assert!(s.end_work(&new.claim, done()).await.unwrap());
    let rev = s.revision("ns", "a1", &r.id).await.unwrap().unwrap();
    assert_eq!(rev.status, RevisionStatus::Active);
    // The end is the revision's newest attempt: the current claim's code. A success spends
    // none of the item's budget, so the revision counts none either (the two counts agree).
    let attempt = rev.last_attempt.unwrap();
    assert_eq!((attempt.code.as_str(), attempt.attempts), ("OK", 0));
    let item = s.work_item("ns", "a1", new.id).await.unwrap().unwrap();
    assert_eq!(item.attempts, attempt.attempts);
    assert!(s.audit_events_of(10, Some("x")).await.unwrap().is_empty());
    // Ended: even the last claim can write no more.
    assert!(lost(
        s.set_revision_status(&new.claim, "ns", "a1", &r.id, RevisionStatus::Active)
            .await
            .unwrap_err()
    ));
}

/// Placement chooses and places in one write: the fewest Agents among the candidates with
/// room, ties in the order given; an Agent placed once stays where it is; no room, no
/// placement.
pub async fn placement_takes_the_least_loaded_host_with_room_once(s: SharedStore) {
    world(&s, 4).await;
    assert!(s.insert_host(&host("h2")).await.unwrap());
    assert!(
        s.insert_host(&Host {
            max_agents: 1,
            ..host("h3")
        })
        .await
        .unwrap()
    );
    let mut r = revision("a1");
    s.create_revision(&mut r).await.unwrap();
    let w = s
        .claim_work("c", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let all: Vec<String> = ["h3", "h1", "h2"].map(String::from).to_vec();
    let place = |agent: &'static str, candidates: Vec<String>| {
        let s = s.clone();
        let claim = w.claim;
        async move {
            s.place_agent(&claim, "ns", agent, &candidates)
                .await
                .unwrap()
                .map(|h| h.name.to_string())
        }
    };
    // All empty: the first in the order given.
    assert_eq!(place("a1", all.clone()).await.as_deref(), Some("h3"));
    // h3 is full; h1 and h2 tie, h1 comes first.
    assert_eq!(place("a2", all.clone()).await.as_deref(), Some("h1"));
    // h1 has one Agent, h2 none.
    assert_eq!(place("a3", all.clone()).await.as_deref(), Some("h2"));
    // Placed once: it stays, whatever the candidates.
    assert_eq!(place("a1", vec!["h2".into()]).await.as_deref(), Some("h3"));
    // No candidate with room, or none enrolled: not placed.
    assert_eq!(place("a4", vec!["h3".into()]).await, None);
    assert_eq!(place("a4", vec!["nope".into()]).await, None);
    assert_eq!(place("a4", vec![]).await, None);
    assert_eq!(s.agent("ns", "a4").await.unwrap().unwrap().host, None);
    // The host comes back whole.
    let h = s
        .place_agent(&w.claim, "ns", "a4", &all)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (h.name.as_str(), h.address.as_str(), h.max_agents),
        ("h1", "127.0.0.1", 10)
    );
    assert_eq!(
        s.agent("ns", "a4").await.unwrap().unwrap().host.as_deref(),
        Some("h1")
    );
}

/// Retries of older revisions waiting out their delay (one committed, one never committed)
/// end when a newer revision is committed, so deployment status converges then, not at the
/// retry time; the committed revision's own work and newer work stay open.
pub async fn unstaged_revisions_retire_in_one_write_and_agents_page_by_id(s: SharedStore) {
    world(&s, 3).await;
    let mut revs = Vec::new();
    for _ in 0..4 {
        let mut r = revision("a1");
        s.create_revision(&mut r).await.unwrap();
        assert!(!r.staged);
        revs.push(r);
    }
    let w = s
        .claim_work("c", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    for r in [&revs[0], &revs[3]] {
        s.mark_revision_staged(&w.claim, "ns", "a1", &r.id)
            .await
            .unwrap();
    }
    // Below revision 4: 2 and 3 never reached a target.
    let below = revs[3].number;
    assert_eq!(
        s.retire_unstaged(&w.claim, "ns", "a1", below)
            .await
            .unwrap(),
        2
    );
    let got = s.revisions("ns", "a1").await.unwrap();
    assert_eq!(
        got.iter().map(|r| r.staged).collect::<Vec<_>>(),
        vec![true, false, false, true]
    );
    assert_eq!(
        got.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![
            RevisionStatus::Pending,
            RevisionStatus::Retired,
            RevisionStatus::Retired,
            RevisionStatus::Pending
        ]
    );
    assert_eq!(
        s.retire_unstaged(&w.claim, "ns", "a1", below)
            .await
            .unwrap(),
        0
    );
    // Agents by id, a page at a time.
    let ids = |v: Vec<Agent>| v.into_iter().map(|a| a.id.to_string()).collect::<Vec<_>>();
    assert_eq!(
        ids(s.agents_after("ns", None, 2).await.unwrap()),
        vec!["a1", "a2"]
    );
    assert_eq!(
        ids(s.agents_after("ns", Some("a2"), 2).await.unwrap()),
        vec!["a3"]
    );
    assert!(
        s.agents_after("ns", Some("a3"), 2)
            .await
            .unwrap()
            .is_empty()
    );
}

/// An Agent's egress settings as created, replaced and dropped, read back by every read of
/// Agents; the restore policy beside them.
pub async fn agents_keep_their_egress_and_restore_policy(s: SharedStore) {
    world(&s, 1).await;
    let narrow = Egress {
        ports: Some(vec![443, 8443]),
        allow: Some(vec!["10.1.2.0/24".into()]),
    };
    let mut e1 = agent("e1");
    e1.egress = Some(narrow.clone());
    assert!(s.insert_agent(&e1, &[], 1).await.unwrap());
    assert_eq!(s.agent("ns", "e1").await.unwrap(), Some(e1.clone()));
    assert_eq!(s.agent("ns", "a1").await.unwrap().unwrap().egress, None);
    let listed = s.agents("ns").await.unwrap();
    assert_eq!(
        listed.iter().map(|a| a.egress.clone()).collect::<Vec<_>>(),
        vec![None, Some(narrow.clone())]
    );
    assert_eq!(
        s.agents_after("ns", Some("a1"), 5).await.unwrap()[0].egress,
        Some(narrow)
    );
    // Replaced, then set to no ports and no ranges, then dropped.
    let only_ports = Egress {
        ports: Some(vec![443]),
        allow: None,
    };
    s.set_agent_egress("ns", "e1", Some(&only_ports))
        .await
        .unwrap();
    assert_eq!(
        s.agent("ns", "e1").await.unwrap().unwrap().egress,
        Some(only_ports)
    );
    let nothing = Egress {
        ports: Some(vec![]),
        allow: Some(vec![]),
    };
    s.set_agent_egress("ns", "e1", Some(&nothing))
        .await
        .unwrap();
    assert_eq!(
        s.agent("ns", "e1").await.unwrap().unwrap().egress,
        Some(nothing)
    );
    s.set_agent_egress("ns", "e1", None).await.unwrap();
    assert_eq!(s.agent("ns", "e1").await.unwrap().unwrap().egress, None);
    s.set_agent_restore("ns", "e1", RestorePolicy::LastServed)
        .await
        .unwrap();
    let got = s.agent("ns", "e1").await.unwrap().unwrap();
    assert_eq!((got.restore, got.egress), (RestorePolicy::LastServed, None));
    // Setting an Agent that does not exist changes nothing.
    s.set_agent_egress("ns", "nope", Some(&Egress::default()))
        .await
        .unwrap();
    assert_eq!(s.agent("ns", "nope").await.unwrap(), None);
}

pub async fn a_commit_settles_older_revisions_queued_deploys(s: SharedStore) {
    world(&s, 1).await;
    let claim = || s.claim_work("c", Duration::from_secs(30));
    let retry_later = |w: Work| {
        let s = s.clone();
        async move {
            let requeued = WorkEnd::Requeued {
                delay: Duration::from_secs(600),
                count_attempt: true,
                code: "REVISION_FINALIZATION_INCOMPLETE",
                message: "not ready",
            };
            assert!(s.end_work(&w.claim, requeued).await.unwrap());
        }
    };
    let (mut r1, mut r2, mut r3, mut r4) = (
        revision("a1"),
        revision("a1"),
        revision("a1"),
        revision("a1"),
    );
    s.create_revision(&mut r1).await.unwrap();
    let w1 = claim().await.unwrap().unwrap();
    assert!(
        s.commit_revision(&w1.claim, "ns", "a1", None, &r1.id)
            .await
            .unwrap()
    );
    let w1_id = w1.id;
    retry_later(w1).await;
    s.create_revision(&mut r2).await.unwrap();
    let w2 = claim().await.unwrap().unwrap();
    let w2_id = w2.id;
    retry_later(w2).await;
    s.create_revision(&mut r3).await.unwrap();
    let w3 = claim().await.unwrap().unwrap();
    assert_eq!(w3.revision_id.as_deref(), Some(r3.id.as_str()));
    s.create_revision(&mut r4).await.unwrap();
    // A commit that loses its compare-and-set settles nothing.
    assert!(
        !s.commit_revision(&w3.claim, "ns", "a1", None, &r3.id)
            .await
            .unwrap()
    );
    assert_eq!(s.open_work("ns", "a1").await.unwrap().len(), 4);
    assert!(
        s.commit_revision(&w3.claim, "ns", "a1", Some(&r1.id), &r3.id)
            .await
            .unwrap()
    );
    for old in [w1_id, w2_id] {
        let w = s.work_item("ns", "a1", old).await.unwrap().unwrap();
        assert_eq!(w.state, WorkState::Done);
        let attempt = w.last_attempt.unwrap();
        assert_eq!(attempt.code, "REVISION_SUPERSEDED");
        assert!(
            attempt.message.contains(r3.id.as_str()),
            "{}",
            attempt.message
        );
    }
    let open: Vec<Option<String>> = s
        .open_work("ns", "a1")
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.revision_id)
        .collect();
    assert_eq!(open, vec![Some(r3.id.to_string()), Some(r4.id.to_string())]);
    let mut statuses = Vec::new();
    for r in [&r1, &r2, &r3, &r4] {
        statuses.push(s.revision("ns", "a1", &r.id).await.unwrap().unwrap().status);
    }
    assert_eq!(
        statuses,
        [
            RevisionStatus::Superseded,
            RevisionStatus::Superseded,
            RevisionStatus::Activating,
            RevisionStatus::Pending
        ]
    );
    // Each settled item is its revision's newest attempt, the one replaced as well; settling
    // counts no attempt, so each revision counts the one retry its item counted.
    for r in [&r1, &r2] {
        let a = s
            .revision("ns", "a1", &r.id)
            .await
            .unwrap()
            .unwrap()
            .last_attempt
            .unwrap();
        assert_eq!((a.code.as_str(), a.attempts), ("REVISION_SUPERSEDED", 1));
    }
    for old in [w1_id, w2_id] {
        assert_eq!(
            s.work_item("ns", "a1", old)
                .await
                .unwrap()
                .unwrap()
                .attempts,
            1
        );
    }
    // An item's end is its revision's attempt; a failure is also the revision's status.
    let failed = WorkEnd::Finished {
        state: WorkState::Failed,
        code: "UNIT_FAILED",
        message: "exited",
    };
    assert!(s.end_work(&w3.claim, failed).await.unwrap());
    let r3 = s.revision("ns", "a1", &r3.id).await.unwrap().unwrap();
    assert_eq!(r3.status, RevisionStatus::Failed);
    let attempt = r3.last_attempt.unwrap();
    assert_eq!(
        (attempt.code.as_str(), attempt.attempts),
        ("UNIT_FAILED", 1)
    );
    let r1 = s.revision("ns", "a1", &r1.id).await.unwrap().unwrap();
    let attempt = r1.last_attempt.unwrap();
    assert_eq!(
        (attempt.code.as_str(), attempt.attempts),
        ("REVISION_SUPERSEDED", 1),
        "the retry's attempt; the settlement is none"
    );
}

pub async fn concurrent_claimers_never_share_a_lane_and_claim_each_item_once(s: SharedStore) {
    world(&s, 5).await;
    let mut expected = HashSet::new();
    for round in 0..4 {
        for a in 1..=5 {
            let id = s
                .enqueue(&Enqueue::deploy(
                    "ns",
                    &format!("a{a}"),
                    &format!("r{round}"),
                ))
                .await
                .unwrap();
            expected.insert(id);
        }
    }
    let running: Arc<Mutex<BTreeMap<String, i64>>> = Arc::default();
    let claimed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..6 {
        let (s, running, claimed) = (s.clone(), running.clone(), claimed.clone());
        tasks.push(tokio::spawn(async move {
            let mut idle = 0;
            // Claimers of one item and of batches of two and three, side by side.
            let max = c % 3 + 1;
            while idle < 20 {
                let batch = s
                    .claim_batch(&format!("c{c}"), Duration::from_secs(30), max)
                    .await
                    .unwrap();
                if batch.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                idle = 0;
                assert!(batch.len() <= max);
                for w in &batch {
                    let lane = w.agent_id.clone().unwrap();
                    if let Some(other) = running.lock().unwrap().insert(lane.clone(), w.id) {
                        panic!("{lane}: {} claimed while {other} runs", w.id);
                    }
                    claimed.lock().unwrap().push(w.id);
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                for w in &batch {
                    running
                        .lock()
                        .unwrap()
                        .remove(w.agent_id.as_deref().unwrap());
                    assert!(s.end_work(&w.claim, done()).await.unwrap());
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let claimed = claimed.lock().unwrap().clone();
    assert_eq!(claimed.len(), expected.len(), "each item claimed once");
    assert_eq!(claimed.into_iter().collect::<HashSet<_>>(), expected);
    assert_eq!(s.pending_work().await.unwrap(), 0);
}

pub async fn the_leader_lease_changes_hands_with_a_higher_term(s: SharedStore) {
    let lease = Duration::from_millis(300);
    let a = s.lead("a", lease).await.unwrap();
    assert!(a.is_leader);
    let b = s.lead("b", lease).await.unwrap();
    assert!(!b.is_leader);
    assert_eq!((b.holder.as_str(), b.term), ("a", a.term));
    // a renews: same term.
    assert_eq!(s.lead("a", lease).await.unwrap().term, a.term);
    // a stops renewing: b takes over after the lease, with a higher term.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let b = s.lead("b", lease).await.unwrap();
    assert!(b.is_leader);
    assert!(b.term > a.term);
    assert!(!s.lead("a", lease).await.unwrap().is_leader);
    // A clean resignation hands over at once.
    s.resign("b").await.unwrap();
    let a2 = s.lead("a", lease).await.unwrap();
    assert!(a2.is_leader && a2.term > b.term);
}

fn file(name: &str, content: &str) -> WorkspaceFile {
    WorkspaceFile {
        name: WorkspaceName::new(name).unwrap(),
        content: content.as_bytes().to_vec(),
    }
}

pub async fn workspace_files_are_stored_with_the_agent_and_dropped(s: SharedStore) {
    world(&s, 0).await;
    let files = [file("b.md", "bee"), file("dir/a.md", "ay")];
    assert!(s.insert_agent(&agent("w1"), &files, 5).await.unwrap());
    assert!(
        !s.insert_agent(&agent("w1"), &[file("c.md", "x")], 6)
            .await
            .unwrap()
    );
    let info = s.workspace_setup("ns", "w1").await.unwrap().unwrap();
    assert_eq!(info.state, WorkspaceState::Pending);
    let names: Vec<&str> = info.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["b.md", "dir/a.md"]);
    assert!(info.files.iter().all(|f| f.content_held));
    assert_eq!(
        s.workspace_contents("ns", "w1").await.unwrap()[0].content,
        b"bee"
    );
    let mut r = revision("w1");
    s.create_revision(&mut r).await.unwrap();
    let w = s
        .claim_work("w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    s.set_workspace_state(&w.claim, "ns", "w1", WorkspaceState::Applied, None, 8)
        .await
        .unwrap();
    s.set_workspace_state(&w.claim, "ns", "w1", WorkspaceState::Applied, None, 9)
        .await
        .unwrap();
    let info = s.workspace_setup("ns", "w1").await.unwrap().unwrap();
    assert_eq!(
        (info.state, info.applied_at),
        (WorkspaceState::Applied, Some(8))
    );
    assert_eq!(
        s.drop_workspace_contents(&w.claim, "ns", "w1")
            .await
            .unwrap(),
        2
    );
    assert!(s.workspace_contents("ns", "w1").await.unwrap().is_empty());
    let info = s.workspace_setup("ns", "w1").await.unwrap().unwrap();
    assert!(info.files.iter().all(|f| !f.content_held && f.size > 0));
    assert!(s.insert_agent(&agent("w2"), &[], 5).await.unwrap());
    assert!(s.workspace_setup("ns", "w2").await.unwrap().is_none());
    s.delete_agent_row(&w.claim, "ns", "w1").await.unwrap();
    let counts: BTreeMap<String, i64> = s.row_counts().await.unwrap().into_iter().collect();
    assert_eq!(counts["agent_workspace_files"], 0);
    assert_eq!(counts["agent_workspace"], 0);
}

pub async fn rollouts_own_their_agents_until_done(s: SharedStore) {
    world(&s, 3).await;
    let row = |agents: &[&str]| RolloutRow {
        namespace_id: "ns".into(),
        subject: RolloutSubject::Configuration {
            id: id("cfg"),
            generation: 2,
        },
        canary: 1,
        max_parallel: 2,
        max_failures: 0,
        pause_between_seconds: 0,
        manual_promote: false,
        created_by: "op".into(),
        agents: agents
            .iter()
            .enumerate()
            .map(|(i, a)| (a.to_string(), u32::from(i > 0)))
            .collect(),
        now: 7,
    };
    let RolloutInsert::Created(id) = s.insert_rollout(&row(&["a1", "a2"])).await.unwrap() else {
        panic!("not created")
    };
    assert_eq!(
        s.insert_rollout(&row(&["a3", "a2"])).await.unwrap(),
        RolloutInsert::Busy {
            agent: "a2".into(),
            rollout: id
        }
    );
    assert_eq!(
        s.insert_rollout(&row(&["zz"])).await.unwrap(),
        RolloutInsert::AgentUnavailable("zz".into())
    );
    // A secret's rollout keeps its subject: no Configuration, the secret and its version.
    let secret = RolloutSubject::Secret {
        name: "slack-bot".parse().unwrap(),
        version: 3,
    };
    let RolloutInsert::Created(sid) = s
        .insert_rollout(&RolloutRow {
            subject: secret.clone(),
            ..row(&["a3"])
        })
        .await
        .unwrap()
    else {
        panic!("not created")
    };
    let sr = s.rollout("ns", sid).await.unwrap().unwrap();
    assert_eq!(
        (sr.configuration_id.clone(), sr.configuration_generation),
        (None, None)
    );
    assert_eq!(sr.subject(), Some(secret));
    assert_eq!(
        s.rollout("ns", id).await.unwrap().unwrap().subject(),
        Some(RolloutSubject::Configuration {
            id: "cfg".parse().unwrap(),
            generation: 2
        })
    );
    assert!(
        s.set_rollout(
            sid,
            (RolloutState::Running, 0),
            RolloutState::Aborted,
            0,
            None,
            Some("test"),
            8
        )
        .await
        .unwrap()
    );
    let mut r = revision("a1");
    assert_eq!(
        s.create_revision(&mut r).await.unwrap(),
        RevisionInsert::InRollout(id)
    );
    assert_eq!(s.open_rollout_of("ns", "a1").await.unwrap(), Some(id));
    let mut r = revision("a1");
    r.configuration_generation = 2;
    let work = s.start_rollout_deploy(id, &mut r).await.unwrap().unwrap();
    assert!(
        s.start_rollout_deploy(id, &mut revision("a1"))
            .await
            .unwrap()
            .is_none()
    );
    let ro = s.rollout("ns", id).await.unwrap().unwrap();
    assert_eq!((ro.state, ro.waves), (RolloutState::Running, 2));
    assert_eq!(ro.agents[0].state, RolloutAgentState::Deploying);
    assert_eq!(ro.agents[0].work_id, Some(work));
    assert!(
        s.finish_rollout_agent(
            id,
            "a1",
            RolloutAgentState::Deploying,
            RolloutAgentState::Succeeded,
            ("REVISION_ACTIVATED", "ok"),
            9
        )
        .await
        .unwrap()
    );
    assert!(
        s.set_rollout(
            id,
            (RolloutState::Running, 0),
            RolloutState::Paused,
            0,
            Some(5_000),
            Some("paused"),
            9
        )
        .await
        .unwrap()
    );
    assert!(
        !s.set_rollout(
            id,
            (RolloutState::Running, 0),
            RolloutState::Done,
            1,
            None,
            None,
            9
        )
        .await
        .unwrap()
    );
    assert_eq!(s.rollout_next_wave_ms(id).await.unwrap(), Some(5_000));
    assert_eq!(
        s.skip_pending_rollout_agents(id, ("ROLLOUT_ABORTED", "x"), 10)
            .await
            .unwrap(),
        1
    );
    // This one and the secret's aborted one above.
    assert_eq!(s.rollouts("ns", 10).await.unwrap().len(), 2);
    assert_eq!(s.rollouts_to_advance().await.unwrap().len(), 1);
    assert_eq!(
        s.rollout_counts().await.unwrap(),
        vec![("aborted".to_owned(), 1), ("paused".to_owned(), 1)]
    );
}

pub async fn retention_prunes_old_finished_work_and_audit(s: SharedStore) {
    world(&s, 1).await;
    s.audit("op", "old", "t", &json!({}), 1).await.unwrap();
    let now = crate::clock::now_seconds();
    s.audit("op", "new", "t", &json!({}), now).await.unwrap();
    let mut r = revision("a1");
    s.create_revision(&mut r).await.unwrap();
    // Nothing is older than an hour yet.
    let p = s.prune(3600, 3600).await.unwrap();
    assert_eq!((p.work, p.audit), (0, 1));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The queued deploy stays however old it is; the finished ensure goes.
    let p = s.prune(0, 3600).await.unwrap();
    assert_eq!(p.work, 1);
    assert_eq!(s.pending_work().await.unwrap(), 1);
    let left: Vec<String> = s
        .audit_events(10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(left, ["new"]);
}

pub async fn audit_and_drift_read_back(s: SharedStore) {
    // A deploy writes its revision, work and audit event together.
    world(&s, 1).await;
    let mut r = revision("a1");
    let work = match s.create_revision_audited(&mut r, "tok", 7).await.unwrap() {
        RevisionInsert::Queued(w) => w,
        other => panic!("{other:?}"),
    };
    let deploys = s.audit_events_of(10, Some("agent.deploy")).await.unwrap();
    assert_eq!(deploys.len(), 1);
    assert_eq!((deploys[0].actor.as_str(), deploys[0].at), ("tok", 7));
    assert_eq!(
        deploys[0].target,
        format!("{}/{}", r.namespace_id, r.agent_id)
    );
    assert_eq!(
        deploys[0].detail,
        json!({"revisionId": r.id, "number": r.number, "workId": work})
    );
    for (i, action) in ["a", "b", "a"].iter().enumerate() {
        s.audit("op", action, "t", &json!({"i": i}), i as i64)
            .await
            .unwrap();
    }
    let a = s.audit_events_of(10, Some("a")).await.unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].detail, json!({"i": 2}), "newest first");
    assert_eq!(s.audit_events(2).await.unwrap().len(), 2);
    let row = |target: &str, agent: &str, state: DriftState| DriftRow {
        target: target.into(),
        namespace_id: "ns".into(),
        agent_id: agent.into(),
        state,
        reason: (state == DriftState::Drift).then_some(DriftReason::UnitNotRunning),
        message: "m".into(),
        checked_at: 4,
    };
    s.replace_drift(
        "h1",
        &[
            row("h1", "a1", DriftState::Synced),
            row("h1", "a2", DriftState::Drift),
        ],
    )
    .await
    .unwrap();
    s.replace_drift("h2", &[row("h2", "a3", DriftState::Unreachable)])
        .await
        .unwrap();
    s.replace_drift("h1", &[row("h1", "a2", DriftState::Drift)])
        .await
        .unwrap();
    let rows = s.drift().await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].reason, Some(DriftReason::UnitNotRunning));
    s.retain_drift_targets(&["h1".into()]).await.unwrap();
    assert_eq!(s.drift().await.unwrap().len(), 1);
}

pub async fn row_counts_cover_every_table(s: SharedStore) {
    let tables: Vec<String> = s
        .row_counts()
        .await
        .unwrap()
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    for t in [
        "agent_workspace",
        "agent_workspace_files",
        "agents",
        "audit",
        "clusters",
        "configurations",
        "drift",
        "hosts",
        "leader",
        "namespace_hosts",
        "namespaces",
        "revisions",
        "rollout_agents",
        "rollouts",
        "schema_version",
        "secret_names",
        "secrets",
        "token_grants",
        "tokens",
        "work",
    ] {
        assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
    }
}

/// A store with a bit of everything: hosts, a Namespace, Agents with revisions and work,
/// a token, audit, drift, a rollout and workspace files.
pub async fn fill(s: &SharedStore) {
    world(s, 3).await;
    s.insert_host(&host("h2")).await.unwrap();
    s.set_host_probe("h1", &json!({"hostdVersion": "0.1.0"}))
        .await
        .unwrap();
    s.put_configuration("ns", "cfg", &json!({"gateway": {"mode": "local"}}), true, 2)
        .await
        .unwrap();
    let mut narrowed = agent("w");
    narrowed.egress = Some(Egress {
        ports: Some(vec![443]),
        allow: Some(vec!["10.9.0.0/16".into()]),
    });
    s.insert_agent(&narrowed, &[file("AGENTS.md", "hello")], 3)
        .await
        .unwrap();
    let v = s
        .put_secret("ns", &sname("api-key"), b"filler-value", "op", 2)
        .await
        .unwrap()
        .unwrap();
    let mut first = id("rev-0");
    for a in ["a1", "a2", "w"] {
        let mut r = revision(a);
        r.secrets = vec![crate::model::SecretBinding {
            name: v.name.clone(),
            version: v.version,
            fingerprint: v.fingerprint.clone(),
        }];
        s.create_revision(&mut r).await.unwrap();
        if a == "a1" {
            first = r.id;
        }
    }
    let w = s
        .claim_work("filler", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    s.place_agent(&w.claim, "ns", "a1", &["h1".into()])
        .await
        .unwrap();
    // Placement's one read: enrolled hosts only, in the order asked, with their Agent counts.
    let loads: Vec<(String, u32)> = s
        .host_loads(&["nope".into(), "h1".into()])
        .await
        .unwrap()
        .into_iter()
        .map(|(h, n)| (h.name.to_string(), n))
        .collect();
    assert_eq!(loads, vec![("h1".to_owned(), 1)]);
    s.commit_revision(&w.claim, "ns", "a1", None, &first)
        .await
        .unwrap();
    let activated = WorkEnd::Finished {
        state: WorkState::Done,
        code: "REVISION_ACTIVATED",
        message: "ok",
    };
    s.end_work(&w.claim, activated).await.unwrap();
    s.create_token(&NewTokenRow {
        id: "t1",
        name: "ci",
        secret_hash: "h",
        grants: &[Grant {
            namespace: "ns".into(),
            role: Role::Deploy,
        }],
        created_at: 1,
        expires_at: Some(10_000_000_000),
    })
    .await
    .unwrap();
    s.audit("op", "agent.create", "ns/a1", &json!({"x": [1, 2]}), 5)
        .await
        .unwrap();
    s.replace_drift(
        "h1",
        &[DriftRow {
            target: "h1".into(),
            namespace_id: "ns".into(),
            agent_id: "a1".into(),
            state: DriftState::Synced,
            reason: None,
            message: "ok".into(),
            checked_at: 6,
        }],
    )
    .await
    .unwrap();
    s.insert_rollout(&RolloutRow {
        namespace_id: "ns".into(),
        subject: RolloutSubject::Configuration {
            id: id("cfg"),
            generation: 1,
        },
        canary: 1,
        max_parallel: 1,
        max_failures: 0,
        pause_between_seconds: 0,
        manual_promote: true,
        created_by: "op".into(),
        agents: vec![("a3".into(), 0)],
        now: 7,
    })
    .await
    .unwrap();
}

/// Everything the API reads is the same in both stores.
pub async fn same_reads(a: &SharedStore, b: &SharedStore) {
    assert_eq!(a.hosts().await.unwrap(), b.hosts().await.unwrap());
    assert_eq!(a.namespaces().await.unwrap(), b.namespaces().await.unwrap());
    assert_eq!(
        a.configuration(&id("ns"), &id("cfg")).await.unwrap(),
        b.configuration(&id("ns"), &id("cfg")).await.unwrap()
    );
    assert_eq!(a.agents("ns").await.unwrap(), b.agents("ns").await.unwrap());
    for agent in ["a1", "a2", "a3", "w"] {
        assert_eq!(
            a.revisions("ns", agent).await.unwrap(),
            b.revisions("ns", agent).await.unwrap()
        );
        assert_eq!(
            a.recent_work("ns", agent, 50).await.unwrap(),
            b.recent_work("ns", agent, 50).await.unwrap()
        );
    }
    assert_eq!(
        a.token_by_hash("h").await.unwrap(),
        b.token_by_hash("h").await.unwrap()
    );
    assert_eq!(
        a.audit_events(100).await.unwrap(),
        b.audit_events(100).await.unwrap()
    );
    assert_eq!(a.drift().await.unwrap(), b.drift().await.unwrap());
    assert_eq!(
        a.rollouts("ns", 10).await.unwrap(),
        b.rollouts("ns", 10).await.unwrap()
    );
    assert_eq!(
        a.workspace_setup("ns", "w").await.unwrap(),
        b.workspace_setup("ns", "w").await.unwrap()
    );
    assert_eq!(
        a.workspace_contents("ns", "w").await.unwrap(),
        b.workspace_contents("ns", "w").await.unwrap()
    );
    assert_eq!(
        a.secrets("ns").await.unwrap(),
        b.secrets("ns").await.unwrap()
    );
    let (va, vb) = (
        a.secret_value("ns", "api-key", 1).await.unwrap().unwrap(),
        b.secret_value("ns", "api-key", 1).await.unwrap().unwrap(),
    );
    assert_eq!((&*va.value, &va.fingerprint), (&*vb.value, &vb.fingerprint));
    let counts = |v: Vec<(String, i64)>| -> BTreeMap<String, i64> {
        v.into_iter()
            .filter(|(t, _)| t != "schema_version" && t != "fence_counter")
            .collect()
    };
    assert_eq!(
        counts(a.row_counts().await.unwrap()),
        counts(b.row_counts().await.unwrap())
    );
}

pub async fn fences_only_grow_even_across_a_re_created_agent(s: SharedStore) {
    world(&s, 2).await;
    let lease = Duration::from_secs(30);
    let mut seen = Vec::new();
    for a in ["a1", "a2", "a1"] {
        let mut r = revision(a);
        s.create_revision(&mut r).await.unwrap();
        let w = s.claim_work("w", lease).await.unwrap().unwrap();
        seen.push(w.fence.unwrap());
        s.end_work(&w.claim, done()).await.unwrap();
    }
    // a1 is deleted and created again under the same ids: its fences go on upwards.
    s.set_desired(
        "ns",
        "a1",
        DesiredState::Deleted,
        Some(&Enqueue::agent(WorkKind::DeleteAgent, "ns", "a1")),
    )
    .await
    .unwrap();
    let w = s.claim_work("w", lease).await.unwrap().unwrap();
    seen.push(w.fence.unwrap());
    s.delete_agent_row(&w.claim, "ns", "a1").await.unwrap();
    s.end_work(&w.claim, done()).await.unwrap();
    assert!(s.insert_agent(&agent("a1"), &[], 2).await.unwrap());
    let mut r = revision("a1");
    s.create_revision(&mut r).await.unwrap();
    let w = s.claim_work("w", lease).await.unwrap().unwrap();
    seen.push(w.fence.unwrap());
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted, seen,
        "every claim's fence is higher than every earlier one: {seen:?}"
    );
}

fn sname(s: &str) -> SecretName {
    SecretName::new(s).unwrap()
}

/// Secrets: every write a new version with its fingerprint, writer and time; the value opens
/// for the worker only; a version is never reused, even after a delete; every change is
/// audited without the value; a missing or deleting Namespace takes none.
pub async fn secrets_are_versioned_sealed_and_deleted(s: SharedStore) {
    world(&s, 0).await;
    let slack = sname("slack-bot");
    let v1 = s
        .put_secret("ns", &slack, b"xoxb-one", "alice", 10)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v1.version, 1);
    assert_eq!(v1.fingerprint, SecretFingerprint::of(b"xoxb-one"));
    assert_eq!((v1.written_by.as_str(), v1.written_at), ("alice", 10));
    let v2 = s
        .put_secret("ns", &slack, b"xoxb-two", "bob", 11)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v2.version, 2);
    s.put_secret("ns", &sname("api-key"), b"sk-1", "alice", 12)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        s.put_secret("nope", &slack, b"x", "alice", 12)
            .await
            .unwrap(),
        None,
        "no Namespace, no secret"
    );
    let all = s.secrets("ns").await.unwrap();
    let listed: Vec<(&str, u32)> = all.iter().map(|v| (v.name.as_str(), v.version)).collect();
    assert_eq!(
        listed,
        vec![("api-key", 1), ("slack-bot", 1), ("slack-bot", 2)]
    );
    assert_eq!(
        s.secret_versions("ns", "slack-bot").await.unwrap(),
        vec![v1.clone(), v2.clone()]
    );
    assert_eq!(
        s.latest_secret("ns", "slack-bot").await.unwrap(),
        Some(v2.clone())
    );
    assert_eq!(s.latest_secret("ns", "nope").await.unwrap(), None);
    let value = s.secret_value("ns", "slack-bot", 1).await.unwrap().unwrap();
    assert_eq!(
        (&value.value[..], &value.fingerprint),
        (&b"xoxb-one"[..], &v1.fingerprint)
    );
    assert!(
        !format!("{value:?}").contains("xoxb"),
        "Debug never shows the value"
    );
    assert!(
        s.secret_value("ns", "slack-bot", 3)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        s.secret_value("other", "slack-bot", 1)
            .await
            .unwrap()
            .is_none()
    );
    // Deleted: every version goes; the next write continues the numbering.
    assert!(
        s.delete_secret("ns", "slack-bot", "carol", 13)
            .await
            .unwrap()
    );
    assert!(
        !s.delete_secret("ns", "slack-bot", "carol", 13)
            .await
            .unwrap()
    );
    assert!(
        s.secret_versions("ns", "slack-bot")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.secret_value("ns", "slack-bot", 2)
            .await
            .unwrap()
            .is_none()
    );
    let v3 = s
        .put_secret("ns", &slack, b"xoxb-three", "alice", 14)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v3.version, 3, "a version is never reused");
    // Audited, naming version and fingerprint, never the value.
    let events = s.audit_events(20).await.unwrap();
    let secret_events: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e.action.starts_with("secret."))
        .map(|e| (e.action.as_str(), e.actor.as_str()))
        .collect();
    assert_eq!(secret_events.len(), 5, "{secret_events:?}");
    assert!(secret_events.contains(&("secret.delete", "carol")));
    for e in &events {
        let text = serde_json::to_string(&e.detail).unwrap();
        assert!(!text.contains("xoxb") && !text.contains("sk-1"), "{text}");
    }
    let set = events
        .iter()
        .find(|e| e.action == "secret.set" && e.target == "ns/slack-bot" && e.actor == "bob")
        .unwrap();
    assert_eq!(
        set.detail,
        json!({"version": 2, "fingerprint": v2.fingerprint})
    );
    // A revision records the versions it was deployed with, and reads them back.
    s.insert_agent(&agent("a1"), &[], 1).await.unwrap();
    let mut r = revision("a1");
    r.secrets = vec![crate::model::SecretBinding {
        name: slack.clone(),
        version: 3,
        fingerprint: v3.fingerprint.clone(),
    }];
    s.create_revision(&mut r).await.unwrap();
    let back = s.revision("ns", "a1", &r.id).await.unwrap().unwrap();
    assert_eq!(back.secrets, r.secrets);
    let listed = s.revisions("ns", "a1").await.unwrap();
    assert_eq!(listed[0].secrets, r.secrets);
}

/// What [`put_secrets`] stores in clear text, which must never appear in the database's bytes.
pub const CREDENTIAL_SECRET: &str = "CREDENTIAL-PLAINTEXT-7f3a9c";
pub const WORKSPACE_SECRET: &str = "WORKSPACE-PLAINTEXT-51e2d8";
pub const SECRET_VALUE: &str = "SECRET-VALUE-PLAINTEXT-c04e17";

/// A cluster with credentials and an Agent with a workspace file, each holding its secret.
pub async fn put_secrets(s: &SharedStore) {
    world(s, 0).await;
    assert!(
        s.insert_cluster(&crate::model::ClusterRecord {
            cluster: crate::model::Cluster {
                name: "c1".into(),
                server: "https://127.0.0.1:6443".into(),
                settings: json!({}),
                created_at: 0,
                last_probe: None,
            },
            credentials: json!({"token": CREDENTIAL_SECRET}),
        })
        .await
        .unwrap()
    );
    assert!(
        s.insert_agent(&agent("w1"), &[file("SOUL.md", WORKSPACE_SECRET)], 5)
            .await
            .unwrap()
    );
    s.put_secret("ns", &sname("api-key"), SECRET_VALUE.as_bytes(), "op", 5)
        .await
        .unwrap()
        .unwrap();
}

/// The secrets [`put_secrets`] stored read back as they were.
pub async fn secrets_read_back(s: &SharedStore) -> Result<(), StoreError> {
    let c = s.cluster("c1").await?.unwrap();
    assert_eq!(c.credentials, json!({"token": CREDENTIAL_SECRET}));
    let files = s.workspace_contents("ns", "w1").await?;
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].content, WORKSPACE_SECRET.as_bytes());
    let v = s.secret_value("ns", "api-key", 1).await?.unwrap();
    assert_eq!(&v.value[..], SECRET_VALUE.as_bytes());
    Ok(())
}
