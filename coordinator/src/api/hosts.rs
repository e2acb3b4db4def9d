//! Enrolled hosts.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::access::Caller;
use super::extract::{NoBody, StrictJson};
use super::{ApiError, ApiResult, S, ok};
use crate::backend::Backend;
use crate::service::{HostUpdate, NewHost, ProbeError};

pub(super) async fn enrol_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewHost>,
) -> ApiResult {
    ok(
        StatusCode::CREATED,
        st.service.enrol_host(&caller.token_id, req).await?,
    )
}

pub(super) async fn list_hosts<B: Backend>(State(st): S<B>) -> ApiResult {
    ok(StatusCode::OK, st.service.hosts().await?)
}

pub(super) async fn get_host<B: Backend>(State(st): S<B>, Path(host): Path<String>) -> ApiResult {
    ok(StatusCode::OK, st.service.host(&host).await?)
}

pub(super) async fn update_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(host): Path<String>,
    StrictJson(req): StrictJson<HostUpdate>,
) -> ApiResult {
    let update = NewHost {
        name: host,
        address: req.address,
        port: req.port,
        host_key: req.host_key,
        max_agents: req.max_agents,
        login_user: req.login_user,
        jump: req.jump,
    };
    ok(
        StatusCode::OK,
        st.service.update_host(&caller.token_id, update).await?,
    )
}

pub(super) async fn delete_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(host): Path<String>,
) -> ApiResult {
    st.service.delete_host(&caller.token_id, &host).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn probe_host<B: Backend>(
    State(st): S<B>,
    Path(host): Path<String>,
    _: NoBody,
) -> ApiResult {
    match st.service.probe_host(&*st.backend, &host).await {
        Ok(value) => ok(StatusCode::OK, value),
        Err(ProbeError::Service(e)) => Err(e.into()),
        Err(ProbeError::Call(e)) => Err(ApiError::from_call(&e)),
    }
}
