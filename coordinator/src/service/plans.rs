//! Plans: what a deploy or a rollout would change on each target, asked of the target with
//! the read-only `plan-revision` (its own checks, from its real state), and the plan token:
//! a digest of the facts the plan was computed against (each Agent's Configuration and
//! generation, and its active revision), which `--apply-plan` requires to be still current.

use clawfleet_api::responses::{AgentPlan, DeployPlan, PlannedRevision, RolloutPlan};
use clawfleet_protocol::plan::PlanArgs;
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::{Ident, Operation, Sha256Hex};
use serde_json::{Value, json};

use super::runtime::{RuntimeError, read_options, refs, wrong_answer};
use super::{NewRollout, Service, ServiceError};
use crate::backend::{Backend, Target};
use crate::codes::Code;
use crate::model::{Agent, Configuration, Namespace, RestorePolicy, Revision, RevisionStatus};

const TOKEN_PREFIX: &str = "plan1-";
/// Most Agents one rollout plan asks about (one target call each, within one API request).
pub const MAX_PLAN_AGENTS: usize = 200;

/// What a plan's token digests for one Agent ([`Service::fact`]).
type Fact = (
    String,
    String,
    u32,
    Option<String>,
    Option<clawfleet_protocol::egress::Egress>,
);

/// The token of a plan: a digest of, per Agent in order, its id, the Configuration and
/// generation it would get, its active revision and its egress settings (which the plan's
/// prepare carries).
fn token(ns: &str, facts: &[Fact]) -> String {
    let text = json!({"namespace": ns, "agents": facts}).to_string();
    let digest = clawfleet_protocol::ident::sha256(text.as_bytes());
    let hex = Sha256Hex::from_digest(&digest).to_string();
    format!("{TOKEN_PREFIX}{}", &hex[..32])
}

/// Refuses a token that is not one of ours, or one computed against other facts.
fn check_token(given: &str, current: &str, what: &str) -> Result<(), ServiceError> {
    let well_formed = given
        .strip_prefix(TOKEN_PREFIX)
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if !well_formed {
        let shown: String = given.chars().take(48).collect();
        return Err(ServiceError::invalid(
            Code::InvalidPlanToken,
            format!("planToken {shown:?} is not a plan token (plan1- and 32 hex digits)"),
        ));
    }
    if given != current {
        return Err(ServiceError::conflict(
            Code::PlanStale,
            format!(
                "the plan of {what} is stale: a Configuration generation, an active revision \
                 or an Agent's egress settings moved since it was computed; plan again"
            ),
        ));
    }
    Ok(())
}

impl Service {
    /// `(agent, configuration, generation, active revision, egress)` of an Agent about to
    /// get `cfg`.
    fn fact(agent: &Agent, cfg: &Configuration) -> Fact {
        (
            agent.id.to_string(),
            cfg.id.to_string(),
            cfg.generation,
            agent.active_revision_id.as_ref().map(Ident::to_string),
            agent.egress.clone(),
        )
    }

    /// The token a deploy of the Agent would be planned under now.
    async fn deploy_token(
        &self,
        ns: &str,
        agent: &Agent,
    ) -> super::Result<(String, Configuration)> {
        let cfg = self
            .store
            .configuration(&agent.namespace_id, &agent.configuration_id)
            .await?
            .ok_or_else(|| ServiceError::not_found("configuration", &agent.configuration_id))?;
        Ok((token(ns, &[Self::fact(agent, &cfg)]), cfg))
    }

    /// What `occ agent deploy --plan` shows: per target, what the next revision's deploy would
    /// change, and the plan token.
    pub async fn deploy_plan<B: Backend>(
        &self,
        backend: &B,
        ns: &str,
        id: &str,
    ) -> Result<DeployPlan, RuntimeError> {
        let namespace = self.namespace(ns).await?;
        let agent = self.agent_not_deleting(ns, id).await?;
        let (token, cfg) = self.deploy_token(ns, &agent).await?;
        let plan = self.plan_agent(backend, &namespace, &agent, &cfg).await?;
        Ok(DeployPlan {
            namespace_id: ns.to_owned(),
            token,
            agents: vec![plan],
        })
    }

    /// [`Service::deploy_plan`] as the JSON the API answers.
    pub async fn plan_deploy<B: Backend>(
        &self,
        backend: &B,
        ns: &str,
        id: &str,
    ) -> Result<Value, RuntimeError> {
        Ok(json!(self.deploy_plan(backend, ns, id).await?))
    }

    /// Consumes a current plan token: each applies once, so a second apply (the facts not
    /// moved yet because the first deploy is still queued) is refused with PLAN_STALE.
    async fn consume(&self, plan_token: &str, what: &str) -> super::Result<()> {
        if self
            .store
            .consume_plan_token(plan_token, crate::clock::now_seconds())
            .await?
        {
            return Ok(());
        }
        Err(ServiceError::conflict(
            Code::PlanStale,
            format!(
                "the plan of {what} was applied already (a plan token applies once); plan again"
            ),
        ))
    }

    /// A deploy that `--apply-plan TOKEN` guards: refused with PLAN_STALE (nothing written)
    /// unless the facts are still those the plan was computed against and the token has not
    /// been applied before.
    pub async fn deploy_planned(
        &self,
        actor: &str,
        ns: &str,
        id: &str,
        plan_token: &str,
    ) -> super::Result<(Revision, i64)> {
        let agent = self.agent_not_deleting(ns, id).await?;
        let (current, _) = self.deploy_token(ns, &agent).await?;
        let what = format!("Agent {ns}/{id}");
        check_token(plan_token, &current, &what)?;
        self.consume(plan_token, &what).await?;
        self.deploy(actor, ns, id).await
    }

    /// [`Service::rollout_plan`] as the JSON the API answers.
    pub async fn plan_rollout<B: Backend>(
        &self,
        backend: &B,
        ns: &str,
        r: &NewRollout,
    ) -> Result<Value, RuntimeError> {
        Ok(json!(self.rollout_plan(backend, ns, r).await?))
    }

    /// What `occ rollout create --plan` shows: the rollout as it would be created, each
    /// Agent's plan, and the token `--apply-plan` needs.
    pub async fn rollout_plan<B: Backend>(
        &self,
        backend: &B,
        ns: &str,
        r: &NewRollout,
    ) -> Result<RolloutPlan, RuntimeError> {
        let (namespace, cfg, row) = self.validate_rollout("plan", ns, r).await?;
        if row.agents.len() > MAX_PLAN_AGENTS {
            return Err(ServiceError::invalid(
                Code::InvalidRollout,
                format!(
                    "a plan asks each Agent's target and covers at most {MAX_PLAN_AGENTS} Agents; \
                     this rollout selects {} (plan it in parts with agents)",
                    row.agents.len()
                ),
            )
            .into());
        }
        let mut agents = Vec::new();
        let mut facts = Vec::new();
        for (id, wave) in &row.agents {
            let agent = self.agent_not_deleting(ns, id).await?;
            facts.push(Self::fact(&agent, &cfg));
            let mut plan = self.plan_agent(backend, &namespace, &agent, &cfg).await?;
            plan.wave = Some(*wave);
            agents.push(plan);
        }
        Ok(RolloutPlan {
            namespace_id: ns.to_owned(),
            configuration_id: cfg.id.to_string(),
            configuration_generation: cfg.generation,
            waves: row.agents.iter().map(|(_, w)| w + 1).max().unwrap_or(0),
            token: token(ns, &facts),
            agents,
        })
    }

    /// The current token of a rollout about to be created over `agents`.
    pub(super) async fn rollout_token(
        &self,
        ns: &str,
        cfg: &Configuration,
        agents: &[(String, u32)],
        plan_token: &str,
    ) -> super::Result<()> {
        let mut facts = Vec::new();
        for (id, _) in agents {
            facts.push(Self::fact(&self.agent(ns, id).await?, cfg));
        }
        let what = format!("this rollout of {}", cfg.id);
        check_token(plan_token, &token(ns, &facts), &what)?;
        self.consume(plan_token, &what).await
    }

    /// One Agent's plan, asked of the target it is placed on (or, unplaced, the pool host
    /// placement would choose now; the choice is made again at deploy time).
    async fn plan_agent<B: Backend>(
        &self,
        backend: &B,
        namespace: &Namespace,
        agent: &Agent,
        cfg: &Configuration,
    ) -> Result<AgentPlan, RuntimeError> {
        let ns = &namespace.id;
        let mut rev = self.build_revision(namespace, &agent.id, cfg).await?;
        let revisions = self
            .store
            .revisions(ns, &agent.id)
            .await
            .map_err(ServiceError::from)?;
        rev.number = self
            .store
            .next_revision_number(ns, &agent.id)
            .await
            .map_err(ServiceError::from)?;
        rev.id = crate::store::revision_id(rev.number, &rev.configuration_hash)
            .map_err(ServiceError::from)?;
        let bad = |e: String| ServiceError::invalid(Code::InvalidStoredId, e);
        let reference = crate::render::revision_ref(&rev).map_err(bad)?;
        let spec = crate::render::revision_spec(&reference, &rev.rendered)
            .map_err(|(code, message)| ServiceError::invalid(code, message))?;
        // The revision a failed activation would put back, as the worker chooses it.
        let restore = match (&agent.restore, &agent.served_revision_id) {
            (RestorePolicy::LastServed, Some(served)) => revisions
                .iter()
                .find(|r| &r.id == served && r.status != RevisionStatus::Retired)
                .map(|r| crate::render::revision_ref(r).map_err(bad))
                .transpose()?,
            _ => None,
        };
        let (target, placed) = match crate::targets::agent(&*self.store, namespace, agent)
            .await
            .map_err(ServiceError::from)?
        {
            Some(t) => (t, true),
            None => (self.would_place(namespace).await?, false),
        };
        let (namespace_ref, agent_ref) = refs(namespace, agent);
        let target_name = target.name().to_owned();
        let op = Operation::PlanRevision(PlanArgs {
            namespace: namespace_ref,
            agent: agent_ref,
            revision: spec,
            restore,
            egress: agent.egress.clone(),
        });
        let plan = match backend.call(target, op, read_options()).await? {
            OperationResult::PlanRevision(p) => p,
            other => return Err(wrong_answer(&other).into()),
        };
        Ok(AgentPlan {
            agent_id: agent.id.to_string(),
            target: target_name,
            placed,
            revision: PlannedRevision {
                id: rev.id.to_string(),
                number: rev.number,
                configuration_id: cfg.id.to_string(),
                configuration_generation: cfg.generation,
                configuration_hash: rev.configuration_hash.to_string(),
            },
            active_revision_id: agent.active_revision_id.as_ref().map(Ident::to_string),
            changes: *plan,
            wave: None,
        })
    }

    /// The host placement would choose now for an Agent that has none.
    async fn would_place(&self, ns: &Namespace) -> super::Result<Target> {
        let Some(host) = crate::targets::least_loaded(&*self.store, ns).await? else {
            return Err(ServiceError::conflict(
                Code::NoHostAvailable,
                format!("no ready host of Namespace {}'s pool has room", ns.id),
            ));
        };
        Ok(crate::targets::host(&host))
    }
}

#[cfg(test)]
mod tests {
    use super::{check_token, token};

    #[test]
    fn tokens_change_with_every_fact_and_bad_ones_are_named() {
        let facts = |generation: u32, active: Option<&str>| {
            vec![(
                "a1".to_owned(),
                "cfg".to_owned(),
                generation,
                active.map(str::to_owned),
                None,
            )]
        };
        let t = token("ns", &facts(2, Some("rev-1")));
        assert!(t.starts_with("plan1-") && t.len() == 38, "{t}");
        assert_eq!(t, token("ns", &facts(2, Some("rev-1"))));
        for other in [
            token("ns", &facts(3, Some("rev-1"))),
            token("ns", &facts(2, Some("rev-2"))),
            token("ns", &facts(2, None)),
            token("other", &facts(2, Some("rev-1"))),
            token(
                "ns",
                &[(
                    "a1".to_owned(),
                    "cfg".to_owned(),
                    2,
                    Some("rev-1".to_owned()),
                    Some(clawfleet_protocol::egress::Egress {
                        ports: Some(vec![]),
                        allow: None,
                    }),
                )],
            ),
        ] {
            assert_ne!(t, other);
            assert!(
                check_token(&other, &t, "x")
                    .unwrap_err()
                    .to_string()
                    .contains("stale")
            );
        }
        assert!(check_token(&t, &t, "x").is_ok());
        for bad in [
            "",
            "plan1-",
            "plan1-xyz",
            "plan2-0123456789abcdef0123456789abcdef",
        ] {
            let e = check_token(bad, &t, "x").unwrap_err();
            assert!(e.to_string().contains("planToken"), "{e}");
        }
    }
}
