//! Agents, their revisions, deploy and stop, deployment status and work items.

use axum::extract::{Path, State};
use clawfleet_api::model::{Agent, Revision, WorkRecord, WorkspaceSetupInfo};
use clawfleet_api::responses::{AgentDeleting, Deployment, DeploymentStatus, Stopping};

use super::access::Caller;
use super::extract::{NoBody, StrictJson, StrictQuery};
use super::{ApiError, ApiResult, Paged, Reply, S, ok, paged};
use crate::backend::Backend;
use crate::codes::Code;
use crate::model::DesiredState;
use crate::service::page::PageQuery;
use crate::service::{AgentPatch, DeployQuery, NewAgent};

pub(super) async fn create_agent<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(ns): Path<String>,
    StrictJson(req): StrictJson<NewAgent>,
) -> ApiResult<Reply<Agent>> {
    ok(st.service.create_agent(&caller.token_id, &ns, req).await?)
}

pub(super) async fn list_agents<B: Backend>(
    State(st): S<B>,
    Path(ns): Path<String>,
    StrictQuery(q): StrictQuery<PageQuery>,
) -> ApiResult<Paged<Agent>> {
    paged(st.service.agents_page(&ns, &q).await?)
}

pub(super) async fn get_agent<B: Backend>(
    State(st): S<B>,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult<Reply<Agent>> {
    ok(st.service.agent(&ns, &agent).await?)
}

pub(super) async fn get_workspace<B: Backend>(
    State(st): S<B>,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult<Reply<WorkspaceSetupInfo>> {
    ok(st.service.workspace(&ns, &agent).await?)
}

pub(super) async fn patch_agent<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, agent)): Path<(String, String)>,
    StrictJson(req): StrictJson<AgentPatch>,
) -> ApiResult<Reply<Agent>> {
    ok(st
        .service
        .patch_agent(&caller.token_id, &ns, &agent, req)
        .await?)
}

pub(super) async fn delete_agent<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult<Reply<AgentDeleting>> {
    let work = st
        .service
        .delete_agent(&caller.token_id, &ns, &agent)
        .await?;
    ok(AgentDeleting {
        namespace_id: ns,
        agent_id: agent,
        deleting: true,
        work_id: work,
    })
}

pub(super) async fn deploy<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, agent)): Path<(String, String)>,
    StrictQuery(query): StrictQuery<DeployQuery>,
    _: NoBody,
) -> ApiResult<Reply<Deployment>> {
    let (revision, work_id) = match &query.plan_token {
        Some(t) => {
            st.service
                .deploy_planned(&caller.token_id, &ns, &agent, t)
                .await?
        }
        None => st.service.deploy(&caller.token_id, &ns, &agent).await?,
    };
    ok(Deployment { revision, work_id })
}

pub(super) async fn stop<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, agent)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult<Reply<Stopping>> {
    let work = st.service.stop(&caller.token_id, &ns, &agent).await?;
    ok(Stopping {
        namespace_id: ns,
        agent_id: agent,
        desired_state: DesiredState::Stopped,
        work_id: work,
    })
}

pub(super) async fn get_work<B: Backend>(
    State(st): S<B>,
    Path((ns, agent, id)): Path<(String, String, String)>,
) -> ApiResult<Reply<WorkRecord>> {
    let id: i64 = id.parse().map_err(|_| {
        ApiError::new(
            Code::InvalidIdentifier,
            format!("work id {id:?} must be a whole number"),
        )
    })?;
    ok(st.service.work_item(&ns, &agent, id).await?)
}

pub(super) async fn list_revisions<B: Backend>(
    State(st): S<B>,
    Path((ns, agent)): Path<(String, String)>,
    StrictQuery(q): StrictQuery<PageQuery>,
) -> ApiResult<Paged<Revision>> {
    paged(st.service.revisions_page(&ns, &agent, &q).await?)
}

pub(super) async fn get_revision<B: Backend>(
    State(st): S<B>,
    Path((ns, agent, rev)): Path<(String, String, String)>,
) -> ApiResult<Reply<Revision>> {
    ok(st.service.revision(&ns, &agent, &rev).await?)
}

pub(super) async fn deployment_status<B: Backend>(
    State(st): S<B>,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult<Reply<DeploymentStatus>> {
    ok(st.service.deployment_status(&ns, &agent).await?)
}
