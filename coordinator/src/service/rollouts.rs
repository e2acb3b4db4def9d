//! Rollouts: one Configuration generation to many Agents of a Namespace, a canary wave first,
//! then waves of at most `maxParallel`, under one failure budget for the whole rollout.
//!
//! Everything a rollout is lives in the store (`store/src/sqlite/rollouts.rs`, `store/src/postgres/rollouts.rs`), and [`Service::advance_rollouts`]
//! moves every open rollout one step from what is stored: it records the outcome of finished
//! deploys, halts a rollout whose budget is spent, and starts the next Agents. A coordinator
//! that restarts picks up where the store says, and never deploys an Agent twice (an Agent
//! leaves `pending` in the same transaction that queues its deploy).

use clawfleet_protocol::{FailureCode, Ident};
use serde_json::json;

use super::{Result, Service, ServiceError, check_id, now};
use crate::codes::{AnyCode, Code};
use crate::model::{
    DesiredState, RevisionStatus, Rollout, RolloutAgentState, RolloutState, RolloutSubject,
};
use crate::store::{RolloutInsert, RolloutRow, WorkState};

/// Most Agents one rollout takes.
pub const MAX_ROLLOUT_AGENTS: usize = 10_000;
/// Most deploys one rollout runs at once.
const MAX_PARALLEL: u32 = 1_000;
/// The longest pause between waves: a day.
const MAX_PAUSE_SECONDS: u32 = 86_400;
/// Activation failures that fail an Agent's part in a rollout while its work still retries:
/// the target ran the candidate and it did not become ready.
const ACTIVATION_FAILED: &[FailureCode] = &[
    FailureCode::ReadinessTimeout,
    FailureCode::UnitFailed,
    FailureCode::ListenerNotOwned,
];
/// How many rollouts `GET …/rollouts` lists, newest first.
const LIST_LIMIT: u32 = 50;

pub use clawfleet_api::requests::{NewRollout, NewSecretRollout};

/// An operator's action on a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutAction {
    Pause,
    Resume,
    Promote,
    Abort,
}

impl RolloutAction {
    fn as_str(self) -> &'static str {
        match self {
            RolloutAction::Pause => "pause",
            RolloutAction::Resume => "resume",
            RolloutAction::Promote => "promote",
            RolloutAction::Abort => "abort",
        }
    }
}

fn invalid(message: impl Into<String>) -> ServiceError {
    ServiceError::Invalid {
        code: Code::InvalidRollout,
        message: message.into(),
    }
}

/// Wave of each Agent in deploy order: the first `canary` are wave 0, the rest in waves of
/// `max_parallel` after it.
fn waves(count: usize, canary: u32, max_parallel: u32) -> Vec<u32> {
    let canary = canary as usize;
    let first = u32::from(canary > 0);
    (0..count)
        .map(|i| {
            if i < canary {
                0
            } else {
                first + ((i - canary) / max_parallel.max(1) as usize) as u32
            }
        })
        .collect()
}

/// A rollout's checked settings.
struct Settings {
    canary: u32,
    max_parallel: u32,
    max_failures: u32,
    pause: u32,
    manual_promote: bool,
}

impl Settings {
    /// The row a rollout of `subject` to `agents` (in deploy order) stores, each Agent with
    /// its wave.
    fn row(&self, ns: &str, subject: RolloutSubject, actor: &str, agents: &[String]) -> RolloutRow {
        RolloutRow {
            namespace_id: ns.to_owned(),
            subject,
            canary: self.canary,
            max_parallel: self.max_parallel,
            max_failures: self.max_failures,
            pause_between_seconds: self.pause,
            manual_promote: self.manual_promote,
            created_by: actor.to_owned(),
            agents: agents
                .iter()
                .cloned()
                .zip(waves(agents.len(), self.canary, self.max_parallel))
                .collect(),
            now: now(),
        }
    }
}

/// Checks a rollout's settings for `count` Agents: `(canary, maxParallel, maxFailures)`, the
/// pause between waves and manual promotion; defaults filled in.
fn check_settings(
    (canary, max_parallel, max_failures): (Option<u32>, Option<u32>, Option<u32>),
    pause: Option<u32>,
    manual_promote: bool,
    count: usize,
) -> Result<Settings> {
    let max_parallel = max_parallel.unwrap_or(1);
    if !(1..=MAX_PARALLEL).contains(&max_parallel) {
        return Err(invalid(format!(
            "maxParallel {max_parallel} must be 1 to {MAX_PARALLEL}"
        )));
    }
    let canary = canary.unwrap_or(1);
    if canary as usize > count {
        return Err(invalid(format!(
            "canary {canary} is more than the {count} Agents selected"
        )));
    }
    let pause = pause.unwrap_or(0);
    if pause > MAX_PAUSE_SECONDS {
        return Err(invalid(format!(
            "pauseBetweenSeconds {pause} must be at most {MAX_PAUSE_SECONDS}"
        )));
    }
    if pause > 0 && manual_promote {
        return Err(invalid(
            "pauseBetweenSeconds and manualPromote exclude each other: either the next wave \
             starts after the pause, or when promoted",
        ));
    }
    Ok(Settings {
        canary,
        max_parallel,
        max_failures: max_failures.unwrap_or(0),
        pause,
        manual_promote,
    })
}

impl Service {
    /// Checks a rollout request and resolves it: its Namespace, the Configuration generation it
    /// deploys, and the row it would store (Agents in order, with their waves).
    pub(super) async fn validate_rollout(
        &self,
        actor: &str,
        ns: &str,
        r: &NewRollout,
    ) -> Result<(
        crate::model::Namespace,
        crate::model::Configuration,
        RolloutRow,
    )> {
        let namespace = self.namespace(ns).await?;
        if namespace.deleting {
            return Err(ServiceError::conflict(
                Code::NamespaceDeleting,
                format!("Namespace {ns} is being deleted"),
            ));
        }
        let configuration_id = check_id("configurationId", &r.configuration_id)?;
        let cfg = self
            .store
            .configuration(&namespace.id, &configuration_id)
            .await?
            .ok_or_else(|| {
                ServiceError::invalid(
                    Code::UnknownConfiguration,
                    format!("configuration {} does not exist", r.configuration_id),
                )
            })?;
        // Refuse what can never be deployed now, not Agent by Agent.
        super::rendered_for(&namespace, &cfg.document)?;
        self.check_secret_references(&namespace.id, &cfg.document)
            .await?;
        let agents = match &r.agents {
            Some(list) => {
                if list.len() > MAX_ROLLOUT_AGENTS {
                    return Err(invalid(format!(
                        "agents names {} Agents; a rollout takes at most {MAX_ROLLOUT_AGENTS}",
                        list.len()
                    )));
                }
                let mut seen = std::collections::BTreeSet::new();
                for a in list {
                    check_id("agents[]", a)?;
                    if !seen.insert(a.as_str()) {
                        return Err(invalid(format!("agents names {a} twice")));
                    }
                }
                list.clone()
            }
            None => self
                .store
                .agents(ns)
                .await?
                .into_iter()
                .filter(|a| {
                    a.configuration_id == cfg.id && a.desired_state != DesiredState::Deleted
                })
                .map(|a| String::from(a.id))
                .take(MAX_ROLLOUT_AGENTS)
                .collect(),
        };
        if agents.is_empty() {
            return Err(ServiceError::invalid(
                Code::RolloutEmpty,
                format!(
                    "no Agent of Namespace {ns} uses configuration {}; name them with agents",
                    cfg.id
                ),
            ));
        }
        let settings = check_settings(
            (r.canary, r.max_parallel, r.max_failures),
            r.pause_between_seconds,
            r.manual_promote,
            agents.len(),
        )?;
        let subject = RolloutSubject::Configuration {
            id: cfg.id.clone(),
            generation: cfg.generation,
        };
        let row = settings.row(ns, subject, actor, &agents);
        Ok((namespace, cfg, row))
    }

    /// Creates a rollout (state `running`) and starts its first Agents at once. With a plan
    /// token, refused (PLAN_STALE, nothing stored) unless the plan is still current.
    pub async fn create_rollout(&self, actor: &str, ns: &str, r: NewRollout) -> Result<Rollout> {
        let (_, cfg, row) = self.validate_rollout(actor, ns, &r).await?;
        if let Some(t) = &r.plan_token {
            self.rollout_token(ns, &cfg, &row.agents, t).await?;
        }
        let agents: Vec<&String> = row.agents.iter().map(|(a, _)| a).collect();
        let (canary, max_parallel, max_failures, pause) = (
            row.canary,
            row.max_parallel,
            row.max_failures,
            row.pause_between_seconds,
        );
        let id = self.insert_rollout(ns, &row).await?;
        self.audit(
            actor,
            "rollout.create",
            &format!("{ns}/{id}"),
            json!({"configurationId": cfg.id, "generation": cfg.generation, "agents": agents.len(),
                   "canary": canary, "maxParallel": max_parallel, "maxFailures": max_failures,
                   "pauseBetweenSeconds": pause, "manualPromote": r.manual_promote}),
        )
        .await?;
        self.advance_rollout_logged(id).await;
        self.rollout(ns, id).await
    }

    /// Rolls a secret's newest version out (`occ secret rotate`): to every running Agent
    /// whose current revision binds an older version, by id, canary first, then waves,
    /// under one failure budget. Each Agent gets a revision of the Configuration generation of
    /// its newest revision bound to the newest versions: on a host a secrets-only change,
    /// which the gateway reloads without a restart and whose fingerprints hostd verifies; a
    /// value the gateway refuses fails that Agent (it keeps serving its last good one) and,
    /// past the budget, halts the rollout naming it. Agents not meant to run bind the newest
    /// version at their next deploy.
    pub async fn create_secret_rollout(
        &self,
        actor: &str,
        ns: &str,
        name: &str,
        r: NewSecretRollout,
    ) -> Result<Rollout> {
        let namespace = self.namespace(ns).await?;
        if namespace.deleting {
            return Err(ServiceError::conflict(
                Code::NamespaceDeleting,
                format!("Namespace {ns} is being deleted"),
            ));
        }
        let info = self.secret(ns, name).await?;
        let secret_name: clawfleet_protocol::SecretName = info
            .name
            .parse()
            .map_err(|e| invalid(format!("secret name {:?}: {e}", info.name)))?;
        // One read of the Namespace's Agents, not one per Agent behind.
        let running: std::collections::BTreeSet<String> = self
            .store
            .agents(ns)
            .await?
            .into_iter()
            .filter(|a| a.desired_state == DesiredState::Running)
            .map(|a| a.id.to_string())
            .collect();
        let agents: Vec<String> = super::secrets::behind(&info)
            .into_iter()
            .filter(|a| running.contains(*a))
            .map(str::to_owned)
            .collect();
        if agents.is_empty() {
            return Err(ServiceError::invalid(
                Code::RolloutEmpty,
                format!(
                    "no running Agent of Namespace {ns} binds an older version of secret {} \
                     than version {}",
                    info.name, info.version
                ),
            ));
        }
        let settings = check_settings(
            (r.canary, r.max_parallel, r.max_failures),
            r.pause_between_seconds,
            r.manual_promote,
            agents.len(),
        )?;
        let subject = RolloutSubject::Secret {
            name: secret_name,
            version: info.version,
        };
        let row = settings.row(ns, subject, actor, &agents);
        let id = self.insert_rollout(ns, &row).await?;
        self.audit(
            actor,
            "rollout.create",
            &format!("{ns}/{id}"),
            json!({"secret": info.name, "version": info.version, "agents": agents.len(),
                   "canary": settings.canary, "maxParallel": settings.max_parallel,
                   "maxFailures": settings.max_failures,
                   "pauseBetweenSeconds": settings.pause, "manualPromote": r.manual_promote}),
        )
        .await?;
        self.advance_rollout_logged(id).await;
        self.rollout(ns, id).await
    }

    /// Stores a rollout; refused when one of its Agents is in an open rollout or gone.
    async fn insert_rollout(&self, ns: &str, row: &RolloutRow) -> Result<i64> {
        match self.store.insert_rollout(row).await? {
            RolloutInsert::Created(id) => Ok(id),
            RolloutInsert::Busy { agent, rollout } => Err(super::in_rollout(ns, &agent, rollout)),
            RolloutInsert::AgentUnavailable(agent) => Err(ServiceError::not_found("Agent", &agent)),
        }
    }

    pub async fn rollout(&self, ns: &str, id: i64) -> Result<Rollout> {
        self.namespace(ns).await?;
        self.store
            .rollout(ns, id)
            .await?
            .ok_or_else(|| ServiceError::not_found("rollout", &id.to_string()))
    }

    /// A Namespace's newest rollouts, newest first.
    pub async fn rollouts(&self, ns: &str) -> Result<Vec<Rollout>> {
        self.namespace(ns).await?;
        Ok(self.store.rollouts(ns, LIST_LIMIT).await?)
    }

    /// Pause (running → paused: nothing new starts, deploys in flight finish), resume
    /// (paused → running), promote (waiting → the next wave; or skip the pause between
    /// waves), abort (any open state → aborted: Agents not started are skipped, the others
    /// stay as they are).
    pub async fn rollout_action(
        &self,
        actor: &str,
        ns: &str,
        id: i64,
        action: RolloutAction,
    ) -> Result<Rollout> {
        let r = self.rollout(ns, id).await?;
        let t = now();
        let conflict = |what: &str| {
            ServiceError::conflict(
                Code::RolloutStateConflict,
                format!("rollout {id} is {}; {what}", r.state.as_str()),
            )
        };
        let at = (r.state, r.wave);
        let moved = match (action, r.state) {
            (RolloutAction::Pause, RolloutState::Running) => {
                self.store
                    .set_rollout(
                        id,
                        at,
                        RolloutState::Paused,
                        r.wave,
                        self.store.rollout_next_wave_ms(id).await?,
                        Some(&format!("paused by {actor}")),
                        t,
                    )
                    .await?
            }
            (RolloutAction::Pause, _) => return Err(conflict("only a running rollout pauses")),
            (RolloutAction::Resume, RolloutState::Paused) => {
                self.store
                    .set_rollout(
                        id,
                        at,
                        RolloutState::Running,
                        r.wave,
                        self.store.rollout_next_wave_ms(id).await?,
                        Some(&format!("resumed by {actor}")),
                        t,
                    )
                    .await?
            }
            (RolloutAction::Resume, _) => return Err(conflict("only a paused rollout resumes")),
            (RolloutAction::Promote, RolloutState::Waiting) => {
                self.store
                    .set_rollout(
                        id,
                        at,
                        RolloutState::Running,
                        r.wave + 1,
                        None,
                        Some(&format!("wave {} promoted by {actor}", r.wave + 1)),
                        t,
                    )
                    .await?
            }
            (RolloutAction::Promote, RolloutState::Running) if r.next_wave_at.is_some() => {
                self.store
                    .set_rollout(
                        id,
                        at,
                        RolloutState::Running,
                        r.wave + 1,
                        None,
                        Some(&format!("pause skipped by {actor}")),
                        t,
                    )
                    .await?
            }
            (RolloutAction::Promote, _) => {
                return Err(conflict(
                    "only a rollout waiting for promotion (or pausing between waves) promotes",
                ));
            }
            (RolloutAction::Abort, s) if s.is_open() => {
                let moved = self
                    .store
                    .set_rollout(
                        id,
                        at,
                        RolloutState::Aborted,
                        r.wave,
                        None,
                        Some(&format!("aborted by {actor}")),
                        t,
                    )
                    .await?;
                if moved {
                    self.store
                        .skip_pending_rollout_agents(
                            id,
                            (
                                Code::RolloutAborted.as_str(),
                                "the rollout was aborted first",
                            ),
                            t,
                        )
                        .await?;
                }
                moved
            }
            (RolloutAction::Abort, _) => return Err(conflict("a finished rollout stays as it is")),
        };
        if !moved {
            return Err(ServiceError::conflict(
                Code::RolloutStateConflict,
                format!("rollout {id} changed meanwhile; look again and retry"),
            ));
        }
        self.audit(
            actor,
            &format!("rollout.{}", action.as_str()),
            &format!("{ns}/{id}"),
            json!({"from": r.state, "wave": r.wave}),
        )
        .await?;
        self.advance_rollout_logged(id).await;
        self.rollout(ns, id).await
    }

    /// One scheduler pass over every rollout that needs one. A failure of one rollout is
    /// logged and does not stop the others.
    pub async fn advance_rollouts(&self) -> Result<()> {
        for r in self.store.rollouts_to_advance().await? {
            if let Err(e) = self.advance(r.clone()).await {
                tracing::warn!(rollout = r.id, "cannot advance the rollout: {e}");
            }
        }
        Ok(())
    }

    async fn advance_rollout_logged(&self, id: i64) {
        let found = self
            .store
            .rollouts_to_advance()
            .await
            .map(|all| all.into_iter().find(|r| r.id == id));
        let result = match found {
            Ok(Some(r)) => self.advance(r).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e.into()),
        };
        if let Err(e) = result {
            tracing::warn!(rollout = id, "cannot advance the rollout: {e}");
        }
    }

    /// Moves one rollout as far as the store allows now.
    async fn advance(&self, mut r: Rollout) -> Result<()> {
        self.record_outcomes(&mut r).await?;
        if !r.state.is_open() {
            return Ok(());
        }
        let failures = r.failures();
        if failures > r.max_failures {
            return self.halt(&r, failures).await;
        }
        if r.state != RolloutState::Running {
            return Ok(());
        }
        let mut wave = r.wave;
        loop {
            let deploying = r
                .agents
                .iter()
                .filter(|a| a.state == RolloutAgentState::Deploying)
                .count() as u32;
            let pending: Vec<Ident> = r
                .agents
                .iter()
                .filter(|a| a.wave == wave && a.state == RolloutAgentState::Pending)
                .map(|a| a.agent_id.clone())
                .collect();
            if !pending.is_empty() {
                let room = r.max_parallel.saturating_sub(deploying) as usize;
                for agent in pending.iter().take(room) {
                    self.start_agent(&r, agent).await?;
                }
                return Ok(());
            }
            if deploying > 0 {
                return Ok(());
            }
            // The wave is over.
            let t = now();
            if wave + 1 >= r.waves {
                let msg = format!(
                    "{} Agents deployed, {failures} failed (at most {} tolerated)",
                    r.agents.len() as u32 - failures,
                    r.max_failures
                );
                if self
                    .store
                    .set_rollout(
                        r.id,
                        (RolloutState::Running, wave),
                        RolloutState::Done,
                        wave,
                        None,
                        Some(&msg),
                        t,
                    )
                    .await?
                {
                    self.audit(
                        "coordinator",
                        "rollout.done",
                        &format!("{}/{}", r.namespace_id, r.id),
                        json!({"failures": failures, "agents": r.agents.len()}),
                    )
                    .await?;
                }
                return Ok(());
            }
            if r.manual_promote {
                self.store
                    .set_rollout(
                        r.id,
                        (RolloutState::Running, wave),
                        RolloutState::Waiting,
                        wave,
                        None,
                        Some(&format!(
                            "wave {wave} is done; `occ rollout promote` starts wave {}",
                            wave + 1
                        )),
                        t,
                    )
                    .await?;
                return Ok(());
            }
            if r.pause_between_seconds > 0 {
                let now_ms = crate::clock::now_ms();
                match self.store.rollout_next_wave_ms(r.id).await? {
                    None => {
                        let at = now_ms + i64::from(r.pause_between_seconds) * 1000;
                        self.store
                            .set_rollout(
                                r.id,
                                (RolloutState::Running, wave),
                                RolloutState::Running,
                                wave,
                                Some(at),
                                Some(&format!(
                                    "wave {wave} is done; wave {} starts in {} s",
                                    wave + 1,
                                    r.pause_between_seconds
                                )),
                                t,
                            )
                            .await?;
                        return Ok(());
                    }
                    Some(at) if now_ms < at => return Ok(()),
                    Some(_) => {}
                }
            }
            if !self
                .store
                .set_rollout(
                    r.id,
                    (RolloutState::Running, wave),
                    RolloutState::Running,
                    wave + 1,
                    None,
                    Some(&format!("wave {} started", wave + 1)),
                    t,
                )
                .await?
            {
                return Ok(());
            }
            wave += 1;
            r.wave = wave;
        }
    }

    /// Records how the deploys in flight ended.
    async fn record_outcomes(&self, r: &mut Rollout) -> Result<()> {
        let t = now();
        for a in r
            .agents
            .iter_mut()
            .filter(|a| a.state == RolloutAgentState::Deploying)
        {
            let work = match a.work_id {
                Some(w) => {
                    self.store
                        .work_item(&r.namespace_id, &a.agent_id, w)
                        .await?
                }
                None => None,
            };
            let agent = self.store.agent(&r.namespace_id, &a.agent_id).await?;
            let (state, code, message) = match (&work, &agent) {
                (_, None) => (
                    RolloutAgentState::Skipped,
                    Code::AgentGone.as_str().to_owned(),
                    "the Agent was deleted during the rollout".to_owned(),
                ),
                (None, Some(_)) => (
                    RolloutAgentState::Failed,
                    Code::InvalidState.as_str().to_owned(),
                    "the rollout's deploy work is missing".to_owned(),
                ),
                (Some(w), Some(agent))
                    if matches!(w.state, WorkState::Queued | WorkState::Running) =>
                {
                    // With `restore: last-served` and a revision served before this one, the
                    // target puts that one back and the item ends as REVISION_RESTORED: its
                    // evidence, kept first, is no verdict yet.
                    if agent
                        .last_served_fallback(a.revision_id.as_deref().unwrap_or_default())
                        .is_some()
                    {
                        continue;
                    }
                    // With restore none the worker keeps retrying a candidate that did not
                    // become ready (the seed's behaviour); for the rollout its activation
                    // failed once the target reported why.
                    let evidence = match &a.revision_id {
                        Some(rev) => self
                            .store
                            .revision(&r.namespace_id, &a.agent_id, rev)
                            .await?
                            .and_then(|rev| rev.runtime_failure),
                        None => None,
                    };
                    let code = evidence.as_ref().map(|e| e.code.as_str()).filter(|c| {
                        AnyCode::parse(c).is_some_and(|c| ACTIVATION_FAILED.iter().any(|f| c == *f))
                    });
                    match code {
                        Some(code) => (
                            RolloutAgentState::Failed,
                            code.to_owned(),
                            format!(
                                "the candidate did not become ready ({}); the worker keeps \
                                 retrying it (restore: none)",
                                evidence
                                    .as_ref()
                                    .map(|e| e.message.as_str())
                                    .filter(|m| !m.is_empty())
                                    .unwrap_or(code)
                            ),
                        ),
                        None => continue,
                    }
                }
                (Some(w), Some(agent)) => {
                    let (code, message) = w
                        .last_attempt
                        .as_ref()
                        .map(|l| (l.code.clone(), l.message.clone()))
                        .unwrap_or_default();
                    let active = match &a.revision_id {
                        Some(rev) => self
                            .store
                            .revision(&r.namespace_id, &a.agent_id, rev)
                            .await?
                            .is_some_and(|rev| rev.status == RevisionStatus::Active),
                        None => false,
                    };
                    let state = if w.state == WorkState::Done
                        && active
                        && agent.active_revision_id.as_deref() == a.revision_id.as_deref()
                    {
                        RolloutAgentState::Succeeded
                    } else if AnyCode::parse(&code) == Some(Code::RevisionRestored.into()) {
                        RolloutAgentState::Restored
                    } else {
                        RolloutAgentState::Failed
                    };
                    (state, code, message)
                }
            };
            if self
                .store
                .finish_rollout_agent(
                    r.id,
                    &a.agent_id,
                    RolloutAgentState::Deploying,
                    state,
                    (&code, &message),
                    t,
                )
                .await?
            {
                a.state = state;
                a.code = Some(code);
                a.message = Some(message);
                a.finished_at = Some(t);
            }
        }
        Ok(())
    }

    /// The budget is spent: nothing more starts; Agents not started are skipped.
    async fn halt(&self, r: &Rollout, failures: u32) -> Result<()> {
        let t = now();
        let failed: Vec<&str> = r
            .agents
            .iter()
            .filter(|a| a.state.is_failure())
            .map(|a| a.agent_id.as_str())
            .collect();
        let msg = format!(
            "halted: {failures} Agents failed, more than the {} tolerated ({})",
            r.max_failures,
            failed.join(", ")
        );
        if self
            .store
            .set_rollout(
                r.id,
                (r.state, r.wave),
                RolloutState::Halted,
                r.wave,
                None,
                Some(&msg),
                t,
            )
            .await?
        {
            self.store
                .skip_pending_rollout_agents(
                    r.id,
                    (
                        Code::RolloutHalted.as_str(),
                        "the failure budget was spent first",
                    ),
                    t,
                )
                .await?;
            tracing::warn!(rollout = r.id, "{msg}");
            self.audit(
                "coordinator",
                "rollout.halted",
                &format!("{}/{}", r.namespace_id, r.id),
                json!({"failed": failed, "maxFailures": r.max_failures}),
            )
            .await?;
        }
        Ok(())
    }

    /// Deploys one pending Agent: its next revision from the rollout's generation.
    async fn start_agent(&self, r: &Rollout, agent: &Ident) -> Result<()> {
        let t = now();
        let skip = async |state: RolloutAgentState, code: Code, message: String| -> Result<()> {
            self.store
                .finish_rollout_agent(
                    r.id,
                    agent,
                    RolloutAgentState::Pending,
                    state,
                    (code.as_str(), &message),
                    t,
                )
                .await?;
            Ok(())
        };
        let live = self
            .store
            .agent(&r.namespace_id, agent)
            .await?
            .filter(|a| a.desired_state != DesiredState::Deleted);
        if live.is_none() {
            return skip(
                RolloutAgentState::Skipped,
                Code::AgentGone,
                "the Agent was deleted before its turn".to_owned(),
            )
            .await;
        }
        let ns = self.namespace(&r.namespace_id).await?;
        let (configuration_id, generation) = match r.subject() {
            Some(RolloutSubject::Configuration { id, generation }) => (id, generation),
            Some(RolloutSubject::Secret { .. }) => {
                // The Agent keeps the Configuration generation of its newest revision; the
                // new revision differs only in the secret versions it binds (the newest).
                let revisions = self.store.revisions(&r.namespace_id, agent).await?;
                let Some(newest) = revisions.last() else {
                    return skip(
                        RolloutAgentState::Failed,
                        Code::InvalidState,
                        "the Agent has no revision, so no Configuration generation to keep"
                            .to_owned(),
                    )
                    .await;
                };
                (
                    newest.configuration_id.clone(),
                    newest.configuration_generation,
                )
            }
            None => {
                return skip(
                    RolloutAgentState::Failed,
                    Code::InvalidState,
                    "the rollout names neither a Configuration nor a secret".to_owned(),
                )
                .await;
            }
        };
        let Some(cfg) = self
            .store
            .configuration_at(&r.namespace_id, &configuration_id, Some(generation))
            .await?
        else {
            return skip(
                RolloutAgentState::Failed,
                Code::UnknownConfiguration,
                format!("configuration {configuration_id} generation {generation} is gone"),
            )
            .await;
        };
        let mut rev = match self.build_revision(&ns, agent, &cfg).await {
            Ok(rev) => rev,
            Err(ServiceError::Invalid { code, message }) => {
                return skip(RolloutAgentState::Failed, code, message).await;
            }
            Err(e) => return Err(e),
        };
        if let Some(work) = self.store.start_rollout_deploy(r.id, &mut rev).await? {
            self.audit(
                &format!("rollout:{}", r.id),
                "agent.deploy",
                &format!("{}/{agent}", r.namespace_id),
                json!({"revisionId": rev.id, "number": rev.number, "workId": work,
                       "rolloutId": r.id, "createdBy": r.created_by}),
            )
            .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::waves;

    #[test]
    fn the_canary_is_wave_0_and_the_rest_come_in_waves_of_max_parallel() {
        assert_eq!(waves(7, 2, 2), vec![0, 0, 1, 1, 2, 2, 3]);
        assert_eq!(waves(5, 0, 2), vec![0, 0, 1, 1, 2]);
        assert_eq!(waves(3, 3, 1), vec![0, 0, 0]);
        assert_eq!(waves(4, 1, 10), vec![0, 1, 1, 1]);
    }
}
