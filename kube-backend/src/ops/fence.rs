//! Fencing on a cluster, as hostd fences on a host: every Agent-scoped operation that changes
//! the Agent (prepare, activate, stop, retire, delete) carries the fence of the coordinator's
//! claim. The Agent's ServiceAccount (created by the first prepare, kept across revisions,
//! deleted last) holds the highest fence seen in the annotation [`names::FENCE`]. Before the
//! operation writes anything, a lower fence is refused with `FENCE_STALE`, and a higher one is
//! recorded with the ServiceAccount's resourceVersion as precondition, so of two coordinators
//! racing, one records and the other re-reads and is refused. Once fenced, an unfenced
//! operation (a coordinator from before fencing) is refused as well.
//!
//! The check precedes the operation's writes rather than guarding each one (the API server has
//! no cross-object transactions): a coordinator paused after its check and before its first
//! write could still write once; the window is one request, where hostd's is none (it holds
//! the Agent lock).

use clawfleet_protocol::Operation;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::ident::Ident;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Patch, PatchParams};

use crate::client::{Requests, api_failure, status_of};
use crate::names::{self, Markers};
use crate::objects::{Obj, stale_resource_version};
use crate::settings::ClusterSettings;

/// How often a record that lost a race is re-read before giving up (retryable).
const RACES: usize = 4;

/// The Namespace and Agent of an operation that is fenced, `None` for the others.
fn scope(op: &Operation) -> Option<(&Ident, &Ident)> {
    match op {
        Operation::PrepareRevision(a) => Some((&a.namespace.id, &a.agent.id)),
        Operation::ActivateRevision(a) => Some((&a.namespace.id, &a.agent.id)),
        Operation::StopRevision(a) | Operation::RetireRevision(a) => {
            Some((&a.namespace.id, &a.agent.id))
        }
        Operation::DeleteAgent(a) => Some((&a.namespace.id, &a.agent.id)),
        _ => None,
    }
}

/// The fence recorded on a ServiceAccount; a malformed value names the object.
fn recorded(sa: &ServiceAccount, tenant: &str) -> Result<Option<u64>, Failure> {
    let Some(text) = sa
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::FENCE))
    else {
        return Ok(None);
    };
    match text.parse::<u64>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(Failure::new(
            FailureCode::KubernetesApiRejected,
            format!(
                "annotation {} of ServiceAccount {tenant}/{} is {:?}, not a positive integer; \
                 remove it or set it to the Agent's last fence",
                names::FENCE,
                sa.metadata.name.as_deref().unwrap_or_default(),
                text.chars().take(40).collect::<String>()
            ),
        )),
    }
}

fn stale(agent: &Ident, fence: Option<u64>, held: u64) -> Failure {
    let seen = match fence {
        Some(f) => format!("fence {f}"),
        None => "no fence".to_owned(),
    };
    Failure::new(
        FailureCode::FenceStale,
        format!(
            "Agent {agent} is fenced at {held}; an operation with {seen} comes from a \
             coordinator whose claim was replaced"
        ),
    )
}

/// Checks and records `fence` for `op` before it writes; a no-op for operations that are not
/// fenced, and for an Agent with no ServiceAccount yet (its first prepare creates it, and
/// the next fenced operation records the fence).
pub(crate) async fn check(
    r: &Requests,
    settings: &ClusterSettings,
    op: &Operation,
    fence: Option<u64>,
) -> Result<(), Failure> {
    let Some((ns, agent)) = scope(op) else {
        return Ok(());
    };
    check_agent(r, settings, ns, agent, fence).await
}

/// Checks and records `fence` for a change of one Agent (see [`check`]).
pub(crate) async fn check_agent(
    r: &Requests,
    settings: &ClusterSettings,
    ns: &Ident,
    agent: &Ident,
    fence: Option<u64>,
) -> Result<(), Failure> {
    let t = settings.tenant(ns);
    let accounts: Obj<ServiceAccount> = Obj::namespaced(r, &t.name, "ServiceAccount");
    let name = names::agent(agent).gateway;
    let markers = Markers::agent(ns, agent);
    for _ in 0..RACES {
        let Some(sa) = accounts.get(r, &name).await? else {
            return Ok(());
        };
        if !crate::objects::made_by_clawfleet(&sa.metadata) {
            // Not the Agent's: it holds no fence. The operation's own checks refuse it (a
            // write there) or leave it alone (delete-agent).
            return Ok(());
        }
        crate::objects::check_owned(
            "ServiceAccount",
            Some(&t.name),
            &name,
            &sa.metadata,
            &markers,
        )?;
        let held = recorded(&sa, &t.name)?;
        let Some(fence) = fence else {
            return match held {
                Some(h) => Err(stale(agent, None, h)),
                None => Ok(()),
            };
        };
        match held {
            Some(h) if fence < h => return Err(stale(agent, Some(fence), h)),
            Some(h) if fence == h => return Ok(()),
            _ => {}
        }
        if sa.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": name,
                "namespace": t.name,
                "resourceVersion": sa.metadata.resource_version,
                "annotations": { names::FENCE: fence.to_string() },
            },
        });
        let what = accounts.what("record the fence on", &name);
        let params = PatchParams::apply(names::FENCE_MANAGER).force();
        match r
            .write(
                &what,
                accounts.api.patch(&name, &params, &Patch::Apply(&patch)),
            )
            .await
        {
            Ok(_) => {
                tracing::debug!(agent = %agent, fence, "fence recorded");
                return Ok(());
            }
            // Another coordinator recorded first: read again, and be refused if it was newer.
            Err(e) if status_of(&e) == Some(409) && stale_resource_version(&e) => continue,
            Err(e) => return Err(api_failure(&what, &e)),
        }
    }
    Err(Failure::new(
        FailureCode::KubernetesApiUnavailable,
        format!("the fence of Agent {agent} kept changing while it was recorded; retry"),
    ))
}
