//! Plans before apply: what a deploy or rollout would change on each target, with the token
//! that `--apply-plan` hands back to deploy or create the rollout only while it is current.

use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::extract::{NoBody, StrictJson};
use super::runtime::call_error;
use super::{ApiResult, S, ok};
use crate::backend::Backend;
use crate::service::NewRollout;

pub(super) async fn plan_deploy<B: Backend>(
    State(st): S<B>,
    Path((ns, agent)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult {
    let plan = st
        .service
        .plan_deploy(&*st.backend, &ns, &agent)
        .await
        .map_err(call_error)?;
    ok(StatusCode::OK, plan)
}

pub(super) async fn plan_rollout<B: Backend>(
    State(st): S<B>,
    Path(ns): Path<String>,
    StrictJson(req): StrictJson<NewRollout>,
) -> ApiResult {
    let plan = st
        .service
        .plan_rollout(&*st.backend, &ns, &req)
        .await
        .map_err(call_error)?;
    ok(StatusCode::OK, plan)
}
