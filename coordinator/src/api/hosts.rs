//! Enrolled hosts.

use axum::extract::{Path, State};
use clawfleet_api::model::Host;
use clawfleet_api::responses::HostProbe;

use super::access::Caller;
use super::extract::{NoBody, StrictJson, StrictQuery};
use super::{ApiError, ApiResult, NoContent, Paged, Reply, S, ok, paged};
use crate::backend::Backend;
use crate::service::page::PageQuery;
use crate::service::{HostUpdate, NewHost, ProbeError};

pub(super) async fn enrol_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewHost>,
) -> ApiResult<Reply<Host>> {
    let host = st
        .service
        .enrol_host_probed(&*st.backend, &caller.token_id, req, false)
        .await
        .map_err(probe_error)?;
    ok(host)
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
) -> ApiResult<Paged<Host>> {
    paged(st.service.hosts_page(&q).await?)
}

pub(super) async fn get_host<B: Backend>(
    State(st): S<B>,
    Path(host): Path<String>,
) -> ApiResult<Reply<Host>> {
    ok(st.service.host(&host).await?)
}

pub(super) async fn update_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(host): Path<String>,
    StrictJson(req): StrictJson<HostUpdate>,
) -> ApiResult<Reply<Host>> {
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
    ok(host)
}

pub(super) async fn delete_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(host): Path<String>,
) -> ApiResult<NoContent> {
    st.service.delete_host(&caller.token_id, &host).await?;
    Ok(NoContent)
}

pub(super) async fn probe_host<B: Backend>(
    State(st): S<B>,
    Path(host): Path<String>,
    _: NoBody,
) -> ApiResult<Reply<HostProbe>> {
    let probe = st
        .service
        .probe_host(&*st.backend, &host)
        .await
        .map_err(probe_error)?;
    ok(probe)
}
