//! `status`: hostd's inventory shape, read from the cluster. Read-only; anything clawfleet
//! cannot read as its own is reported as a problem, never repaired.

use std::collections::BTreeMap;

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::Failure;
use clawfleet_protocol::operation::{RevisionNumber, StatusArgs};
use clawfleet_protocol::result::{
    AgentInventory, Inventory, InventoryProblem, NamespaceInventory, RevisionInventory,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};

use crate::client::Requests;
use crate::names;
use crate::objects::check_owned;
use crate::observe;
use crate::settings::ClusterSettings;

fn id_label(meta: &ObjectMeta, key: &str) -> Option<Ident> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .and_then(|v| Ident::new(v.as_str()).ok())
}

fn problem(path: String, message: impl Into<String>) -> InventoryProblem {
    InventoryProblem {
        path,
        message: message.into(),
    }
}

fn managed() -> ListParams {
    ListParams::default().labels(&format!("{}={}", names::MANAGED_BY, names::MANAGER))
}

/// `status`.
pub(crate) async fn status(
    r: &Requests,
    settings: &ClusterSettings,
    args: &StatusArgs,
) -> Result<Inventory, Failure> {
    let api: Api<Namespace> = Api::all(r.client());
    // Managed and adopted namespaces both carry the Namespace id label.
    let lp = match &args.namespace_id {
        Some(id) => ListParams::default().labels(&format!("{}={id}", names::NAMESPACE_ID)),
        None => ListParams::default().labels(names::NAMESPACE_ID),
    };
    let list = r.read("list Namespaces", || api.list(&lp)).await?;
    let mut inv = Inventory::default();
    for ns in &list.items {
        let k8s_name = ns.metadata.name.clone().unwrap_or_default();
        let path = format!("namespace/{k8s_name}");
        let Some(id) = id_label(&ns.metadata, names::NAMESPACE_ID) else {
            inv.problems.push(problem(
                path,
                format!("label {} is missing or invalid", names::NAMESPACE_ID),
            ));
            continue;
        };
        let t = settings.tenant(&id);
        if k8s_name != t.name {
            inv.problems.push(problem(
                path,
                "a namespace with clawfleet's labels where this cluster's settings do not place that Namespace",
            ));
            continue;
        }
        if let Err(f) = check_owned(
            "Namespace",
            None,
            &k8s_name,
            &ns.metadata,
            &t.namespace_markers(),
        ) {
            inv.problems.push(problem(path, f.message));
            continue;
        }
        let Some(name) = ns
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::NAMESPACE_NAME))
            .and_then(|v| Ident::new(v.as_str()).ok())
        else {
            inv.problems.push(problem(
                path,
                format!("annotation {} is missing or invalid", names::NAMESPACE_NAME),
            ));
            continue;
        };
        let agents = namespace_agents(r, settings, &t, &mut inv.problems).await?;
        inv.namespaces.push(NamespaceInventory { id, name, agents });
    }
    Ok(inv)
}

async fn namespace_agents(
    r: &Requests,
    settings: &ClusterSettings,
    t: &names::Tenant,
    problems: &mut Vec<InventoryProblem>,
) -> Result<Vec<AgentInventory>, Failure> {
    let ns = &t.id;
    let tenant = t.name.as_str();
    let accounts: Api<ServiceAccount> = Api::namespaced(r.client(), tenant);
    let cms: Api<ConfigMap> = Api::namespaced(r.client(), tenant);
    let lp = managed();
    let sa_list = r
        .read(&format!("list ServiceAccounts in {tenant}"), || {
            accounts.list(&lp)
        })
        .await?;
    let cm_list = r
        .read(&format!("list ConfigMaps in {tenant}"), || {
            cms.list_metadata(&lp)
        })
        .await?;
    // The secret versions each Agent's Secret records (metadata only: never a value), for
    // the coordinator's drift check, as hostd reports what its last put-secrets left.
    let secrets: Api<Secret> = Api::namespaced(r.client(), tenant);
    let secret_list = r
        .read(&format!("list Secrets in {tenant}"), || {
            secrets.list_metadata(&lp)
        })
        .await?;
    let mut held: BTreeMap<Ident, Vec<clawfleet_protocol::sealed::SecretVersion>> = BTreeMap::new();
    for m in &secret_list.items {
        let Some(agent) = id_label(&m.metadata, names::AGENT_ID) else {
            continue;
        };
        let n = names::agent(&agent);
        if m.metadata.name.as_deref() != Some(n.secrets.as_str())
            || check_owned(
                "Secret",
                Some(tenant),
                &n.secrets,
                &m.metadata,
                &names::Markers::agent(ns, &agent),
            )
            .is_err()
        {
            continue;
        }
        match crate::secrets::recorded_versions(&m.metadata) {
            Some(v) => {
                held.insert(agent, v);
            }
            None => problems.push(problem(
                format!("namespace/{tenant}/secret/{}", n.secrets),
                format!("annotation {} missing or invalid", crate::secrets::VERSIONS),
            )),
        }
    }
    let mut revisions: BTreeMap<Ident, Vec<RevisionInventory>> = BTreeMap::new();
    for cm in &cm_list.items {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let path = format!("namespace/{tenant}/configmap/{name}");
        let (Some(agent), Some(rev)) = (
            id_label(&cm.metadata, names::AGENT_ID),
            id_label(&cm.metadata, names::REVISION_ID),
        ) else {
            problems.push(problem(path, "agent or revision label missing or invalid"));
            continue;
        };
        let number = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::REVISION_NUMBER))
            .and_then(|n| n.parse::<u64>().ok())
            .and_then(|n| RevisionNumber::new(n).ok());
        let Some(number) = number else {
            problems.push(problem(
                path,
                format!("annotation {} missing or invalid", names::REVISION_NUMBER),
            ));
            continue;
        };
        revisions
            .entry(agent)
            .or_default()
            .push(RevisionInventory { id: rev, number });
    }
    let mut agents = Vec::new();
    for sa in &sa_list.items {
        let name = sa.metadata.name.clone().unwrap_or_default();
        let path = format!("namespace/{tenant}/serviceaccount/{name}");
        let Some(agent) = id_label(&sa.metadata, names::AGENT_ID) else {
            continue;
        };
        if let Err(f) = check_owned(
            "ServiceAccount",
            Some(tenant),
            &names::agent(&agent).gateway,
            &sa.metadata,
            &names::Markers::agent(ns, &agent),
        ) {
            problems.push(problem(path, f.message));
            continue;
        }
        let Some(sp) = sa
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::SERVICE_PRINCIPAL_ID))
            .and_then(|v| Ident::new(v.as_str()).ok())
        else {
            problems.push(problem(
                path,
                format!(
                    "annotation {} missing or invalid",
                    names::SERVICE_PRINCIPAL_ID
                ),
            ));
            continue;
        };
        let observed = match Box::pin(observe::observe(r, t, &agent)).await {
            Ok(o) => o,
            Err(f) => {
                problems.push(problem(path.clone(), f.message));
                continue;
            }
        };
        if let Some(why) = &observed.workload_drift {
            // Attributed to the Agent by the coordinator's drift sweep (`…/workload`).
            problems.push(problem(
                format!("namespaces/{ns}/agents/{agent}/workload"),
                format!(
                    "Deployment {tenant}/{}: the Pod template differs from what clawfleet applied ({why}); `occ agent reconcile` restores it",
                    names::agent(&agent).gateway
                ),
            ));
        }
        let observation = observed.observation(settings);
        let mut revs = revisions.remove(&agent).unwrap_or_default();
        revs.sort_by_key(|r| r.number);
        agents.push(AgentInventory {
            unit_drift: None,
            // No Secret: the Agent holds none.
            secrets: Some(held.remove(&agent).unwrap_or_default()),
            id: agent,
            service_principal_id: sp,
            account: name,
            revisions: revs,
            observation,
        });
    }
    for (agent, _) in revisions {
        problems.push(problem(
            format!("namespace/{tenant}/agent/{agent}"),
            "revision ConfigMaps of an Agent without its ServiceAccount",
        ));
    }
    Ok(agents)
}
