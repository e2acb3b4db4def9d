//! `delete-agent`: everything of one Agent, checked first, deleted after.

use std::time::Duration;

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::AgentArgs;
use clawfleet_protocol::result::DeleteAgentResult;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Resource;
use kube::api::{Api, ListParams};

use crate::client::Requests;
use crate::names::{self, Markers};
use crate::objects::{Obj, check_owned};
use crate::observe::agent_pods;
use crate::ops::namespace::owned_namespace;
use crate::ops::pause_within;

/// The object at `name` when it is exactly ours; `None` when absent or when clawfleet never
/// made it (no `managed-by=clawfleet` label: its label goes to `foreign`).
pub(crate) async fn get_ours<K>(
    r: &Requests,
    obj: &Obj<K>,
    name: &str,
    m: &Markers,
    foreign: &mut Vec<String>,
) -> Result<Option<K>, Failure>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Some(o) = obj.get(r, name).await? else {
        return Ok(None);
    };
    if !crate::objects::made_by_clawfleet(o.meta()) {
        foreign.push(crate::objects::label(obj.kind, obj.ns.as_deref(), name));
        return Ok(None);
    }
    check_owned(obj.kind, obj.ns.as_deref(), name, o.meta(), m)?;
    Ok(Some(o))
}

/// `delete-agent`.
pub(crate) async fn delete(
    r: &Requests,
    settings: &crate::settings::ClusterSettings,
    args: &AgentArgs,
) -> Result<DeleteAgentResult, Failure> {
    let ns = &args.namespace.id;
    let t = settings.tenant(ns);
    let agent = &args.agent.id;
    if owned_namespace(r, &t).await?.is_none() {
        return Ok(DeleteAgentResult { removed: false });
    }
    let tenant = t.name.clone();
    let n = names::agent(agent);
    let m = Markers::agent(ns, agent);
    let deployments: Obj<Deployment> = Obj::namespaced(r, &tenant, "Deployment");
    let services: Obj<Service> = Obj::namespaced(r, &tenant, "Service");
    let accounts: Obj<ServiceAccount> = Obj::namespaced(r, &tenant, "ServiceAccount");
    let claims: Obj<PersistentVolumeClaim> = Obj::namespaced(r, &tenant, "PersistentVolumeClaim");
    let secrets: Obj<Secret> = Obj::namespaced(r, &tenant, "Secret");
    let policies: Obj<NetworkPolicy> = Obj::namespaced(r, &tenant, "NetworkPolicy");
    let config_maps: Obj<ConfigMap> = Obj::namespaced(r, &tenant, "ConfigMap");

    // Check first: every object of the Agent is ours, or nothing is deleted. An object at one
    // of its names that clawfleet never made (no managed-by=clawfleet) is not the Agent's: it
    // is left untouched and reported, and the Agent's own objects go (a tampered object of
    // ours still refuses the whole delete).
    let mut foreign = Vec::new();
    let dep = get_ours(r, &deployments, &n.gateway, &m, &mut foreign).await?;
    let svc = get_ours(r, &services, &n.gateway, &m, &mut foreign).await?;
    let sa = get_ours(r, &accounts, &n.gateway, &m, &mut foreign).await?;
    let pvc = get_ours(r, &claims, &n.state, &m, &mut foreign).await?;
    let secret = get_ours(r, &secrets, &n.password, &m, &mut foreign).await?;
    let workspace = get_ours(r, &secrets, &n.workspace, &m, &mut foreign).await?;
    let agent_secrets = get_ours(r, &secrets, &n.secrets, &m, &mut foreign).await?;
    let egress = get_ours(r, &policies, &n.egress, &m, &mut foreign).await?;
    for object in &foreign {
        tracing::warn!(agent = %agent, "delete-agent leaves {object} untouched: clawfleet did not make it");
    }
    let cm_api: Api<ConfigMap> = Api::namespaced(r.client(), &tenant);
    let lp = ListParams::default().labels(&m.selector());
    let cms = r
        .read(&format!("list ConfigMaps in {tenant}"), || cm_api.list(&lp))
        .await?;
    if cms
        .metadata
        .continue_
        .as_deref()
        .is_some_and(|c| !c.is_empty())
    {
        return Err(Failure::new(
            FailureCode::KubernetesApiRejected,
            format!("list ConfigMaps in {tenant}: the answer is paginated"),
        ));
    }
    let mut revision_maps = Vec::new();
    for cm in &cms.items {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let rev = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(names::REVISION_ID))
            .and_then(|v| clawfleet_protocol::Ident::new(v.as_str()).ok());
        let Some(rev) = rev else {
            return Err(crate::objects::conflict(
                &format!("ConfigMap {tenant}/{name}"),
                &format!(
                    "label {} is missing or not a revision id",
                    names::REVISION_ID
                ),
            ));
        };
        if name != names::revision_config_map(agent, &rev) {
            return Err(crate::objects::conflict(
                &format!("ConfigMap {tenant}/{name}"),
                "it carries the Agent's labels under a name clawfleet does not use",
            ));
        }
        check_owned(
            "ConfigMap",
            Some(&tenant),
            &name,
            &cm.metadata,
            &Markers::revision(ns, agent, &rev),
        )?;
        revision_maps.push((name, cm.meta().clone()));
    }
    let mut removed = false;

    // Then delete: the Deployment first, and wait until its Pods are gone.
    if let Some(d) = &dep {
        removed |= deployments.delete(r, &n.gateway, &d.metadata, true).await?;
    }
    let mut pause = Duration::from_millis(100);
    loop {
        let pods = agent_pods(r, &t, agent, None).await?;
        if pods.is_empty() {
            break;
        }
        if !pause_within(r, pause).await {
            return Err(Failure::new(
                FailureCode::DeadlineExceeded,
                format!(
                    "{} Pod(s) of Agent {agent} are still terminating; retry",
                    pods.len()
                ),
            ));
        }
        pause = (pause * 3 / 2).min(Duration::from_secs(1));
    }
    if let Some(o) = &svc {
        removed |= services.delete(r, &n.gateway, &o.metadata, false).await?;
    }
    for (name, meta) in &revision_maps {
        removed |= config_maps.delete(r, name, meta, false).await?;
    }
    if let Some(o) = &secret {
        removed |= secrets.delete(r, &n.password, &o.metadata, false).await?;
    }
    if let Some(o) = &workspace {
        removed |= secrets.delete(r, &n.workspace, &o.metadata, false).await?;
    }
    if let Some(o) = &agent_secrets {
        removed |= secrets.delete(r, &n.secrets, &o.metadata, false).await?;
    }
    if let Some(o) = &pvc {
        removed |= claims.delete(r, &n.state, &o.metadata, false).await?;
    }
    if let Some(o) = &sa {
        removed |= accounts.delete(r, &n.gateway, &o.metadata, false).await?;
    }
    if let Some(o) = &egress {
        removed |= policies.delete(r, &n.egress, &o.metadata, false).await?;
    }
    if removed {
        tracing::info!(agent = %agent, tenant = %tenant, "Agent deleted");
    }
    Ok(DeleteAgentResult { removed })
}
