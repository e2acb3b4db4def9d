//! What a cluster actually runs for one Agent, judged only from observed state: never from a
//! successful write.
//!
//! Ready means all of: the Deployment's `status.observedGeneration` has caught up with its
//! generation; `spec.replicas` is 1 and `replicas == updatedReplicas == readyReplicas == 1`
//! (settled: no old Pod lingers); a live Pod of the revision reports Ready=True; the Service
//! selects that revision; and an EndpointSlice whose ownerReference is the Service's uid has
//! an endpoint with `conditions.ready == true`.

use std::collections::HashSet;

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureClass, FailureCode};
use clawfleet_protocol::result::{AgentObservation, UnitObservation};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, ObjectList};

use crate::client::Requests;
use crate::names::{self, Markers, Tenant};
use crate::objects::{Obj, conflict, label};
use crate::render;
use crate::settings::ClusterSettings;

/// One look at an Agent.
#[derive(Debug, Clone, Default)]
pub(crate) struct Observed {
    pub(crate) deployment: Option<Deployment>,
    /// The revision the Deployment carries (activated; its Pods may run an earlier
    /// revision of the same rendered configuration, see [`pod_revision`]).
    pub(crate) current: Option<Ident>,
    pub(crate) ready: bool,
    /// Why the current revision cannot become ready, when the cluster says so.
    pub(crate) blocker: Option<Failure>,
    pub(crate) sub_state: String,
    pub(crate) restarts: u32,
    /// How the Deployment's Pod template differs from what clawfleet applied, when it does.
    pub(crate) workload_drift: Option<String>,
}

impl Observed {
    /// The protocol's observation.
    pub(crate) fn observation(&self, settings: &ClusterSettings) -> AgentObservation {
        let unit = self.deployment.as_ref().map(|d| {
            let active_state = if self.ready {
                "active"
            } else if self.blocker.is_some() {
                "failed"
            } else {
                "activating"
            };
            UnitObservation {
                name: d.metadata.name.clone().unwrap_or_default(),
                active_state: active_state.to_owned(),
                sub_state: self.sub_state.clone(),
                n_restarts: self.restarts,
                enabled: true,
            }
        });
        AgentObservation {
            current: self.current.clone(),
            served: self.current.clone().filter(|_| self.ready),
            port: Some(settings.gateway_port),
            unit,
        }
    }
}

/// The revision a Deployment carries, from its annotation.
pub(crate) fn deployment_revision(d: &Deployment) -> Result<Option<(Ident, u64)>, Failure> {
    let a = d.metadata.annotations.as_ref();
    let id = a.and_then(|a| a.get(names::REVISION_ID));
    let number = a.and_then(|a| a.get(names::REVISION_NUMBER));
    let object = format!(
        "Deployment {}",
        d.metadata.name.as_deref().unwrap_or_default()
    );
    match (id, number) {
        (None, None) => Ok(None),
        (Some(id), Some(n)) => {
            let id = Ident::new(id.as_str()).map_err(|_| {
                conflict(
                    &object,
                    &format!("annotation {} is not a revision id", names::REVISION_ID),
                )
            })?;
            let n = n.parse::<u64>().map_err(|_| {
                conflict(
                    &object,
                    &format!("annotation {} is not a number", names::REVISION_NUMBER),
                )
            })?;
            Ok(Some((id, n)))
        }
        _ => Err(conflict(
            &object,
            &format!(
                "annotations {} and {} must both be present",
                names::REVISION_ID,
                names::REVISION_NUMBER
            ),
        )),
    }
}

/// The revision a Deployment's Pod template runs ([`names::POD_REVISION_ID`]; without it, the
/// revision the Deployment carries).
pub(crate) fn pod_revision(d: &Deployment) -> Result<Option<Ident>, Failure> {
    let carried = deployment_revision(d)?.map(|(id, _)| id);
    let Some(text) = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::POD_REVISION_ID))
    else {
        return Ok(carried);
    };
    let id = Ident::new(text.as_str()).map_err(|_| {
        conflict(
            &format!(
                "Deployment {}",
                d.metadata.name.as_deref().unwrap_or_default()
            ),
            &format!("annotation {} is not a revision id", names::POD_REVISION_ID),
        )
    })?;
    Ok(carried.map(|_| id))
}

fn malformed(what: &str, detail: &str) -> Failure {
    Failure::with_class(
        FailureClass::Retryable,
        FailureCode::KubernetesApiRejected,
        format!("{what}: malformed list: {detail}"),
    )
}

/// A list must be complete: no continue token, no remaining items.
fn check_complete<K: Clone>(what: &str, list: &ObjectList<K>) -> Result<(), Failure> {
    if list
        .metadata
        .continue_
        .as_deref()
        .is_some_and(|c| !c.is_empty())
        || list.metadata.remaining_item_count.is_some_and(|n| n > 0)
    {
        return Err(malformed(what, "the answer is paginated (continue token)"));
    }
    Ok(())
}

/// Lists the Agent's Pods and validates every item (names, namespace, markers, conditions).
pub(crate) async fn agent_pods(
    r: &Requests,
    t: &Tenant,
    agent: &Ident,
    extra_selector: Option<(&str, &str)>,
) -> Result<Vec<Pod>, Failure> {
    let tenant = t.name.clone();
    let api: Api<Pod> = Api::namespaced(r.client(), &tenant);
    let mut selector = Markers::agent(&t.id, agent);
    selector.annotations.clear();
    let mut sel = render::pod_selector(agent)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>();
    if let Some((k, v)) = extra_selector {
        sel.push(format!("{k}={v}"));
    }
    let lp = ListParams::default().labels(&sel.join(","));
    let what = format!("list Pods in {tenant}");
    let list = r.read(&what, || api.list(&lp)).await?;
    check_complete(&what, &list)?;
    for pod in &list.items {
        let name = pod
            .metadata
            .name
            .as_deref()
            .ok_or_else(|| malformed(&what, "a Pod without a name"))?;
        let object = label("Pod", Some(&tenant), name);
        if pod.metadata.namespace.as_deref() != Some(tenant.as_str()) {
            return Err(malformed(&what, "a Pod of another namespace"));
        }
        let labels = pod.metadata.labels.as_ref();
        for (k, v) in &selector.labels {
            if labels.and_then(|l| l.get(*k)) != Some(v) {
                return Err(conflict(
                    &object,
                    &format!("it carries clawfleet's selector but not its label {k}"),
                ));
            }
        }
        if let Some(conds) = pod.status.as_ref().and_then(|s| s.conditions.as_ref()) {
            let mut seen = HashSet::new();
            if let Some(dup) = conds.iter().find(|c| !seen.insert(c.type_.as_str())) {
                return Err(malformed(
                    &what,
                    &format!("Pod {name} repeats condition {}", dup.type_),
                ));
            }
        }
    }
    Ok(list.items)
}

fn live(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
}

fn condition(p: &Pod, type_: &str) -> Option<(String, Option<String>)> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn scheduling_message(p: &Pod) -> Option<String> {
    let m = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?
        .message
        .clone()?;
    Some(m.chars().take(200).collect())
}

fn waiting_reason(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
}

const PULL_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Looks at everything readiness depends on, plus what blocks it.
pub(crate) async fn observe(r: &Requests, t: &Tenant, agent: &Ident) -> Result<Observed, Failure> {
    let tenant = t.name.clone();
    let n = names::agent(agent);
    let markers = Markers::agent(&t.id, agent);
    let deployments: Obj<Deployment> = Obj::namespaced(r, &tenant, "Deployment");
    let services: Obj<Service> = Obj::namespaced(r, &tenant, "Service");
    let deployment = deployments.get_owned(r, &n.gateway, &markers).await?;
    let service = services.get_owned(r, &n.gateway, &markers).await?;
    let mut out = Observed::default();
    let Some(dep) = deployment else {
        return Ok(out);
    };
    let current = deployment_revision(&dep)?.map(|(id, _)| id);
    out.workload_drift = workload_drift(&dep);
    out.current = current.clone();
    out.deployment = Some(dep.clone());
    let Some(current) = current else {
        return Ok(out);
    };
    // The Pods run the template's revision: the current one, or the earlier one a
    // secrets-only change kept.
    let pod_rev = pod_revision(&dep)?.unwrap_or_else(|| current.clone());
    let serving = names::serving_value(&pod_rev);
    let pods = agent_pods(r, t, agent, Some((names::SERVING_REVISION, &serving))).await?;
    let live_pods: Vec<&Pod> = pods.iter().filter(|p| live(p)).collect();
    out.restarts = live_pods
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
        .sum();
    let pod_ready = live_pods
        .iter()
        .any(|p| condition(p, "Ready").is_some_and(|(s, _)| s == "True"));
    out.sub_state = live_pods
        .first()
        .map(|p| {
            waiting_reason(p)
                .or_else(|| {
                    condition(p, "PodScheduled")
                        .filter(|(s, _)| s == "False")
                        .and_then(|(_, reason)| reason)
                })
                .or_else(|| p.status.as_ref()?.phase.clone())
                .unwrap_or_else(|| "Pending".to_owned())
        })
        .unwrap_or_else(|| "NoPod".to_owned());

    // Blockers, most specific first.
    let object = label("Deployment", Some(&tenant), &n.gateway);
    if let Some(p) = live_pods.iter().find(|p| {
        condition(p, "PodScheduled")
            .is_some_and(|(s, reason)| s == "False" && reason.as_deref() == Some("Unschedulable"))
    }) {
        // The scheduler's own summary ("0/3 nodes are available: …") names no tenant data.
        let why = scheduling_message(p).unwrap_or_default();
        out.blocker = Some(Failure::new(
            FailureCode::RevisionUnschedulable,
            format!(
                "the Pod of revision {current} cannot be scheduled (PodScheduled=False, Unschedulable): {why}"
            ),
        ));
    } else if let Some(reason) = live_pods
        .iter()
        .filter_map(|p| waiting_reason(p))
        .find(|r| PULL_REASONS.contains(&r.as_str()))
    {
        out.blocker = Some(Failure::new(
            FailureCode::RevisionImagePullFailed,
            format!("the gateway image of revision {current} cannot be pulled ({reason})"),
        ));
    } else if live_pods.is_empty() && quota_exceeded(r, &tenant, &dep).await? {
        out.blocker = Some(Failure::new(
            FailureCode::NamespacePodQuotaExceeded,
            format!(
                "{object}: the namespace's Pod quota refuses the Pod of revision {current} (ReplicaSet FailedCreate, exceeded quota)"
            ),
        ));
        out.sub_state = "FailedCreate".to_owned();
    }

    let spec_replicas = dep.spec.replicas.unwrap_or(1);
    let st = dep.status.clone().unwrap_or_default();
    let generation_seen = match (st.observed_generation, dep.metadata.generation) {
        (Some(o), Some(g)) => o >= g,
        _ => false,
    };
    let settled = spec_replicas == 1
        && st.replicas.unwrap_or(0) == 1
        && st.updated_replicas.unwrap_or(0) == 1
        && st.ready_replicas.unwrap_or(0) == 1;
    let selects = service
        .as_ref()
        .and_then(|s| {
            s.spec
                .as_ref()?
                .selector
                .as_ref()?
                .get(names::SERVING_REVISION)
        })
        .is_some_and(|v| *v == serving);
    out.ready = generation_seen && settled && pod_ready && selects;
    if out.ready
        && let Some(svc) = &service
    {
        out.ready = endpoint_ready(r, &tenant, &n.gateway, svc).await?;
    }
    Ok(out)
}

/// How the Deployment's live Pod template differs from the one clawfleet applied (its
/// fingerprint annotation); `None` when it does not, or when the Deployment predates the
/// annotation (the next activation adds it).
pub(crate) fn workload_drift(dep: &Deployment) -> Option<String> {
    let text = dep
        .metadata
        .annotations
        .as_ref()?
        .get(names::WORKLOAD_FINGERPRINT)?;
    match render::WorkloadFingerprint::from_text(text) {
        None => Some(format!(
            "annotation {} is not a fingerprint clawfleet wrote",
            names::WORKLOAD_FINGERPRINT
        )),
        Some(applied) => applied.differences(&render::workload_fingerprint(dep)),
    }
}

/// An EndpointSlice owned by the Service's uid has a ready endpoint.
async fn endpoint_ready(
    r: &Requests,
    tenant: &str,
    service_name: &str,
    svc: &Service,
) -> Result<bool, Failure> {
    let Some(uid) = svc.metadata.uid.as_deref() else {
        return Ok(false);
    };
    let api: Api<EndpointSlice> = Api::namespaced(r.client(), tenant);
    let lp = ListParams::default().labels(&format!("{}={service_name}", names::SERVICE_NAME_LABEL));
    let what = format!("list EndpointSlices of Service {tenant}/{service_name}");
    let list = r.read(&what, || api.list(&lp)).await?;
    check_complete(&what, &list)?;
    Ok(list.items.iter().any(|s| {
        let owned = s
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o.uid == uid && o.kind == "Service"));
        owned
            && s.endpoints
                .iter()
                .flatten()
                .any(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
    }))
}

/// A ReplicaSet of this Deployment (by owner uid) or the Deployment itself reports
/// ReplicaFailure/FailedCreate with "exceeded quota".
async fn quota_exceeded(r: &Requests, tenant: &str, dep: &Deployment) -> Result<bool, Failure> {
    let says_quota =
        |type_: Option<&str>, status: Option<&str>, reason: Option<&str>, message: Option<&str>| {
            type_ == Some("ReplicaFailure")
                && status == Some("True")
                && reason == Some("FailedCreate")
                && message.is_some_and(|m| m.contains("exceeded quota"))
        };
    if dep
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter().any(|c| {
                says_quota(
                    c.type_.as_deref(),
                    c.status.as_deref(),
                    c.reason.as_deref(),
                    c.message.as_deref(),
                )
            })
        })
    {
        return Ok(true);
    }
    let Some(uid) = dep.metadata.uid.as_deref() else {
        return Ok(false);
    };
    let Some(agent) = dep
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::AGENT_ID))
    else {
        return Ok(false);
    };
    let api: Api<ReplicaSet> = Api::namespaced(r.client(), tenant);
    let lp = ListParams::default().labels(&format!(
        "{}={},{}={agent}",
        names::MANAGED_BY,
        names::MANAGER,
        names::AGENT_ID
    ));
    let what = format!("list ReplicaSets in {tenant}");
    let list = r.read(&what, || api.list(&lp)).await?;
    check_complete(&what, &list)?;
    Ok(list.items.iter().any(|rs| {
        rs.metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o.uid == uid))
            && rs
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        says_quota(
                            c.type_.as_deref(),
                            c.status.as_deref(),
                            c.reason.as_deref(),
                            c.message.as_deref(),
                        )
                    })
                })
    }))
}
