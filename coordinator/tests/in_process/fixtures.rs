//! What the in-process files share: the host key their hosts are enrolled with, and the
//! service-level setup they all start from (pool hosts, a Namespace with its Configuration,
//! Agents, a cluster record that no test reaches).
#![allow(clippy::unwrap_used)]

use coordinator::model::{Cluster, ClusterRecord};
use coordinator::service::{NewAgent, NewHost, NewNamespace, Service};
use coordinator::store::SharedStore;
use serde_json::{Value, json};

/// The host key every in-process host is enrolled with (no sshd holds it).
pub const HOST_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtlzZ3MFfuteL1oS3yr1Yx72/TNBkiGm1NN+JwrXN+M";

/// A pool host `name` at 127.0.0.1:22 with `host_key`, taking `max_agents`.
pub fn host(name: &str, host_key: &str, max_agents: u32) -> NewHost {
    NewHost {
        name: name.into(),
        address: "127.0.0.1".into(),
        port: 22,
        host_key: host_key.into(),
        max_agents,
        login_user: None,
        jump: None,
    }
}

/// Enrols pool hosts h1 to h`n` ([`HOST_KEY`], 100 Agents each): their names.
pub async fn enrol_hosts(svc: &Service, n: usize) -> Vec<String> {
    let names: Vec<String> = (1..=n).map(|i| format!("h{i}")).collect();
    for name in &names {
        svc.enrol_host("test", host(name, HOST_KEY, 100))
            .await
            .unwrap();
    }
    names
}

/// Namespace `ns` on `hosts` (or on `cluster`), accepted; its ensure work is queued, not run.
pub async fn namespace(svc: &Service, ns: &str, hosts: Vec<String>, cluster: Option<String>) {
    svc.create_namespace(
        "test",
        NewNamespace {
            id: ns.into(),
            name: None,
            hosts,
            cluster,
            single_tenant: false,
        },
        true,
    )
    .await
    .unwrap();
}

/// Configuration `cfg` in `ns`, holding `document`, accepted.
pub async fn configuration(svc: &Service, ns: &str, document: Value) {
    svc.put_configuration("test", ns, "cfg", document, true)
        .await
        .unwrap();
}

/// Agent `id` in `ns` on Configuration `cfg`, with nothing else set.
pub async fn agent(svc: &Service, ns: &str, id: &str) {
    svc.create_agent(
        "test",
        ns,
        NewAgent {
            id: id.into(),
            service_principal_id: None,
            configuration_id: "cfg".into(),
            harness_auth: None,
            restore: None,
            workspace_files: Vec::new(),
            egress: None,
        },
    )
    .await
    .unwrap();
}

/// Cluster `c1` in the store, at an address nothing answers on: the worker's cluster path
/// runs against the test's backend, never a real API server.
pub async fn fake_cluster(store: &SharedStore) {
    store
        .insert_cluster(&ClusterRecord {
            cluster: Cluster {
                name: "c1".into(),
                server: "https://127.0.0.1:6443".into(),
                settings: json!({}),
                created_at: 0,
                last_probe: None,
            },
            credentials: json!({"token": "not-a-real-token"}),
        })
        .await
        .unwrap();
}
