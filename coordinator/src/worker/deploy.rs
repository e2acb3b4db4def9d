//! A deploy, as explicit phases derived in one place ([`phases`]) from the stored state:
//! place, prepare, commit (compare-and-set the Agent's active revision), activate, retire.
//! An item whose revision is already committed (a retry after the commit point) skips the
//! commit. Each phase is small and ends the item early by returning the [`Step`] it ended
//! with; retries go through the worker's one failure policy (`policy.rs`).

use std::time::Duration;

use clawfleet_protocol::operation::{
    AgentRef, NamespaceRef, PrepareArgs, RevisionArgs, RevisionRef,
};
use clawfleet_protocol::result::{OperationResult, WorkspaceOutcome};
use clawfleet_protocol::runtime::RuntimeArgs;
use clawfleet_protocol::sealed::{PutSecretsArgs, PutSecretsResult};
use clawfleet_protocol::workspace::{WorkspaceFileMeta, WorkspaceSetup};
use clawfleet_protocol::{FailureCode, Operation};

use super::policy::{Policy, Stage};
use super::{Step, Worker, done, failed};
use crate::backend::{Backend, CallError, CallOptions, Target};
use crate::codes::{AnyCode, Code};
use crate::model::{Agent, DesiredState, Namespace, Revision, RevisionStatus, WorkspaceState};
use crate::store::Work;

/// `name@version sha256:…` of each binding, for messages and logs (never a value).
fn secret_list(secrets: &[crate::model::SecretBinding]) -> String {
    let list: Vec<String> = secrets
        .iter()
        .map(|b| format!("{}@{} {}", b.name, b.version, b.fingerprint))
        .collect();
    list.join(", ")
}

/// One phase of a deploy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Choose the target: the Namespace's cluster, or a pool host with room.
    Place,
    /// Stage the revision on the target; the running gateway is untouched.
    Prepare,
    /// Replace the Agent's secrets on the target with the revision's versions: sealed to a
    /// host's pinned key, or into the Agent's Secret on a cluster (a running gateway's files
    /// change; it reloads or restarts later).
    Secrets,
    /// Compare-and-set the Agent's active revision to this one.
    Commit,
    /// Cut over to the revision and wait until it serves.
    Activate,
    /// Retire the predecessors.
    Retire,
}

/// The phases a deploy item still runs: all of them before the commit point, all but the
/// commit after it.
pub(crate) fn phases(committed: bool) -> &'static [Phase] {
    if committed {
        &[
            Phase::Place,
            Phase::Prepare,
            Phase::Secrets,
            Phase::Activate,
            Phase::Retire,
        ]
    } else {
        &[
            Phase::Place,
            Phase::Prepare,
            Phase::Secrets,
            Phase::Commit,
            Phase::Activate,
            Phase::Retire,
        ]
    }
}

/// What a deploy item works on, loaded once from the store.
struct Deploy<'w> {
    work: &'w Work,
    ns: Namespace,
    agent: Agent,
    rev: Revision,
    revisions: Vec<Revision>,
    committed: bool,
    target: Option<Target>,
    /// Whether the prepare carried workspace files (only then can the activation have
    /// applied any).
    workspace: bool,
    namespace: NamespaceRef,
    agent_ref: AgentRef,
    reference: RevisionRef,
    /// How the activation took a secrets-only change: the gateway reloaded its secrets without
    /// a restart, verified or not (absent when it restarted or nothing changed).
    secrets_reload: Option<clawfleet_protocol::result::SecretsReload>,
    /// The paths of a configuration the running gateway applied live (no restart).
    config_reload: Option<clawfleet_protocol::result::ConfigReload>,
}

impl Deploy<'_> {
    fn target(&self) -> Result<&Target, Step> {
        self.target
            .as_ref()
            .ok_or_else(|| failed(Code::InvalidState, "a deploy phase ran before placement"))
    }

    fn revision_args(&self) -> RevisionArgs {
        RevisionArgs {
            namespace: self.namespace.clone(),
            agent: self.agent_ref.clone(),
            revision: self.reference.clone(),
        }
    }
}

impl<B: Backend> Worker<B> {
    /// Runs a deploy item through its phases.
    pub(super) async fn deploy(&self, work: &Work) -> Result<Step, Step> {
        let mut d = self.load_deploy(work).await?;
        for phase in phases(d.committed) {
            match phase {
                Phase::Place => self.place_phase(&mut d).await?,
                Phase::Prepare => self.prepare_phase(&mut d).await?,
                Phase::Secrets => self.secrets_phase(&d).await?,
                Phase::Commit => self.commit_phase(&d).await?,
                Phase::Activate => self.activate_phase(&mut d).await?,
                Phase::Retire => self.retire_phase(&d).await?,
            }
        }
        let how = match d.secrets_reload {
            Some(clawfleet_protocol::result::SecretsReload::Verified) => {
                " (secrets reloaded without a restart; the gateway holds their fingerprints)"
            }
            Some(clawfleet_protocol::result::SecretsReload::Unverified) => {
                " (secrets reloaded without a restart; not every reference could be read back from the gateway, so what it holds there is not verified)"
            }
            None => "",
        };
        let live = d.config_reload.as_ref().map_or_else(String::new, |c| {
            format!(
                " (configuration applied live without a restart: {})",
                c.changed.join(", ")
            )
        });
        Ok(done(
            Code::RevisionActivated,
            format!("serving on {}{how}{live}", d.target()?.name()),
        ))
    }

    /// Loads the item's state and ends it at once when it no longer applies: the Agent,
    /// revision or Namespace is gone, the Agent is not meant to run, a newer revision exists,
    /// or the Namespace is being deleted.
    async fn load_deploy<'w>(&self, work: &'w Work) -> Result<Deploy<'w>, Step> {
        let (Some(agent_id), Some(rev_id)) = (&work.agent_id, &work.revision_id) else {
            return Err(failed(
                Code::InvalidWork,
                "deploy work without an Agent or revision",
            ));
        };
        let ns_id = &work.namespace_id;
        // One after the other, not at once: the API's reads share the store's read
        // connections, and a worker with many items in flight would take them all (on SQLite
        // that cost the deploy route a fifth of its requests/s). The revision itself is one
        // of the Agent's revisions.
        let agent = self
            .store
            .agent(ns_id, agent_id)
            .await
            .map_err(Policy::store_failed)?;
        let revisions = self
            .store
            .revisions(ns_id, agent_id)
            .await
            .map_err(Policy::store_failed)?;
        let ns = self
            .store
            .namespace(ns_id)
            .await
            .map_err(Policy::store_failed)?;
        let Some(agent) = agent else {
            return Err(done(Code::AgentGone, "the Agent was deleted"));
        };
        let Some(rev) = revisions.iter().find(|r| r.id == *rev_id).cloned() else {
            return Err(done(Code::RevisionGone, "the revision was deleted"));
        };
        if agent.desired_state != DesiredState::Running {
            return Err(done(
                Code::RevisionStopped,
                "the Agent is no longer meant to run",
            ));
        }
        // A newer revision supersedes this one, unless this one is active again because the
        // newer one failed (a restore, then a reconcile of the restored revision).
        let is_active = agent.active_revision_id.as_deref() == Some(rev_id.as_str());
        if revisions
            .iter()
            .any(|r| r.number > rev.number && !(is_active && r.status == RevisionStatus::Failed))
        {
            // A revision that never reached a target may be retired already (by the newer
            // revision's retire phase): it stays so.
            if rev.status != RevisionStatus::Retired {
                self.store
                    .set_revision_status(
                        &work.claim,
                        ns_id,
                        agent_id,
                        rev_id,
                        RevisionStatus::Superseded,
                    )
                    .await
                    .map_err(Policy::store_failed)?;
            }
            return Err(done(Code::RevisionSuperseded, "a newer revision exists"));
        }
        let Some(ns) = ns else {
            return Err(done(Code::NamespaceGone, "the Namespace was deleted"));
        };
        if ns.deleting {
            return Err(failed(
                Code::NamespaceDeleting,
                "the Namespace is being deleted",
            ));
        }
        Ok(Deploy {
            namespace: Self::namespace_ref(&ns)?,
            agent_ref: Self::agent_ref(&agent)?,
            reference: Self::revision_ref(&rev)?,
            committed: agent.active_revision_id.as_deref() == Some(rev_id.as_str()),
            secrets_reload: None,
            config_reload: None,
            work,
            ns,
            agent,
            rev,
            revisions,
            target: None,
            workspace: false,
        })
    }

    /// Place: the cluster once its Namespace is ready, or a pool host with room (ensuring
    /// the Namespace there first).
    async fn place_phase(&self, d: &mut Deploy<'_>) -> Result<(), Step> {
        let target = match self.cluster_target(&d.ns).await? {
            Some(cluster) if d.ns.ready => cluster,
            Some(_) => {
                return Err(self.policy().waiting(
                    d.work,
                    Code::NamespaceNotReady,
                    "the Namespace is not ready on its cluster yet",
                ));
            }
            None => {
                let Some(host) = self.place(d.work, &d.ns, &d.agent).await? else {
                    return Err(self.policy().waiting(
                        d.work,
                        Code::NoHostAvailable,
                        "no ready pool host has room for this Agent yet",
                    ));
                };
                if !d.ns.ready_hosts.iter().any(|h| host.name == *h) {
                    self.ensure_on(d.work, &d.ns, &host).await?;
                }
                self.target(&host)?
            }
        };
        d.target = Some(target);
        Ok(())
    }

    /// Prepare: stage the snapshot (idempotent, so it also runs after the commit point).
    async fn prepare_phase(&self, d: &mut Deploy<'_>) -> Result<(), Step> {
        let spec = super::revision_spec(&d.reference, &d.rev.rendered)
            .map_err(|(code, message)| failed(code, message))?;
        let workspace = self.workspace_setup(d).await?;
        d.workspace = workspace.is_some();
        let d = &*d;
        if !d.rev.staged {
            // Recorded before the call: from here on the target may hold the snapshot.
            self.store
                .mark_revision_staged(&d.work.claim, &d.work.namespace_id, &d.agent.id, &d.rev.id)
                .await
                .map_err(Policy::store_failed)?;
        }
        let op = Operation::PrepareRevision(PrepareArgs {
            namespace: d.namespace.clone(),
            agent: d.agent_ref.clone(),
            revision: spec,
            workspace,
            egress: d.agent.egress.clone(),
        });
        match self.call(d.work, d.target()?, op).await? {
            Err(e) => {
                if e.code() == FailureCode::SnapshotMismatch && !d.committed {
                    // The target holds another revision under this number (or this id with
                    // other content): this database issued the number again, as after a
                    // restore from an older backup. The next revision is numbered above it.
                    self.raise_floor(d, d.rev.number).await?;
                }
                if e.code() == FailureCode::WorkspaceSetupFailed {
                    let message = e.to_string();
                    self.store
                        .set_workspace_state(
                            &d.work.claim,
                            &d.work.namespace_id,
                            &d.agent.id,
                            WorkspaceState::Failed,
                            Some((e.code().as_str(), &message)),
                            crate::clock::now_seconds(),
                        )
                        .await
                        .map_err(Policy::store_failed)?;
                }
                Err(self
                    .policy()
                    .call_failed(d.work, e, Stage::deploy(d.committed)))
            }
            Ok(OperationResult::PrepareRevision(p)) => {
                // The deploy's first observation, against the Agent as loaded: nothing to
                // write when it says nothing new (a redeploy of a running Agent).
                if !super::observation_unchanged(&d.agent, &p.observation) {
                    self.observe(d.work, &d.agent, &p.observation).await?;
                }
                // A host applied them (or had); a cluster only staged them for the Pod, and its
                // ready activation says they were applied.
                if matches!(
                    p.workspace,
                    Some(WorkspaceOutcome::Applied | WorkspaceOutcome::AlreadyApplied)
                ) {
                    self.store
                        .set_workspace_state(
                            &d.work.claim,
                            &d.work.namespace_id,
                            &d.agent.id,
                            WorkspaceState::Applied,
                            None,
                            crate::clock::now_seconds(),
                        )
                        .await
                        .map_err(Policy::store_failed)?;
                }
                if p.ready {
                    return Ok(());
                }
                let newer = p
                    .observation
                    .current
                    .as_ref()
                    .filter(|c| **c != d.rev.id)
                    .cloned();
                let unknown = match &newer {
                    Some(id) => self
                        .store
                        .revision(&d.work.namespace_id, &d.agent.id, id)
                        .await
                        .map_err(Policy::store_failed)?
                        .is_none(),
                    None => false,
                };
                // A newer revision this database never issued (a restore from an older
                // backup): number the next revision above it, so a new deploy converges.
                let floor = newer
                    .as_deref()
                    .filter(|_| unknown)
                    .and_then(Revision::number_of);
                if let Some(n) = floor {
                    self.raise_floor(d, n).await?;
                }
                self.set_status(d, &d.rev.id, RevisionStatus::Superseded)
                    .await?;
                Err(done(
                    Code::RevisionSuperseded,
                    match (&newer, floor) {
                        (Some(id), Some(_)) => format!(
                            "the host already runs {id}, a newer revision this coordinator's database did not issue (restored from an older backup?); deploy again to number a revision above it"
                        ),
                        (Some(id), None) => format!("the host already runs a newer revision, {id}"),
                        (None, _) => "the host already runs a newer revision".to_owned(),
                    },
                ))
            }
            Ok(other) => Err(failed(
                Code::InvalidHostResult,
                format!("prepare answered {:?}", other.kind()),
            )),
        }
    }

    /// Secrets: when the revision binds secrets (or an earlier revision did, so the target may
    /// hold some), each bound version's value is read from the store and the Agent's whole set
    /// replaced on the target in one fenced call: to a host sealed to its pinned ssh-ed25519
    /// key (`put-secrets`); to a cluster in clear over its API's TLS connection, into the
    /// Agent's Secret (`Backend::put_cluster_secrets`). It runs after the prepare (the Agent's
    /// account and directory exist) and before the activation (the gateway starts with these
    /// values; on a cluster a rotation's activation keeps the Pod, whose volume the kubelet
    /// updates in place). Values live only in memory that is wiped when dropped; nothing here
    /// logs one.
    async fn secrets_phase(&self, d: &Deploy<'_>) -> Result<(), Step> {
        if d.rev.secrets.is_empty() && d.revisions.iter().all(|r| r.secrets.is_empty()) {
            return Ok(());
        }
        let target = d.target()?;
        match self.deliver_secrets(d, &d.rev).await? {
            Ok(r) => {
                tracing::info!(
                    work_id = d.work.id,
                    target = target.name(),
                    agent = %d.agent.id,
                    secrets = %secret_list(&d.rev.secrets),
                    changed = r.changed,
                    "secrets delivered"
                );
                Ok(())
            }
            Err(e) => Err(self
                .policy()
                .call_failed(d.work, e, Stage::deploy(d.committed))),
        }
    }

    /// After a cluster's gateway refused the new secrets of a secrets-only change (or never
    /// came to hold them), the Agent's Secret gets the versions of the revision its Pods serve
    /// back, so a Pod started later reads what the running gateway holds; hostd does the same
    /// on a host before it answers. What cannot be put back is logged and left to the next
    /// deploy of the Agent (drift reports the difference meanwhile).
    async fn restore_cluster_secrets(&self, d: &Deploy<'_>) -> Result<(), Step> {
        let Some(served) = d
            .agent
            .served_revision_id
            .as_ref()
            .filter(|s| **s != d.rev.id)
            .and_then(|s| d.revisions.iter().find(|r| &r.id == s))
        else {
            tracing::warn!(work_id = d.work.id, agent = %d.agent.id, "no served revision on record: the refused secrets stay in the Agent's Secret until its next deploy");
            return Ok(());
        };
        match self.deliver_secrets(d, served).await {
            Ok(Ok(_)) => {
                tracing::info!(work_id = d.work.id, agent = %d.agent.id, revision = %served.id, secrets = %secret_list(&served.secrets), "the secrets the gateway serves are back in the Agent's Secret");
            }
            Ok(Err(e)) => {
                tracing::warn!(work_id = d.work.id, agent = %d.agent.id, revision = %served.id, "cannot put the served secrets back in the Agent's Secret: {e}");
            }
            // The claim is gone: the new claimer decides; nothing more is written here.
            Err(step @ Step::Failed { code, .. }) if code == AnyCode::from(Code::ClaimLost) => {
                return Err(step);
            }
            Err(step) => {
                tracing::warn!(work_id = d.work.id, agent = %d.agent.id, revision = %served.id, "cannot put the served secrets back in the Agent's Secret: {step:?}");
            }
        }
        Ok(())
    }

    /// Reads the values of the secret versions `rev` binds from the store and replaces the
    /// Agent's whole set on the target with them in one fenced call.
    async fn deliver_secrets(
        &self,
        d: &Deploy<'_>,
        rev: &Revision,
    ) -> Result<Result<PutSecretsResult, CallError>, Step> {
        let target = d.target()?;
        let mut values = Vec::with_capacity(rev.secrets.len());
        for b in &rev.secrets {
            let Some(value) = self
                .store
                .secret_value(&d.work.namespace_id, b.name.as_str(), b.version)
                .await
                .map_err(Policy::store_failed)?
            else {
                return Err(failed(
                    Code::SecretVersionGone,
                    format!(
                        "revision {} binds secret {} version {}, which the store no longer holds",
                        rev.id, b.name, b.version
                    ),
                ));
            };
            if value.fingerprint != b.fingerprint {
                return Err(failed(
                    Code::SecretVersionGone,
                    format!(
                        "revision {} binds secret {} version {} with fingerprint {}, but the store holds {} under that version",
                        rev.id, b.name, b.version, b.fingerprint, value.fingerprint
                    ),
                ));
            }
            values.push((b, value));
        }
        let result = match target {
            Target::Host(h) => {
                self.put_host_secrets(d, target, &h.host_key, values)
                    .await?
            }
            Target::Cluster(c) => {
                let set = clawfleet_kube::AgentSecrets {
                    namespace: d.namespace.clone(),
                    agent: d.agent_ref.clone(),
                    secrets: values
                        .into_iter()
                        .map(|(b, v)| clawfleet_kube::SecretValue {
                            name: b.name.clone(),
                            version: u64::from(b.version),
                            fingerprint: b.fingerprint.clone(),
                            value: v.value,
                        })
                        .collect(),
                };
                if let Some(lease) = self.lease_of(d.work) {
                    lease.before_call().await.map_err(|e| super::lost(&e))?;
                }
                let options = CallOptions {
                    fence: d.work.fence,
                    ..self.options()
                };
                match self.backend.put_cluster_secrets(c, &set, options).await {
                    Ok(r) => Ok(r),
                    Err(CallError::Failed(f)) if f.code == FailureCode::FenceStale => {
                        return Err(failed(Code::ClaimLost, f.to_string()));
                    }
                    Err(e) => Err(e),
                }
            }
        };
        Ok(result)
    }

    /// Seals each value to the host's pinned key and sends one fenced `put-secrets`.
    async fn put_host_secrets(
        &self,
        d: &Deploy<'_>,
        target: &Target,
        host_key: &str,
        values: Vec<(&crate::model::SecretBinding, crate::model::SecretValue)>,
    ) -> Result<Result<PutSecretsResult, CallError>, Step> {
        let key = clawfleet_protocol::ssh_key::PublicKey::from_openssh(host_key).map_err(|e| {
            failed(
                Code::SecretSealFailed,
                format!(
                    "host {}: its pinned host_key does not parse: {e}",
                    target.name()
                ),
            )
        })?;
        let mut sealed = Vec::with_capacity(values.len());
        for (b, value) in values {
            let s = clawfleet_protocol::sealed::seal(
                &key,
                &d.namespace.id,
                &d.agent_ref.id,
                &b.name,
                u64::from(b.version),
                &value.value,
            )
            .map_err(|e| {
                failed(
                    Code::SecretSealFailed,
                    format!("secret {} for host {}: {e}", b.name, target.name()),
                )
            })?;
            sealed.push(s);
        }
        let op = Operation::PutSecrets(PutSecretsArgs {
            namespace: d.namespace.clone(),
            agent: d.agent_ref.clone(),
            secrets: sealed,
        });
        Ok(match self.call(d.work, target, op).await? {
            Ok(OperationResult::PutSecrets(r)) => Ok(r),
            Ok(other) => {
                return Err(failed(
                    Code::InvalidHostResult,
                    format!("put-secrets answered {:?}", other.kind()),
                ));
            }
            Err(e) => Err(e),
        })
    }

    /// The Agent's initial workspace files for a prepare: the manifest always (the target
    /// keeps its start guard armed from it), the contents while the coordinator holds them.
    async fn workspace_setup(&self, d: &Deploy<'_>) -> Result<Option<WorkspaceSetup>, Step> {
        let ns = &d.work.namespace_id;
        let Some(info) = self
            .store
            .workspace_setup(ns, &d.agent.id)
            .await
            .map_err(Policy::store_failed)?
        else {
            return Ok(None);
        };
        let manifest: Vec<WorkspaceFileMeta> = info
            .files
            .iter()
            .map(|f| WorkspaceFileMeta {
                name: f.name.clone(),
                size: f.size,
                sha256: f.sha256.clone(),
            })
            .collect();
        let files = if info.files.iter().any(|f| f.content_held) {
            Some(
                self.store
                    .workspace_contents(ns, &d.agent.id)
                    .await
                    .map_err(Policy::store_failed)?,
            )
        } else {
            None
        };
        Ok(Some(WorkspaceSetup { manifest, files }))
    }

    /// After a successful activation the workspace files were applied (a host did it in
    /// prepare; a cluster's Pod in its init container before it became ready): the
    /// coordinator records that and forgets their contents (names, sizes and digests stay).
    async fn drop_applied_workspace(&self, d: &Deploy<'_>) -> Result<(), Step> {
        if !d.workspace {
            return Ok(());
        }
        let ns = &d.work.namespace_id;
        let Some(info) = self
            .store
            .workspace_setup(ns, &d.agent.id)
            .await
            .map_err(Policy::store_failed)?
        else {
            return Ok(());
        };
        if info.state != WorkspaceState::Applied {
            self.store
                .set_workspace_state(
                    &d.work.claim,
                    ns,
                    &d.agent.id,
                    WorkspaceState::Applied,
                    None,
                    crate::clock::now_seconds(),
                )
                .await
                .map_err(Policy::store_failed)?;
        }
        if info.files.iter().any(|f| f.content_held) {
            let n = self
                .store
                .drop_workspace_contents(&d.work.claim, ns, &d.agent.id)
                .await
                .map_err(Policy::store_failed)?;
            tracing::info!(work_id = d.work.id, agent = %d.agent.id, files = n, "workspace file contents dropped after activation");
        }
        Ok(())
    }

    /// Commit: compare-and-set the Agent's active revision; another writer wins only with a
    /// newer one.
    ///
    /// A revision committed right after its prepare goes from pending to activating in the
    /// commit's transaction; `prepared` is written only when the commit does not happen.
    async fn commit_phase(&self, d: &Deploy<'_>) -> Result<(), Step> {
        if let Some(active) = &d.agent.active_revision_id
            && let Some(current) = d.revisions.iter().find(|r| &r.id == active)
            && current.number >= d.rev.number
        {
            self.set_status(d, &d.rev.id, RevisionStatus::Prepared)
                .await?;
            return Err(done(Code::RevisionSuperseded, "a newer revision is active"));
        }
        let swapped = self
            .store
            .commit_revision(
                &d.work.claim,
                &d.work.namespace_id,
                &d.agent.id,
                d.agent.active_revision_id.as_deref(),
                &d.rev.id,
            )
            .await
            .map_err(Policy::store_failed)?;
        if swapped {
            return Ok(());
        }
        self.set_status(d, &d.rev.id, RevisionStatus::Prepared)
            .await?;
        Err(Policy::moved(
            FailureCode::RevisionIncomplete.into(),
            "the active revision changed meanwhile; re-checking",
        ))
    }

    /// The revision a failed candidate falls back to: with `restore: last-served`, the one
    /// the target last served, if it is another, still on record and not retired.
    fn restore_to(&self, d: &Deploy<'_>) -> Result<Option<RevisionRef>, Step> {
        let Some(served) = d.agent.last_served_fallback(&d.rev.id) else {
            return Ok(None);
        };
        match d.revisions.iter().find(|r| r.id.as_str() == served) {
            Some(r) if r.status != RevisionStatus::Retired => Ok(Some(Self::revision_ref(r)?)),
            _ => Ok(None),
        }
    }

    /// Activate: cut over and wait for readiness; on failure, learn what the target serves.
    async fn activate_phase(&self, d: &mut Deploy<'_>) -> Result<(), Step> {
        let target = d.target()?;
        let mut args = clawfleet_protocol::operation::ActivateArgs::from(d.revision_args());
        args.restore = self.restore_to(d)?;
        let mut options = self.options();
        if args.restore.is_some() {
            // Two readiness waits (the candidate's, then the restore's) and their restarts.
            options.deadline =
                (options.deadline * 2 + Duration::from_secs(30)).min(Duration::from_secs(
                    u64::from(clawfleet_protocol::envelope::MAX_DEADLINE_SECONDS),
                ));
        }
        let sent_restore = args.restore.is_some();
        let mut outcome = self
            .call_with(
                d.work,
                target,
                Operation::ActivateRevision(args.clone()),
                options,
            )
            .await?;
        if sent_restore
            && let Err(CallError::Failed(f)) = &outcome
            && f.is_unsupported()
        {
            // A hostd from before restore does not know the field: activate as it knows how.
            tracing::warn!(
                work_id = d.work.id,
                target = target.name(),
                "the target's hostd predates restore; activating without it"
            );
            args.restore = None;
            outcome = self
                .call(d.work, target, Operation::ActivateRevision(args))
                .await?;
        }
        match outcome {
            Err(CallError::Failed(f)) if f.code == FailureCode::Superseded => {
                self.set_status(d, &d.rev.id, RevisionStatus::Superseded)
                    .await?;
                Err(done(Code::RevisionSuperseded, f.message))
            }
            Err(e) => {
                if matches!(target, Target::Cluster(_))
                    && let CallError::Failed(f) = &e
                    && matches!(
                        f.code,
                        FailureCode::SecretReloadFailed | FailureCode::SecretFingerprintMismatch
                    )
                {
                    self.restore_cluster_secrets(d).await?;
                }
                let runtime_failure = crate::evidence::is_runtime_failure(e.code());
                if runtime_failure {
                    self.keep_evidence(d, &e).await;
                }
                // After a failed activation the target may serve nothing (the unit runs the
                // candidate, which is not ready).
                let verify = Operation::VerifyRevision(d.revision_args());
                if let Ok(OperationResult::VerifyRevision(v)) =
                    self.call(d.work, target, verify).await?
                {
                    self.observe(d.work, &d.agent, &v.observation).await?;
                }
                // A candidate that did not become ready spends an attempt (see `Phase`).
                Err(self.policy().call_failed(d.work, e, Stage::Activation))
            }
            Ok(OperationResult::ActivateRevision(a)) => {
                d.secrets_reload = a.secrets_reload;
                d.config_reload = a.config_reload;
                if let Some(restored) = a.restored {
                    // The host already put the last served revision back: a store failure
                    // here must not retry the item (that would run the candidate again).
                    if let Err(e) = self.observe(d.work, &d.agent, &a.observation).await {
                        tracing::error!(
                            work_id = d.work.id,
                            "the restore's observation was not stored: {e:?}"
                        );
                    }
                    return Err(self.restored(d, restored).await);
                }
                if d.rev.runtime_failure.is_some() {
                    self.store
                        .set_runtime_failure(
                            &d.work.claim,
                            &d.work.namespace_id,
                            &d.agent.id,
                            &d.rev.id,
                            None,
                        )
                        .await
                        .map_err(Policy::store_failed)?;
                }
                // The revision active and what the target answered, in one write.
                self.store
                    .set_activated(
                        &d.work.claim,
                        &d.work.namespace_id,
                        &d.agent.id,
                        &d.rev.id,
                        a.observation.port,
                        super::served(&a.observation).as_deref(),
                    )
                    .await
                    .map_err(Policy::store_failed)?;
                self.drop_applied_workspace(d).await
            }
            Ok(other) => Err(failed(
                Code::InvalidHostResult,
                format!("activate answered {:?}", other.kind()),
            )),
        }
    }

    /// The target put the last served revision back: the candidate failed (its evidence is
    /// kept), `activeRevisionId` goes back to the restored revision by compare-and-set, and
    /// the work ends with REVISION_RESTORED.
    async fn restored(&self, d: &Deploy<'_>, r: clawfleet_protocol::result::Restored) -> Step {
        let candidate = CallError::Failed(r.candidate_failure.clone());
        self.keep_evidence(d, &candidate).await;
        let back = r.revision.as_str();
        let swapped = match self
            .store
            .cas_active_revision(
                &d.work.claim,
                &d.work.namespace_id,
                &d.agent.id,
                Some(&d.rev.id),
                Some(back),
            )
            .await
        {
            Ok(s) => s,
            Err(e) => return Policy::store_failed(e),
        };
        if swapped && let Err(e) = self.set_status(d, back, RevisionStatus::Active).await {
            return e;
        }
        // The host already put the last served revision back, so a failed audit write cannot
        // retry the item (that would run the candidate again): it is logged as an error.
        if let Err(e) = self
            .store
            .audit_work(
                &d.work.claim,
                "worker",
                "agent.restore",
                &format!("{}/{}", d.work.namespace_id, d.agent.id),
                &serde_json::json!({
                    "candidate": d.rev.id,
                    "restored": back,
                    "code": r.candidate_failure.code,
                    "message": r.candidate_failure.message,
                    "workId": d.work.id,
                    "activeRevisionId": if swapped { back } else { d.rev.id.as_str() },
                }),
                crate::clock::now_seconds(),
            )
            .await
        {
            tracing::error!(work_id = d.work.id, candidate = %d.rev.id, "the restore's audit event was not written: {e}");
        }
        tracing::warn!(work_id = d.work.id, candidate = %d.rev.id, restored = back, "candidate failed; the last served revision serves again");
        failed(
            Code::RevisionRestored,
            format!(
                "{} did not become ready ({}: {}); restored {back}, which serves again",
                d.rev.id, r.candidate_failure.code, r.candidate_failure.message
            ),
        )
    }

    /// Keeps what the target shows right after a failed activation (state, last exit, the
    /// newest log lines, events) with the revision, so deployment status explains the failure
    /// without a second request. Best effort: without an answer the evidence names the
    /// failure only.
    async fn keep_evidence(&self, d: &Deploy<'_>, e: &CallError) {
        let Ok(target) = d.target() else { return };
        let op = Operation::AgentRuntime(RuntimeArgs {
            namespace: d.namespace.clone(),
            agent: d.agent_ref.clone(),
            evidence_lines: crate::evidence::EVIDENCE_LINES,
        });
        let report = match self.call(d.work, target, op).await {
            Ok(Ok(OperationResult::AgentRuntime(r))) => Some(*r),
            _ => None,
        };
        let message = match e {
            CallError::Failed(f) => f.message.clone(),
            other => other.to_string(),
        };
        // The Agent's bound secrets are redacted from the evidence by their values; without
        // them, the evidence keeps no log lines.
        let (report, secrets) = match crate::evidence::secret_redaction_terms(
            &*self.store,
            &d.work.namespace_id,
            &d.agent.id,
        )
        .await
        {
            Ok(secrets) => (report, secrets),
            Err(_) => (None, Vec::new()),
        };
        let evidence =
            crate::evidence::runtime_failure(e.code(), &message, report.as_ref(), secrets);
        if let Err(err) = self
            .store
            .set_runtime_failure(
                &d.work.claim,
                &d.work.namespace_id,
                &d.agent.id,
                &d.rev.id,
                Some(&evidence),
            )
            .await
        {
            tracing::warn!(
                work_id = d.work.id,
                "cannot keep the failure evidence: {err}"
            );
        }
    }

    /// Retire: every older revision not yet retired. One that never reached a target (a
    /// deploy superseded in the queue) has nothing there to remove: all of those are retired
    /// in the store alone, in one write. Only the rest cost a `retire-revision` each.
    async fn retire_phase(&self, d: &Deploy<'_>) -> Result<(), Step> {
        let older = || {
            d.revisions
                .iter()
                .filter(|r| r.number < d.rev.number && r.status != RevisionStatus::Retired)
        };
        if older().any(|r| !r.staged) {
            let n = self
                .store
                .retire_unstaged(
                    &d.work.claim,
                    &d.work.namespace_id,
                    &d.agent.id,
                    d.rev.number,
                )
                .await
                .map_err(Policy::store_failed)?;
            tracing::debug!(work_id = d.work.id, agent = %d.agent.id, retired = n, "revisions that never reached a target retired without a host call");
        }
        for old in older().filter(|r| r.staged) {
            let op = Operation::RetireRevision(RevisionArgs {
                namespace: d.namespace.clone(),
                agent: d.agent_ref.clone(),
                revision: Self::revision_ref(old)?,
            });
            match self.call(d.work, d.target()?, op).await? {
                Ok(_) => self.set_status(d, &old.id, RevisionStatus::Retired).await?,
                Err(e) => return Err(self.policy().call_failed(d.work, e, Stage::AfterCommit)),
            }
        }
        Ok(())
    }

    async fn raise_floor(&self, d: &Deploy<'_>, number: u64) -> Result<(), Step> {
        self.store
            .raise_revision_floor(&d.work.claim, &d.work.namespace_id, &d.agent.id, number)
            .await
            .map_err(Policy::store_failed)
    }

    async fn set_status(
        &self,
        d: &Deploy<'_>,
        rev: &str,
        status: RevisionStatus,
    ) -> Result<(), Step> {
        self.store
            .set_revision_status(
                &d.work.claim,
                &d.work.namespace_id,
                &d.agent.id,
                rev,
                status,
            )
            .await
            .map_err(Policy::store_failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commit_runs_only_before_the_commit_point() {
        assert!(phases(false).contains(&Phase::Commit));
        assert!(!phases(true).contains(&Phase::Commit));
        for committed in [false, true] {
            let p = phases(committed);
            assert_eq!(p.first(), Some(&Phase::Place));
            assert_eq!(p.last(), Some(&Phase::Retire));
            // Secrets reach the host after the prepare and before the commit and activation.
            let at = |phase| p.iter().position(|x| *x == phase);
            assert!(at(Phase::Prepare) < at(Phase::Secrets));
            assert!(at(Phase::Secrets) < at(Phase::Activate));
            if !committed {
                assert!(at(Phase::Secrets) < at(Phase::Commit));
            }
        }
    }
}
