//! Plans before apply: what a deploy or rollout would change on each target, with the token
//! that `--apply-plan` hands back to deploy or create the rollout only while it is current.
//! A plan asks its targets, so besides the limits every request meets (the token's
//! concurrency and rate, as deploys) it spends the token's budget of reads of hosts and
//! clusters (`ratelimit.rs`), as runtime and log reads do.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use clawfleet_api::responses::{DeployPlan, RolloutPlan};

use super::access::Caller;
use super::extract::{NoBody, StrictJson};
use super::ratelimit::ReadLimiter;
use super::runtime::{call_error, spend};
use super::{ApiResult, Reply, S, ok};
use crate::backend::Backend;
use crate::service::NewRollout;

pub(super) async fn plan_deploy<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Extension(limiter): Extension<Arc<ReadLimiter>>,
    Path((ns, agent)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult<Reply<DeployPlan>> {
    spend(&limiter, &caller)?;
    let plan = st
        .service
        .deploy_plan(&*st.backend, &ns, &agent)
        .await
        .map_err(call_error)?;
    ok(plan)
}

pub(super) async fn plan_rollout<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Extension(limiter): Extension<Arc<ReadLimiter>>,
    Path(ns): Path<String>,
    StrictJson(req): StrictJson<NewRollout>,
) -> ApiResult<Reply<RolloutPlan>> {
    spend(&limiter, &caller)?;
    let plan = st
        .service
        .rollout_plan(&*st.backend, &ns, &req)
        .await
        .map_err(call_error)?;
    ok(plan)
}
