//! The console's changes. Each is two steps: the first POST shows what would happen (the
//! deploy's plan from the target, or what a stop, reconcile or rollout control does), the
//! second applies exactly that (a deploy applies its plan token, refused as stale when the
//! facts moved). Each change is the service call the API makes, audited with the caller's
//! token id; the CSRF check and the role check ran before (`auth::authorize`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect};
use maud::{Markup, html};

use super::Console;
use super::auth::{Session, form_field};
use super::page::{ConsoleError, PageResult, csrf_field, layout, ok};
use super::views::rollout_id;
use crate::api::ApiError;
use crate::backend::Backend;
use crate::service::{ProbeError, RolloutAction, RuntimeError};

fn runtime_error(e: RuntimeError) -> ConsoleError {
    crate::api::runtime::call_error(e).into()
}

fn confirmed(body: &[u8]) -> bool {
    form_field(body, "confirm").as_deref() == Some("yes")
}

/// The confirmation page of a change: what it does, and the form that applies it.
fn confirm(
    session: &Session,
    title: &str,
    action: &str,
    back: &str,
    what: Markup,
    fields: &[(&str, &str)],
) -> PageResult {
    ok(layout(
        session,
        title,
        html! {
            h2 { "Plan" }
            (what)
            div.actions {
                form method="post" action=(action) {
                    (csrf_field(session))
                    @for (k, v) in fields { input type="hidden" name=(k) value=(v); }
                    input type="hidden" name="confirm" value="yes";
                    button.primary type="submit" { "Apply" }
                }
                a href=(back) { "Cancel" }
            }
        },
    ))
}

fn agent_href(ns: &str, agent: &str) -> String {
    format!("/console/namespaces/{ns}/agents/{agent}")
}

/// `POST …/agents/{agent}/deploy`: without a plan token, the target's plan of the next
/// revision; with one, the deploy of that plan.
pub(crate) async fn deploy<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, agent)): Path<(String, String)>,
    body: Bytes,
) -> PageResult {
    let service = &console.app.service;
    let back = agent_href(&ns, &agent);
    if let Some(token) = form_field(&body, "planToken").filter(|t| !t.is_empty()) {
        let (revision, work) = service
            .deploy_planned(&session.caller.token_id, &ns, &agent, &token)
            .await?;
        tracing::info!(token = %session.caller.token_id, %ns, %agent, revision = %revision.id, work, "console deploy");
        return Ok(Redirect::to(&back).into_response());
    }
    let plan = service
        .deploy_plan(&*console.app.backend, &ns, &agent)
        .await
        .map_err(runtime_error)?;
    let what = html! {
        @for p in &plan.agents {
            dl.facts {
                dt { "Target" } dd { (p.target) @if !p.placed { " (not placed yet: placement chose it)" } }
                dt { "Active revision" } dd { (p.active_revision_id.as_deref().unwrap_or("none")) }
                @let next = serde_json::to_value(&p.revision).unwrap_or_default();
                dt { "Next revision" } dd {
                    (next["number"]) " (" code { (next["id"].as_str().unwrap_or("")) } "): configuration "
                    (next["configurationId"].as_str().unwrap_or("")) " generation " (next["configurationGeneration"])
                }
            }
            h3 { "What the target would change" }
            div.scroll { table {
                thead { tr { th { "Part" } th { "Change" } } }
                tbody { @if let serde_json::Value::Object(m) = serde_json::to_value(&p.changes).unwrap_or_default() {
                    @for (k, v) in &m { tr { td { (k) } td { code { (v.to_string()) } } } }
                } }
            } }
        }
        p.muted { "Applying deploys exactly this plan; if anything it was computed from changed meanwhile, the deploy is refused and nothing is written." }
    };
    confirm(
        &session,
        &format!("Deploy {ns}/{agent}"),
        &format!("{back}/deploy"),
        &back,
        what,
        &[("planToken", &plan.token)],
    )
}

/// `POST …/agents/{agent}/stop`.
pub(crate) async fn stop<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, agent)): Path<(String, String)>,
    body: Bytes,
) -> PageResult {
    let service = &console.app.service;
    let back = agent_href(&ns, &agent);
    if confirmed(&body) {
        service.stop(&session.caller.token_id, &ns, &agent).await?;
        return Ok(Redirect::to(&back).into_response());
    }
    let a = service.agent(&ns, &agent).await?;
    confirm(
        &session,
        &format!("Stop {ns}/{agent}"),
        &format!("{back}/stop"),
        &back,
        html! {
            p { "Desired state " code { (a.desired_state.as_str()) } " becomes " code { "stopped" } "." }
            p { "The target " (a.host.as_deref().unwrap_or("(none: not placed)")) " stops the Agent's unit; its revision "
                (a.active_revision_id.as_deref().map(|s| s as &str).unwrap_or("(none)")) " stays on disk." }
        },
        &[],
    )
}

/// `POST …/agents/{agent}/reconcile`.
pub(crate) async fn reconcile<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, agent)): Path<(String, String)>,
    body: Bytes,
) -> PageResult {
    let service = &console.app.service;
    let back = agent_href(&ns, &agent);
    if confirmed(&body) {
        service
            .reconcile(&session.caller.token_id, &ns, &agent)
            .await?;
        return Ok(Redirect::to(&back).into_response());
    }
    let a = service.agent(&ns, &agent).await?;
    confirm(
        &session,
        &format!("Reconcile {ns}/{agent}"),
        &format!("{back}/reconcile"),
        &back,
        html! {
            p { "The active revision " code { (a.active_revision_id.as_deref().map(|s| s as &str).unwrap_or("(none)")) }
                " is applied again on " (a.host.as_deref().unwrap_or("its target")) " (a deployment pass of the same revision: what drifted is put back)." }
        },
        &[],
    )
}

fn rollout_action(text: &str) -> Result<RolloutAction, ConsoleError> {
    match text {
        "pause" => Ok(RolloutAction::Pause),
        "resume" => Ok(RolloutAction::Resume),
        "promote" => Ok(RolloutAction::Promote),
        "abort" => Ok(RolloutAction::Abort),
        other => Err(ConsoleError {
            status: axum::http::StatusCode::BAD_REQUEST,
            code: crate::codes::Code::InvalidRequest.as_str(),
            message: format!("action: {other:?} is not one of pause, resume, promote, abort"),
        }),
    }
}

/// `POST …/rollouts/{rollout}/control` (`action`: pause, resume, promote or abort).
pub(crate) async fn rollout_control<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, id)): Path<(String, String)>,
    body: Bytes,
) -> PageResult {
    let service = &console.app.service;
    let id = rollout_id(&id)?;
    let text = form_field(&body, "action").unwrap_or_default();
    let action = rollout_action(&text)?;
    let back = format!("/console/namespaces/{ns}/rollouts/{id}");
    if confirmed(&body) {
        service
            .rollout_action(&session.caller.token_id, &ns, id, action)
            .await?;
        return Ok(Redirect::to(&back).into_response());
    }
    let r = service.rollout(&ns, id).await?;
    let count =
        |s: crate::model::RolloutAgentState| r.agents.iter().filter(|a| a.state == s).count();
    let deploying = count(crate::model::RolloutAgentState::Deploying);
    let pending = count(crate::model::RolloutAgentState::Pending);
    let what = match action {
        RolloutAction::Pause => {
            html! { p { "Nothing new starts; the " (deploying) " deploys in flight finish. " (pending) " Agents wait." } }
        }
        RolloutAction::Resume => {
            html! { p { "The rollout goes on with wave " (r.wave) "; " (pending) " Agents wait to be deployed." } }
        }
        RolloutAction::Promote => html! { p { "The next wave after " (r.wave) " starts now." } },
        RolloutAction::Abort => {
            html! { p { "The " (pending) " Agents not started are skipped; the " (deploying) " deploys in flight and the Agents done stay as they are. This cannot be undone." } }
        }
    };
    confirm(
        &session,
        &format!("{} rollout #{id}", text),
        &format!("{back}/control"),
        &back,
        what,
        &[("action", &text)],
    )
}

/// `POST /console/hosts/{host}/probe`.
pub(crate) async fn probe<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    Path(host): Path<String>,
) -> PageResult {
    console
        .app
        .service
        .probe_host(&*console.app.backend, &host)
        .await
        .map_err(|e| -> ConsoleError {
            match e {
                ProbeError::Service(e) => e.into(),
                ProbeError::Call(e) => ApiError::from_call(&e).into(),
            }
        })?;
    Ok(Redirect::to("/console/hosts").into_response())
}
