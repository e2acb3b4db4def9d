//! The live streams (server-sent events). Each event is `replace` or `append` with data
//! `<element id>\n<html>`: a fragment the server rendered (and escaped) for the page's
//! script to put in place. A stream re-checks its session at every step and ends when the
//! token was revoked or expired; a target that does not answer is shown as such, never as
//! the last good answer.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use maud::{Markup, html};

use super::Console;
use super::auth::Session;
use super::page::{PageResult, Tone, badge, time};
use super::views::{agent_status, rollout_fragment, rollout_id, runtime_fragment};
use crate::backend::Backend;
use crate::service::{LogsQuery, ServiceError};

fn event(kind: &str, id: &str, html: &Markup) -> Event {
    Event::default()
        .event(kind)
        .data(format!("{id}\n{}", html.0))
}

fn end() -> Event {
    Event::default().event("end").data("")
}

fn sse(stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Whether the session's token is still live.
async fn live<B: Backend>(console: &Console<B>, session: &Session) -> bool {
    match console.app.service.token(&session.secret_hash).await {
        Ok(Some(row)) => row
            .expires_at
            .is_none_or(|at| crate::clock::now_seconds() < at),
        Ok(None) => false,
        // The database did not answer: the stream waits for the next step.
        Err(_) => true,
    }
}

fn problem(text: &str, detail: &str) -> Markup {
    html! { p { (badge(Tone::Unknown, text)) " " (detail) } }
}

/// `GET …/agents/{agent}/events`: the Agent's status block whenever it changes, and its
/// runtime as the target reports it (or that it did not answer).
pub(crate) async fn agent_events<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, agent)): Path<(String, String)>,
) -> PageResult {
    console.app.service.agent(&ns, &agent).await?;
    let stream = async_stream(move |tx| async move {
        let mut last = String::new();
        let mut step: u32 = 0;
        let runtime_every = 5;
        loop {
            if !live(&console, &session).await {
                let _ = tx.send(end()).await;
                return;
            }
            match agent_status(&console, &ns, &agent).await {
                Ok(m) => {
                    if m.0 != last {
                        last = m.0.clone();
                        if tx.send(event("replace", "status", &m)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(ServiceError::NotFound { .. }) => {
                    let gone = problem("gone", "This Agent no longer exists.");
                    let _ = tx.send(event("replace", "status", &gone)).await;
                    let _ = tx.send(end()).await;
                    return;
                }
                Err(e) => {
                    let m = problem("unknown", &format!("the state store did not answer: {e}"));
                    if tx.send(event("replace", "status", &m)).await.is_err() {
                        return;
                    }
                }
            }
            if step.is_multiple_of(runtime_every) {
                let asked = crate::clock::now_seconds();
                let answer = tokio::time::timeout(
                    console.settings.target_timeout,
                    console
                        .app
                        .service
                        .agent_runtime(&*console.app.backend, &ns, &agent),
                )
                .await;
                let m = match answer {
                    Ok(Ok(r)) => runtime_fragment(&r, asked),
                    Ok(Err(e)) => {
                        let e = crate::api::runtime::call_error(e);
                        html! { p { (badge(Tone::Bad, "no answer")) " " code { (e.code()) } " " (e.message()) " (" (time(asked)) ")" } }
                    }
                    Err(_) => {
                        html! { p { (badge(Tone::Bad, "unreachable")) " the target did not answer within "
                        (console.settings.target_timeout.as_secs()) " s (" (time(asked)) ")" } }
                    }
                };
                if tx.send(event("replace", "runtime", &m)).await.is_err() {
                    return;
                }
            }
            step = step.wrapping_add(1);
            tokio::time::sleep(console.settings.status_interval).await;
        }
    });
    Ok(sse(stream))
}

fn lines(entries: &[clawfleet_protocol::runtime::LogEntry]) -> Markup {
    html! { @for e in entries { li { time { (e.at) } (e.message) } } }
}

/// `GET …/agents/{agent}/logs`: the newest 100 lines, then every new line (redacted by the
/// target, as the API's log route; audited once as a follow).
pub(crate) async fn agent_logs<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, agent)): Path<(String, String)>,
) -> PageResult {
    console.app.service.agent(&ns, &agent).await?;
    let stream = async_stream(move |tx| async move {
        let mut cursor: Option<String> = None;
        loop {
            if !live(&console, &session).await {
                let _ = tx.send(end()).await;
                return;
            }
            let query = LogsQuery {
                tail_lines: if cursor.is_none() { Some(100) } else { None },
                cursor: cursor.clone(),
                follow: Some(true),
                ..LogsQuery::default()
            };
            let answer = tokio::time::timeout(
                console.settings.target_timeout,
                console.app.service.agent_logs(
                    &*console.app.backend,
                    &session.caller.token_id,
                    &ns,
                    &agent,
                    &query,
                ),
            )
            .await;
            let sent = match answer {
                Ok(Ok(page)) => {
                    if let Some(c) = &page.cursor {
                        cursor = Some(c.as_str().to_owned());
                    }
                    if page.entries.is_empty() {
                        true
                    } else {
                        tx.send(event("append", "log", &lines(&page.entries)))
                            .await
                            .is_ok()
                    }
                }
                Ok(Err(e)) => {
                    let e = crate::api::runtime::call_error(e);
                    let m = html! { li.error { "log read failed: " code { (e.code()) } " " (e.message()) } };
                    tx.send(event("append", "log", &m)).await.is_ok()
                }
                Err(_) => {
                    let m = html! { li.error { "the target did not answer within " (console.settings.target_timeout.as_secs()) " s; retrying" } };
                    tx.send(event("append", "log", &m)).await.is_ok()
                }
            };
            if !sent {
                return;
            }
            tokio::time::sleep(console.settings.log_interval).await;
        }
    });
    Ok(sse(stream))
}

/// `GET …/rollouts/{rollout}/events`: the rollout's block whenever it changes; the stream
/// ends once the rollout is over.
pub(crate) async fn rollout_events<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, id)): Path<(String, String)>,
) -> PageResult {
    let id = rollout_id(&id)?;
    console.app.service.rollout(&ns, id).await?;
    let stream = async_stream(move |tx| async move {
        let mut last = String::new();
        loop {
            if !live(&console, &session).await {
                let _ = tx.send(end()).await;
                return;
            }
            match console.app.service.rollout(&ns, id).await {
                Ok(r) => {
                    let m = rollout_fragment(&session, &ns, &r);
                    if m.0 != last {
                        last = m.0.clone();
                        if tx.send(event("replace", "rollout", &m)).await.is_err() {
                            return;
                        }
                    }
                    if !r.state.is_open() {
                        let _ = tx.send(end()).await;
                        return;
                    }
                }
                Err(e) => {
                    let m = problem("unknown", &format!("the state store did not answer: {e}"));
                    if tx.send(event("replace", "rollout", &m)).await.is_err() {
                        return;
                    }
                }
            }
            tokio::time::sleep(console.settings.status_interval).await;
        }
    });
    Ok(sse(stream))
}

/// A stream fed by a task: the task ends when the client goes (its sends fail).
fn async_stream<F, Fut>(producer: F) -> impl Stream<Item = Result<Event, Infallible>> + Send
where
    F: FnOnce(tokio::sync::mpsc::Sender<Event>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(16);
    tokio::spawn(producer(tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
    )
}
