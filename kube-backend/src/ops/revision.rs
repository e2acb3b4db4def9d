//! Revision operations: prepare (stage only), activate (cutover and observed readiness),
//! verify, stop and retire.

use std::time::{Duration, Instant};

use clawfleet_protocol::Ident;
use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::{
    ActivateArgs, AgentRef, PrepareArgs, RevisionArgs, RevisionRef,
};
use clawfleet_protocol::result::{
    ActivateResult, AgentObservation, PrepareResult, Restored, RetireResult, StopResult,
    VerifyResult,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::client::Requests;
use crate::names::{self, Markers, Tenant};
use crate::objects::{Obj, label};
use crate::observe::{self, Observed, agent_pods, deployment_revision};
use crate::ops::namespace::require_namespace;
use crate::ops::{pause_within, render_failure};
use crate::render;
use crate::settings::ClusterSettings;

/// How long a blocker (unschedulable, image pull, quota) must hold before activation stops
/// waiting and reports it: long enough for the scheduler and the kubelet to retry once.
const BLOCKER_SETTLE: Duration = Duration::from_secs(4);

/// The Agent's objects, with their APIs.
struct AgentObjects {
    tenant: String,
    names: names::AgentNames,
    markers: Markers,
    deployments: Obj<Deployment>,
    services: Obj<Service>,
    accounts: Obj<ServiceAccount>,
    claims: Obj<PersistentVolumeClaim>,
    secrets: Obj<Secret>,
    policies: Obj<NetworkPolicy>,
    config_maps: Obj<ConfigMap>,
}

impl AgentObjects {
    fn new(r: &Requests, t: &Tenant, agent: &Ident) -> Self {
        let tenant = t.name.clone();
        Self {
            names: names::agent(agent),
            markers: Markers::agent(&t.id, agent),
            deployments: Obj::namespaced(r, &tenant, "Deployment"),
            services: Obj::namespaced(r, &tenant, "Service"),
            accounts: Obj::namespaced(r, &tenant, "ServiceAccount"),
            claims: Obj::namespaced(r, &tenant, "PersistentVolumeClaim"),
            secrets: Obj::namespaced(r, &tenant, "Secret"),
            policies: Obj::namespaced(r, &tenant, "NetworkPolicy"),
            config_maps: Obj::namespaced(r, &tenant, "ConfigMap"),
            tenant,
        }
    }
}

fn random_password() -> Result<String, Failure> {
    clawfleet_protocol::random::hex(32)
        .map_err(|e| Failure::new(FailureCode::IoFailed, e.to_string()))
}

fn has_password(s: &Secret) -> bool {
    s.data
        .as_ref()
        .and_then(|d| d.get(names::PASSWORD_KEY))
        .is_some_and(|v| !v.0.is_empty())
}

/// A revision's ConfigMap must say exactly what the revision says.
fn check_config_map(
    cm: &ConfigMap,
    rev: &RevisionRef,
    rendered: Option<&str>,
) -> Result<(), Failure> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let a = cm.metadata.annotations.as_ref();
    let number_ok = a.and_then(|a| a.get(names::REVISION_NUMBER)) == Some(&rev.number.to_string());
    let hash_ok = a
        .and_then(|a| a.get(names::CONFIGURATION_HASH))
        .map(String::as_str)
        == Some(rev.configuration_hash.as_str());
    let data = cm
        .data
        .as_ref()
        .and_then(|d| d.get(names::CONFIG_KEY))
        .map(String::as_str);
    let content_ok = data.is_some_and(|d| {
        a.and_then(|a| a.get(names::RENDERED_HASH))
            .map(String::as_str)
            == Some(render::rendered_hash(d).as_str())
    });
    let data_ok = content_ok && rendered.is_none_or(|text| data == Some(text));
    if !(number_ok && hash_ok && data_ok && cm.immutable == Some(true)) {
        return Err(Failure::new(
            FailureCode::SnapshotMismatch,
            format!(
                "ConfigMap {name} differs from revision {} (number, configuration hash, content or immutability)",
                rev.id
            ),
        ));
    }
    Ok(())
}

/// Whether the Deployment runs a revision newer than `rev`; the same number under another id
/// is a mismatch (numbers name exactly one revision).
fn newer_deployed(d: Option<&Deployment>, rev: &RevisionRef) -> Result<bool, Failure> {
    let Some(d) = d else { return Ok(false) };
    let Some((id, number)) = deployment_revision(d)? else {
        return Ok(false);
    };
    if number == rev.number.get() && id != rev.id {
        return Err(Failure::new(
            FailureCode::SnapshotMismatch,
            format!("revision number {number} already runs as revision {id}"),
        ));
    }
    Ok(number > rev.number.get())
}

async fn observation(
    r: &Requests,
    settings: &ClusterSettings,
    t: &Tenant,
    agent: &Ident,
) -> Result<AgentObservation, Failure> {
    Ok(Box::pin(observe::observe(r, t, agent))
        .await?
        .observation(settings))
}

/// The TCP ports the Agent's egress policy opens: the cluster's ([`render::EGRESS_PORTS`],
/// no other range), narrowed by the Agent's own settings; a port or range the cluster does not
/// allow is `EGRESS_NOT_ALLOWED`, naming the entry.
pub(crate) fn egress_ports(egress: Option<&Egress>) -> Result<Vec<u16>, Failure> {
    match egress {
        None => Ok(render::EGRESS_PORTS.to_vec()),
        Some(e) => e
            .within(render::EGRESS_PORTS, &[])
            .map(|(ports, _)| ports)
            .map_err(|err| Failure::new(FailureCode::EgressNotAllowed, err.to_string())),
    }
}

/// `prepare-revision`.
pub(crate) async fn prepare(
    r: &Requests,
    settings: &ClusterSettings,
    args: &PrepareArgs,
) -> Result<PrepareResult, Failure> {
    let ns = &args.namespace.id;
    let t = settings.tenant(ns);
    let agent = &args.agent;
    let rev = &args.revision;
    if !rev.hash_matches() {
        return Err(Failure::new(
            FailureCode::KubernetesConfigurationInvalid,
            "revision.configurationHash does not match the configuration carried",
        ));
    }
    if let Some(setup) = &args.workspace {
        setup
            .check()
            .map_err(|m| Failure::new(FailureCode::InvalidInput, format!("at `workspace`: {m}")))?;
    }
    let reference = rev.reference();
    // Render everything before the first request.
    let rendered = render::cluster_configuration(&rev.configuration).map_err(render_failure)?;
    let cm = render::config_map(&t, agent, &reference, &rendered).map_err(render_failure)?;
    let sa = render::service_account(&t, agent).map_err(render_failure)?;
    let pvc = render::state_claim(&t, agent, settings).map_err(render_failure)?;
    let ports = egress_ports(args.egress.as_ref())?;
    let egress = render::egress_policy(&t, agent, &ports).map_err(render_failure)?;
    let svc = render::service(&t, agent, settings, names::INACTIVE).map_err(render_failure)?;
    let manifest = args.workspace.as_ref().map(|w| w.manifest.as_slice());
    render::deployment(&t, agent, &reference, settings, manifest).map_err(render_failure)?;
    let workspace_secret = args
        .workspace
        .as_ref()
        .map(|w| crate::workspace::secret(&t, agent, w))
        .transpose()
        .map_err(render_failure)?;

    require_namespace(r, &t).await?;
    let o = AgentObjects::new(r, &t, &agent.id);
    let rev_markers = Markers::revision(ns, &agent.id, &rev.id);
    let cm_name = names::revision_config_map(&agent.id, &rev.id);
    // Check first: every object this touches.
    let nsm = Markers::namespace(ns);
    if o.policies
        .get_owned(r, names::DEFAULT_DENY, &nsm)
        .await?
        .is_none()
    {
        return Err(Failure::new(
            FailureCode::NamespaceMissing,
            format!(
                "the default-deny policy of {} is missing; run ensure-namespace",
                o.tenant
            ),
        ));
    }
    let dep = o
        .deployments
        .get_owned(r, &o.names.gateway, &o.markers)
        .await?;
    if newer_deployed(dep.as_ref(), &reference)? {
        return Ok(PrepareResult {
            workspace: None,
            ready: false,
            created: false,
            observation: observation(r, settings, &t, &agent.id).await?,
        });
    }
    let existing_cm = o.config_maps.get_owned(r, &cm_name, &rev_markers).await?;
    if let Some(existing) = &existing_cm {
        check_config_map(existing, &reference, Some(&rendered))?;
    }
    o.accounts
        .get_owned(r, &o.names.gateway, &o.markers)
        .await?;
    let existing_pvc = o.claims.get_owned(r, &o.names.state, &o.markers).await?;
    let existing_secret = o
        .secrets
        .get_owned(r, &o.names.password, &o.markers)
        .await?;
    o.policies.get_owned(r, &o.names.egress, &o.markers).await?;
    let existing_workspace = match &workspace_secret {
        Some(_) => {
            o.secrets
                .get_owned(r, &o.names.workspace, &o.markers)
                .await?
        }
        None => None,
    };
    let existing_svc = o
        .services
        .get_owned(r, &o.names.gateway, &o.markers)
        .await?;

    // Then write.
    o.accounts.apply(r, &o.names.gateway, &sa).await?;
    match &existing_pvc {
        None => {
            o.claims.apply(r, &o.names.state, &pvc).await?;
        }
        Some(p) if p.metadata.deletion_timestamp.is_some() => {
            return Err(Failure::new(
                FailureCode::RevisionIncomplete,
                format!(
                    "the state volume claim {} is being deleted; retry",
                    o.names.state
                ),
            ));
        }
        Some(_) => {}
    }
    match &existing_secret {
        None => {
            let secret =
                render::password_secret(&t, agent, &random_password()?).map_err(render_failure)?;
            o.secrets.create(r, &o.names.password, &secret).await?;
        }
        Some(s) if !has_password(s) => {
            // Ours but without its key: replace, fenced by what we read.
            let mut secret =
                render::password_secret(&t, agent, &random_password()?).map_err(render_failure)?;
            secret.metadata.uid = s.metadata.uid.clone();
            secret.metadata.resource_version = s.metadata.resource_version.clone();
            o.secrets.replace(r, &o.names.password, &secret).await?;
        }
        Some(_) => {}
    }
    o.policies.apply(r, &o.names.egress, &egress).await?;
    if let Some(mut secret) = workspace_secret {
        match &existing_workspace {
            None => {
                o.secrets.create(r, &o.names.workspace, &secret).await?;
            }
            // Rewritten when what it holds differs (contents dropped, or held again after a
            // failed first start), fenced by what we read.
            Some(s) if s.data != secret.data => {
                secret.metadata.uid = s.metadata.uid.clone();
                secret.metadata.resource_version = s.metadata.resource_version.clone();
                o.secrets.replace(r, &o.names.workspace, &secret).await?;
            }
            Some(_) => {}
        }
    }
    if existing_svc.is_none() {
        o.services.apply(r, &o.names.gateway, &svc).await?;
    }
    let created = existing_cm.is_none();
    if created {
        o.config_maps.apply(r, &cm_name, &cm).await?;
        tracing::info!(agent = %agent.id, revision = %rev.id, "revision prepared");
    }
    Ok(PrepareResult {
        workspace: args
            .workspace
            .as_ref()
            .map(|_| clawfleet_protocol::result::WorkspaceOutcome::Staged),
        ready: true,
        created,
        observation: observation(r, settings, &t, &agent.id).await?,
    })
}

/// The prepared revision's objects must all be there and ours; its ConfigMap.
async fn require_prepared(
    r: &Requests,
    o: &AgentObjects,
    ns: &Ident,
    agent: &AgentRef,
    rev: &RevisionRef,
) -> Result<ConfigMap, Failure> {
    let not_prepared = |what: &str| {
        Failure::new(
            FailureCode::RevisionNotPrepared,
            format!(
                "{what} of revision {} is missing; prepare the revision again",
                rev.id
            ),
        )
    };
    let cm_name = names::revision_config_map(&agent.id, &rev.id);
    let cm = o
        .config_maps
        .get_owned(r, &cm_name, &Markers::revision(ns, &agent.id, &rev.id))
        .await?
        .ok_or_else(|| not_prepared("the ConfigMap"))?;
    check_config_map(&cm, rev, None)?;
    o.accounts
        .get_owned(r, &o.names.gateway, &o.markers)
        .await?
        .ok_or_else(|| not_prepared("the ServiceAccount"))?;
    o.claims
        .get_owned(r, &o.names.state, &o.markers)
        .await?
        .ok_or_else(|| not_prepared("the state volume claim"))?;
    let secret = o
        .secrets
        .get_owned(r, &o.names.password, &o.markers)
        .await?
        .ok_or_else(|| not_prepared("the password Secret"))?;
    if !has_password(&secret) {
        return Err(not_prepared("the gateway password"));
    }
    o.services
        .get_owned(r, &o.names.gateway, &o.markers)
        .await?
        .ok_or_else(|| not_prepared("the Service"))?;
    Ok(cm)
}

pub(crate) fn rendered_of(cm: &ConfigMap) -> Option<&str> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(names::CONFIG_KEY))
        .map(String::as_str)
}

/// The revision whose Pod template activating `rev` runs: the revision the live Pods run
/// when the candidate binds secrets and its rendered `openclaw.json` is exactly theirs (a
/// secrets-only change: the Agent's Secret already changed in place, and the Pods stay);
/// otherwise `rev` itself. The kept revision's ConfigMap must be ours and intact.
async fn template_revision(
    r: &Requests,
    o: &AgentObjects,
    ns: &Ident,
    agent: &Ident,
    rev: &RevisionRef,
    candidate: &ConfigMap,
    live: Option<&Deployment>,
) -> Result<RevisionRef, Failure> {
    let Some(running) = live.map(observe::pod_revision).transpose()?.flatten() else {
        return Ok(rev.clone());
    };
    let Some(rendered) = rendered_of(candidate) else {
        return Ok(rev.clone());
    };
    if running == rev.id || !crate::secrets::binds_secrets(rendered) {
        return Ok(rev.clone());
    }
    let name = names::revision_config_map(agent, &running);
    let Some(kept) = o
        .config_maps
        .get_owned(r, &name, &Markers::revision(ns, agent, &running))
        .await?
    else {
        return Ok(rev.clone());
    };
    let a = kept.metadata.annotations.as_ref();
    let number = a
        .and_then(|a| a.get(names::REVISION_NUMBER))
        .and_then(|n| n.parse::<u64>().ok())
        .and_then(|n| clawfleet_protocol::operation::RevisionNumber::new(n).ok());
    let hash = a
        .and_then(|a| a.get(names::CONFIGURATION_HASH))
        .and_then(|h| clawfleet_protocol::ident::Sha256Hex::new(h.as_str()).ok());
    let (Some(number), Some(configuration_hash)) = (number, hash) else {
        return Ok(rev.clone());
    };
    let kept_ref = RevisionRef {
        id: running,
        number,
        configuration_hash,
    };
    if kept.immutable != Some(true) || check_config_map(&kept, &kept_ref, Some(rendered)).is_err() {
        return Ok(rev.clone());
    }
    Ok(kept_ref)
}

/// `activate-revision`. With `restore`, the candidate gets half of the time left; when it does
/// not become ready, the last served revision's template goes back (its ConfigMap is kept
/// until a cutover succeeds) and gets the rest.
pub(crate) async fn activate(
    r: &Requests,
    settings: &ClusterSettings,
    args: &ActivateArgs,
) -> Result<ActivateResult, Failure> {
    let Some(prev) = &args.restore else {
        return activate_one(r, settings, &args.revision_args(), None).await;
    };
    if prev.number >= args.revision.number {
        return Err(Failure::new(
            FailureCode::InvalidInput,
            format!(
                "restore names revision {} (number {}), which is not older than the candidate {}",
                prev.id, prev.number, args.revision.id
            ),
        ));
    }
    let half = Requests {
        cc: r.cc.clone(),
        deadline: Instant::now() + r.remaining() / 2,
    };
    let candidate = match activate_one(&half, settings, &args.revision_args(), None).await {
        Ok(a) => return Ok(a),
        Err(f)
            if matches!(
                f.code,
                FailureCode::RevisionIncomplete
                    | FailureCode::RevisionUnschedulable
                    | FailureCode::RevisionImagePullFailed
            ) =>
        {
            f
        }
        Err(f) => return Err(f),
    };
    tracing::warn!(agent = %args.agent.id, candidate = %args.revision.id, restore = %prev.id, code = %candidate.code, "the candidate did not become ready; restoring the last served revision");
    let back = RevisionArgs {
        namespace: args.namespace.clone(),
        agent: args.agent.clone(),
        revision: prev.clone(),
    };
    match activate_one(r, settings, &back, Some(&args.revision)).await {
        Ok(mut a) => {
            a.restarted = true;
            a.restored = Some(Restored {
                revision: prev.id.clone(),
                candidate_failure: candidate,
            });
            Ok(a)
        }
        Err(f) => Err(Restored::failed_too(&candidate, &prev.id, &f)),
    }
}

/// One cutover to `args.revision`. `over` (a restore) allows going back to an older revision
/// than the Deployment carries, but only over that one candidate.
async fn activate_one(
    r: &Requests,
    settings: &ClusterSettings,
    args: &RevisionArgs,
    over: Option<&RevisionRef>,
) -> Result<ActivateResult, Failure> {
    let ns = &args.namespace.id;
    let t = settings.tenant(ns);
    let agent = &args.agent;
    let rev = &args.revision;

    require_namespace(r, &t).await?;
    let o = AgentObjects::new(r, &t, &agent.id);
    let cm = require_prepared(r, &o, ns, agent, rev).await?;
    let secrets = rendered_of(&cm).is_some_and(crate::secrets::binds_secrets);
    // With a workspace setup, the Pod applies it once before the gateway runs.
    let workspace = o
        .secrets
        .get_owned(r, &o.names.workspace, &o.markers)
        .await?;
    let manifest = workspace
        .as_ref()
        .map(crate::workspace::manifest_of)
        .transpose()
        .map_err(|m| Failure::new(FailureCode::KubernetesConfigurationInvalid, m))?;
    let dep = o
        .deployments
        .get_owned(r, &o.names.gateway, &o.markers)
        .await?;
    let template_rev = template_revision(r, &o, ns, &agent.id, rev, &cm, dep.as_ref()).await?;
    // A secrets-only change keeps the Pods: their gateway reloads the new Secret (projected by
    // the kubelet) before the Deployment names the candidate, so a refusal leaves the
    // Deployment on the served revision, as hostd leaves `current` there.
    let carried_now = dep
        .as_ref()
        .map(deployment_revision)
        .transpose()?
        .flatten()
        .map(|(id, _)| id);
    let secrets_reload = if template_rev.id != rev.id && carried_now.as_ref() != Some(&rev.id) {
        Some(super::reload::reload_and_verify(r, settings, ns, &agent.id).await?)
    } else {
        None
    };
    let template = render::Template {
        revision: &template_rev,
        secrets,
    };
    let dep_obj = render::deployment_for(&t, agent, rev, template, settings, manifest.as_deref())
        .map_err(render_failure)?;
    let serving = names::serving_value(&template_rev.id);
    let svc_obj = render::service(&t, agent, settings, &serving).map_err(render_failure)?;
    let carries_candidate = over.is_some_and(|c| {
        dep.as_ref()
            .and_then(|d| deployment_revision(d).ok().flatten())
            .is_some_and(|(id, _)| id == c.id)
    });
    if !carries_candidate && newer_deployed(dep.as_ref(), rev)? {
        let (id, number) = dep
            .as_ref()
            .and_then(|d| deployment_revision(d).ok().flatten())
            .unwrap_or((rev.id.clone(), rev.number.get()));
        return Err(Failure::new(
            FailureCode::Superseded,
            format!("revision {id} (number {number}) already runs"),
        ));
    }
    let running = dep
        .as_ref()
        .and_then(|d| observe::pod_revision(d).ok().flatten());
    let restarted = running.as_ref() != Some(&template_rev.id);
    if template_rev.id != rev.id {
        tracing::info!(agent = %agent.id, revision = %rev.id, pods_run = %template_rev.id, "secrets-only change: the Pods stay; the Agent's Secret changed in place");
    }
    // A Pod template edited behind clawfleet's back (a swapped image, a replaced command, an
    // injected sidecar) is replaced, not merged: an apply keeps containers it does not list
    // and conflicts on fields another manager took. The PUT carries the uid and
    // resourceVersion read, so it never overwrites a change it did not see.
    let edited = dep
        .as_ref()
        .and_then(|d| observe::workload_drift(d).map(|why| (d, why)));
    let applied = match edited {
        Some((live, why)) => {
            tracing::warn!(agent = %agent.id, revision = %rev.id, "the gateway Deployment's Pod template was edited outside clawfleet ({why}); replacing it");
            let mut put = dep_obj.clone();
            put.metadata.uid = live.metadata.uid.clone();
            put.metadata.resource_version = live.metadata.resource_version.clone();
            o.deployments.replace(r, &o.names.gateway, &put).await?
        }
        None => o.deployments.apply(r, &o.names.gateway, &dep_obj).await?,
    };
    // The Pod template, not the generation: a Deployment's generation also moves when only
    // its annotations change (a secrets-only change), and no Pod is replaced then.
    let template_changed = dep.as_ref().map(|d| &d.spec.template) != Some(&applied.spec.template);
    o.services.apply(r, &o.names.gateway, &svc_obj).await?;
    if restarted {
        tracing::info!(agent = %agent.id, revision = %rev.id, "gateway Deployment switched to the revision");
    }
    let observed = wait_ready(r, &t, &agent.id).await?;
    tracing::info!(agent = %agent.id, revision = %rev.id, "revision serving");

    // The Pods ran a template a secrets-only change kept (its revision already retired, its
    // ConfigMap kept for them) and now run another: that ConfigMap goes.
    let carried = dep
        .as_ref()
        .and_then(|d| deployment_revision(d).ok().flatten())
        .map(|(id, _)| id);
    if let Some(kept) = running
        .as_ref()
        .filter(|k| Some(*k) != carried.as_ref() && **k != template_rev.id && **k != rev.id)
    {
        let name = names::revision_config_map(&agent.id, kept);
        if let Some(cm) = o
            .config_maps
            .get_owned(r, &name, &Markers::revision(ns, &agent.id, kept))
            .await?
            && o.config_maps.delete(r, &name, &cm.metadata, false).await?
        {
            tracing::info!(agent = %agent.id, revision = %kept, "the ConfigMap a secrets-only change kept is retired");
        }
    }
    // Ready means the init container applied the files: the contents leave the cluster.
    if let (Some(s), Some(manifest)) = (&workspace, manifest)
        && crate::workspace::holds_contents(s)
    {
        let setup = clawfleet_protocol::workspace::WorkspaceSetup {
            manifest,
            files: None,
        };
        let mut dropped = crate::workspace::secret(&t, agent, &setup).map_err(render_failure)?;
        dropped.metadata.uid = s.metadata.uid.clone();
        dropped.metadata.resource_version = s.metadata.resource_version.clone();
        o.secrets.replace(r, &o.names.workspace, &dropped).await?;
        tracing::info!(agent = %agent.id, "workspace file contents dropped from the cluster");
    }
    Ok(ActivateResult {
        restarted,
        unit_changed: template_changed,
        observation: observed.observation(settings),
        restored: None,
        secrets_reload,
        config_reload: None,
    })
}

/// Polls until the Agent is observed ready, a blocker holds, or the deadline comes.
async fn wait_ready(r: &Requests, t: &Tenant, agent: &Ident) -> Result<Observed, Failure> {
    let mut pause = Duration::from_millis(100);
    let mut blocked_since: Option<(FailureCode, Instant)> = None;
    loop {
        if r.remaining() <= super::ANSWER_MARGIN {
            // No time left to ask the API and answer: the gateway was not seen ready in time
            // (a request started now could only time out, and that is not the API's fault).
            return Err(Failure::new(
                FailureCode::RevisionIncomplete,
                "the gateway is not ready yet at the deadline; activation can be retried",
            ));
        }
        let seen = Box::pin(observe::observe(r, t, agent)).await?;
        if seen.ready {
            return Ok(seen);
        }
        match &seen.blocker {
            Some(b) => {
                let since = match blocked_since {
                    Some((code, t)) if code == b.code => t,
                    _ => Instant::now(),
                };
                blocked_since = Some((b.code, since));
                if since.elapsed() >= BLOCKER_SETTLE {
                    return Err(b.clone());
                }
            }
            None => blocked_since = None,
        }
        if !pause_within(r, pause).await {
            return Err(seen.blocker.clone().unwrap_or_else(|| {
                Failure::new(
                    FailureCode::RevisionIncomplete,
                    format!(
                        "the gateway is not ready yet at the deadline (Pod {}); activation can be retried",
                        seen.sub_state
                    ),
                )
            }));
        }
        pause = (pause * 3 / 2).min(Duration::from_secs(1));
    }
}

/// `verify-revision`.
pub(crate) async fn verify(
    r: &Requests,
    settings: &ClusterSettings,
    args: &RevisionArgs,
) -> Result<VerifyResult, Failure> {
    let ns = &args.namespace.id;
    let t = settings.tenant(ns);
    require_namespace(r, &t).await?;
    let o = AgentObjects::new(r, &t, &args.agent.id);
    let cm_name = names::revision_config_map(&args.agent.id, &args.revision.id);
    let cm = o
        .config_maps
        .get_owned(
            r,
            &cm_name,
            &Markers::revision(ns, &args.agent.id, &args.revision.id),
        )
        .await?
        .ok_or_else(|| {
            Failure::new(
                FailureCode::RevisionNotPrepared,
                format!(
                    "revision {} is not prepared on the cluster",
                    args.revision.id
                ),
            )
        })?;
    check_config_map(&cm, &args.revision, None)?;
    Ok(VerifyResult {
        observation: observation(r, settings, &t, &args.agent.id).await?,
    })
}

/// Which Deployments a stop takes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopScope {
    /// Only one carrying exactly this revision (retire: the revision's own cleanup).
    This,
    /// One carrying this revision or an older one (stop: whatever the Agent runs, even when
    /// the named revision never reached the Deployment, e.g. an activation refused before its
    /// apply); a newer one is a successor and stays.
    ThisOrOlder,
}

/// What [`stop_if_current`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stopped {
    /// It deleted the Deployment.
    deleted: bool,
    /// A successor's Pods run this revision's template (a secrets-only change kept them):
    /// they, their Service selector and this revision's ConfigMap stay.
    template_kept: bool,
}

/// Deletes the Deployment if it carries this revision (or, for a stop, an older one); sets
/// the Service inactive; waits for the Pods to go.
async fn stop_if_current(
    r: &Requests,
    settings: &ClusterSettings,
    t: &Tenant,
    agent_ref: &AgentRef,
    rev: &RevisionRef,
    scope: StopScope,
) -> Result<Stopped, Failure> {
    let agent = &agent_ref.id;
    let o = AgentObjects::new(r, t, agent);
    let dep = o
        .deployments
        .get_owned(r, &o.names.gateway, &o.markers)
        .await?;
    let svc = o
        .services
        .get_owned(r, &o.names.gateway, &o.markers)
        .await?;
    let serving = names::serving_value(&rev.id);
    let carried = match &dep {
        Some(d) => deployment_revision(d)?,
        None => None,
    };
    // Whether the Deployment is this stop's to take down.
    let takes = |carried: &Option<(Ident, u64)>| match (scope, carried) {
        (_, Some((id, _))) if *id == rev.id => true,
        (StopScope::This, _) => false,
        (StopScope::ThisOrOlder, Some((_, number))) => *number < rev.number.get(),
        // Ours (markers checked) but carrying no revision: nothing newer can be lost.
        (StopScope::ThisOrOlder, None) => true,
    };
    let successor = dep.is_some() && !takes(&carried);
    let template_kept = successor
        && match &dep {
            Some(d) => observe::pod_revision(d)?.as_ref() == Some(&rev.id),
            None => false,
        };
    let mut stopped = false;
    if let Some(d) = &dep
        && !successor
    {
        // uid + resourceVersion: a concurrent cutover changes the resourceVersion, and then
        // this 409s instead of deleting the successor.
        stopped = o
            .deployments
            .delete(r, &o.names.gateway, &d.metadata, true)
            .await?;
        if stopped {
            let runs = carried.as_ref().map(|(id, _)| id.as_str()).unwrap_or("-");
            tracing::info!(agent = %agent, revision = %rev.id, deployment_revision = %runs, "gateway Deployment deleted");
        }
    }
    let selected = svc
        .as_ref()
        .and_then(|s| {
            s.spec
                .as_ref()?
                .selector
                .as_ref()?
                .get(names::SERVING_REVISION)
        })
        .cloned();
    let deselect = match scope {
        StopScope::This => !template_kept && selected.as_ref() == Some(&serving),
        StopScope::ThisOrOlder => {
            !successor && selected.as_deref().is_some_and(|v| v != names::INACTIVE)
        }
    };
    if let Some(s) = &svc
        && deselect
    {
        // Back to inactive, fenced by the resourceVersion read (apply honours it).
        let mut inactive =
            render::service(t, agent_ref, settings, names::INACTIVE).map_err(render_failure)?;
        inactive.metadata.resource_version = s.metadata.resource_version.clone();
        o.services.apply(r, &o.names.gateway, &inactive).await?;
    }
    // Without a successor a stop waits for every Pod of the Agent, whatever revision it ran.
    let only = match scope {
        StopScope::ThisOrOlder if !successor => None,
        _ => Some((names::SERVING_REVISION, serving.as_str())),
    };
    let done = Stopped {
        deleted: stopped,
        template_kept,
    };
    if template_kept {
        return Ok(done);
    }
    let mut pause = Duration::from_millis(100);
    loop {
        let pods = agent_pods(r, t, agent, only).await?;
        if pods.is_empty() {
            return Ok(done);
        }
        if !pause_within(r, pause).await {
            return Err(Failure::new(
                FailureCode::DeadlineExceeded,
                format!(
                    "{} Pod(s) of Agent {agent} are still terminating at the deadline (stop of revision {}); retry",
                    pods.len(),
                    rev.id
                ),
            ));
        }
        pause = (pause * 3 / 2).min(Duration::from_secs(1));
    }
}

/// `stop-revision`: repeatable; keeps PVC, Secret and ConfigMaps.
pub(crate) async fn stop(
    r: &Requests,
    settings: &ClusterSettings,
    args: &RevisionArgs,
) -> Result<StopResult, Failure> {
    let ns = &args.namespace.id;
    let t = settings.tenant(ns);
    if super::namespace::owned_namespace(r, &t).await?.is_none() {
        return Ok(StopResult {
            stopped: false,
            observation: AgentObservation::default(),
        });
    }
    let stopped = stop_if_current(
        r,
        settings,
        &t,
        &args.agent,
        &args.revision,
        StopScope::ThisOrOlder,
    )
    .await?
    .deleted;
    Ok(StopResult {
        stopped,
        observation: observation(r, settings, &t, &args.agent.id).await?,
    })
}

/// `retire-revision`: stop if current, then delete the revision's ConfigMap.
pub(crate) async fn retire(
    r: &Requests,
    settings: &ClusterSettings,
    args: &RevisionArgs,
) -> Result<RetireResult, Failure> {
    let ns = &args.namespace.id;
    let t = settings.tenant(ns);
    if super::namespace::owned_namespace(r, &t).await?.is_none() {
        return Ok(RetireResult {
            stopped: false,
            removed: false,
            observation: AgentObservation::default(),
        });
    }
    let agent = &args.agent.id;
    let o = AgentObjects::new(r, &t, agent);
    let cm_name = names::revision_config_map(agent, &args.revision.id);
    let cm = o
        .config_maps
        .get_owned(
            r,
            &cm_name,
            &Markers::revision(ns, agent, &args.revision.id),
        )
        .await?;
    let stopped = stop_if_current(
        r,
        settings,
        &t,
        &args.agent,
        &args.revision,
        StopScope::This,
    )
    .await?;
    let removed = match &cm {
        // The successor's Pods still mount it (a secrets-only change kept them): it goes once
        // an activation moves the Pods to another template (`activate_one`).
        Some(_) if stopped.template_kept => false,
        Some(cm) => {
            o.config_maps
                .delete(r, &cm_name, &cm.metadata, false)
                .await?
        }
        None => false,
    };
    if removed {
        tracing::info!(agent = %agent, revision = %args.revision.id, object = %label("ConfigMap", Some(&o.tenant), &cm_name), "revision retired");
    }
    Ok(RetireResult {
        stopped: stopped.deleted,
        removed,
        observation: observation(r, settings, &t, agent).await?,
    })
}
