//! Rollouts: create, list, show, and the operator's pause, resume, promote and abort.

use axum::extract::{Path, State};
use clawfleet_api::model::Rollout;

use super::access::Caller;
use super::extract::{NoBody, StrictJson};
use super::{ApiError, ApiResult, Reply, S, ok};
use crate::backend::Backend;
use crate::codes::Code;
use crate::service::{NewRollout, RolloutAction};

fn rollout_id(text: &str) -> Result<i64, ApiError> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| {
            ApiError::new(
                Code::InvalidIdentifier,
                format!("rollout id {text:?} must be a whole number from 1"),
            )
        })
}

pub(super) async fn create_rollout<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(ns): Path<String>,
    StrictJson(req): StrictJson<NewRollout>,
) -> ApiResult<Reply<Rollout>> {
    ok(st
        .service
        .create_rollout(&caller.token_id, &ns, req)
        .await?)
}

pub(super) async fn list_rollouts<B: Backend>(
    State(st): S<B>,
    Path(ns): Path<String>,
) -> ApiResult<Reply<Vec<Rollout>>> {
    ok(st.service.rollouts(&ns).await?)
}

pub(super) async fn get_rollout<B: Backend>(
    State(st): S<B>,
    Path((ns, id)): Path<(String, String)>,
) -> ApiResult<Reply<Rollout>> {
    ok(st.service.rollout(&ns, rollout_id(&id)?).await?)
}

async fn act<B: Backend>(
    st: &super::AppState<B>,
    caller: &Caller,
    ns: &str,
    id: &str,
    action: RolloutAction,
) -> ApiResult<Reply<Rollout>> {
    ok(st
        .service
        .rollout_action(&caller.token_id, ns, rollout_id(id)?, action)
        .await?)
}

pub(super) async fn pause_rollout<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult<Reply<Rollout>> {
    act(&st, &caller, &ns, &id, RolloutAction::Pause).await
}

pub(super) async fn resume_rollout<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult<Reply<Rollout>> {
    act(&st, &caller, &ns, &id, RolloutAction::Resume).await
}

pub(super) async fn promote_rollout<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult<Reply<Rollout>> {
    act(&st, &caller, &ns, &id, RolloutAction::Promote).await
}

pub(super) async fn abort_rollout<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, id)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult<Reply<Rollout>> {
    act(&st, &caller, &ns, &id, RolloutAction::Abort).await
}
