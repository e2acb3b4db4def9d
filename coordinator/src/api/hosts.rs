//! Enrolled hosts.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::access::Caller;
use super::extract::{NoBody, StrictJson, StrictQuery};
use super::{ApiError, ApiResult, S, ok, paged};
use crate::backend::Backend;
use crate::service::page::PageQuery;
use crate::service::{HostUpdate, NewHost, ProbeError};

pub(super) async fn enrol_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewHost>,
) -> ApiResult {
    let host = st
        .service
        .enrol_host_probed(&*st.backend, &caller.token_id, req, false)
        .await
        .map_err(probe_error)?;
    ok(StatusCode::CREATED, host)
}

fn probe_error(e: ProbeError) -> ApiError {
    match e {
        ProbeError::Service(e) => e.into(),
        ProbeError::Call(e) => ApiError::from_call(&e),
    }
}

pub(super) async fn list_hosts<B: Backend>(
    State(st): S<B>,
    StrictQuery(q): StrictQuery<PageQuery>,
) -> ApiResult {
    paged(st.service.hosts_page(&q).await?)
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
    let host = st
        .service
        .enrol_host_probed(&*st.backend, &caller.token_id, update, true)
        .await
        .map_err(probe_error)?;
    ok(StatusCode::OK, host)
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
    let value = st
        .service
        .probe_host(&*st.backend, &host)
        .await
        .map_err(probe_error)?;
    ok(StatusCode::OK, value)
}
