//! The console's pages, and the fragments the live streams replace in them. Every value is
//! interpolated by maud, which escapes it: a name, a configuration, a log line or an error
//! message holding markup is shown as text.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use maud::{Markup, html};
use serde::Deserialize;

use super::Console;
use super::auth::Session;
use super::page::{PageResult, Tone, badge, csrf_field, layout, ok, time};
use super::state::{Reach, Seen, by_agent, reach, seen};
use crate::backend::Backend;
use crate::model::{
    Agent, AuditEvent, DriftRow, DriftState, Namespace, Revision, RevisionStatus, Role, Rollout,
    RolloutAgentState, RolloutState,
};
use crate::service::page::PageQuery;
use crate::service::{AuditQuery, DriftQuery};

/// Rows in one page of a console list.
pub(crate) const PAGE_ROWS: u32 = 100;
/// Hosts the overview lists by name (those not reachable); the hosts page lists all.
const OVERVIEW_HOSTS: usize = 50;
/// Namespaces the overview lists.
const OVERVIEW_NAMESPACES: usize = 200;

impl<B: Backend> Console<B> {
    /// Seconds after which a drift finding is no longer an observation.
    pub(crate) fn stale_after(&self) -> i64 {
        self.settings.stale_after.as_secs() as i64
    }
}

fn agent_href(ns: &str, agent: &str) -> String {
    format!("/console/namespaces/{ns}/agents/{agent}")
}

fn seen_badge(s: Seen, row: Option<&DriftRow>) -> Markup {
    html! {
        (badge(s.tone(), s.as_str()))
        @if let Some(r) = row {
            @if let Some(reason) = r.reason { " " span.muted { (reason.as_str()) } }
        }
    }
}

fn reach_badge(r: Reach) -> Markup {
    html! {
        (badge(r.tone(), r.as_str()))
        @match r {
            Reach::Reachable(at) | Reach::Unreachable(at) => { " " span.muted { "at " (time(at)) } }
            Reach::Unknown => { " " span.muted { "no recent sweep asked it" } }
        }
    }
}

/// `GET /console`: the fleet at a glance, limited to what the token may read.
pub(crate) async fn overview<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
) -> PageResult {
    let service = &console.app.service;
    let caller = &session.caller;
    let now = crate::clock::now_seconds();
    let stale = console.stale_after();
    let namespaces = service
        .namespaces(|n| caller.may(&n.id, Role::Read))
        .await?;
    let drift = service.drift(&DriftQuery::default()).await?;
    let findings = by_agent(&drift);
    let mut totals: BTreeMap<Seen, usize> = BTreeMap::new();
    let mut per_ns: Vec<(&Namespace, usize, BTreeMap<Seen, usize>)> = Vec::new();
    for ns in &namespaces {
        let agents = service.agents(&ns.id).await?;
        let mut counts = BTreeMap::new();
        for a in &agents {
            let s = seen(
                a,
                findings.get(&(ns.id.as_str(), a.id.as_str())).copied(),
                now,
                stale,
            );
            *counts.entry(s).or_insert(0) += 1;
            *totals.entry(s).or_insert(0) += 1;
        }
        per_ns.push((ns, agents.len(), counts));
    }
    let mut drift_counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in drift
        .iter()
        .filter(|r| !r.namespace_id.is_empty() && caller.may(&r.namespace_id, Role::Read))
    {
        *drift_counts.entry(r.state.as_str()).or_insert(0) += 1;
    }
    let admin = caller.is_global(Role::Admin);
    let targets = if admin {
        let hosts = service.hosts().await?;
        let clusters = service.clusters().await?;
        let reach = reach(&drift, now, stale);
        let of = |name: &str| reach.get(name).copied().unwrap_or(Reach::Unknown);
        let mut by_reach: BTreeMap<&str, usize> = BTreeMap::new();
        let mut by_isolation: BTreeMap<String, usize> = BTreeMap::new();
        let mut troubled = Vec::new();
        for h in &hosts {
            let r = of(h.name.as_str());
            *by_reach.entry(r.as_str()).or_insert(0) += 1;
            *by_isolation
                .entry(isolation(h.last_probe.as_ref()))
                .or_insert(0) += 1;
            if !matches!(r, Reach::Reachable(_)) {
                troubled.push((h, r));
            }
        }
        Some(html! {
            h2 { "Targets" }
            div.cards {
                div.card { b { (hosts.len()) } "hosts enrolled" }
                @for (k, n) in &by_reach { div.card { b { (n) } "hosts " (k) } }
                div.card { b { (clusters.len()) } "clusters" }
            }
            h3 { "Host network isolation (last probe)" }
            ul { @for (k, n) in &by_isolation { li { (n) " × " (k) } } }
            @if !troubled.is_empty() {
                h3 { "Hosts not observed reachable" }
                div.scroll { table {
                    thead { tr { th { "Host" } th { "Address" } th { "Reachability" } } }
                    tbody { @for (h, r) in troubled.iter().take(OVERVIEW_HOSTS) {
                        tr { td { (h.name.as_str()) } td { (h.address) ":" (h.port) } td { (reach_badge(*r)) } }
                    } }
                } }
                @if troubled.len() > OVERVIEW_HOSTS {
                    p { (troubled.len() - OVERVIEW_HOSTS) " more: " a href="/console/hosts" { "all hosts" } }
                }
            }
            @if !clusters.is_empty() {
                h3 { "Clusters" }
                div.scroll { table {
                    thead { tr { th { "Cluster" } th { "Server" } th { "Reachability" } } }
                    tbody { @for c in &clusters {
                        tr { td { (c.name) } td { (c.server) } td { (reach_badge(of(&c.name))) } }
                    } }
                } }
            }
        })
    } else {
        None
    };
    let total: usize = per_ns.iter().map(|(_, n, _)| n).sum();
    ok(layout(
        &session,
        "Fleet overview",
        html! {
            p.muted { "States are what the last drift sweep observed at each target; an Agent not observed within "
                (stale) " s is unknown. Generated " (time(now)) " UTC." }
            h2 { "Agents by observed state" }
            div.cards {
                div.card { b { (total) } "Agents" }
                @for s in Seen::ALL {
                    div.card { b { (totals.get(s).copied().unwrap_or(0)) } (badge(s.tone(), s.as_str())) }
                }
            }
            h2 { "Drift findings" }
            div.cards {
                @for s in DriftState::ALL {
                    div.card { b { (drift_counts.get(s.as_str()).copied().unwrap_or(0)) } (s.as_str()) }
                }
            }
            @if let Some(t) = targets { (t) }
            h2 { "Namespaces" }
            @if per_ns.is_empty() { p { "This token may read no Namespace." } } @else {
                div.scroll { table {
                    thead { tr { th { "Namespace" } th { "Placement" } th { "Ready" } th { "Agents" } th { "Observed" } } }
                    tbody { @for (ns, n, counts) in per_ns.iter().take(OVERVIEW_NAMESPACES) {
                        tr {
                            td { a href={ "/console/namespaces/" (ns.id) } { (ns.name) } }
                            td { @if let Some(c) = &ns.cluster { "cluster " (c) } @else { (ns.hosts.len()) " hosts" } }
                            td { @if ns.deleting { (badge(Tone::Wait, "deleting")) }
                                 @else if ns.ready { (badge(Tone::Ok, "ready")) }
                                 @else { (badge(Tone::Wait, "waiting")) } }
                            td { (n) }
                            td { @for (s, k) in counts {
                                a href={ "/console/namespaces/" (ns.id) "?state=" (s.as_str()) } { (badge(s.tone(), &format!("{k} {}", s.as_str()))) } " "
                            } }
                        }
                    } }
                } }
                @if per_ns.len() > OVERVIEW_NAMESPACES { p { (per_ns.len() - OVERVIEW_NAMESPACES) " more Namespaces not listed." } }
            }
        },
    ))
}

/// A host's network isolation from its last probe.
fn isolation(probe: Option<&serde_json::Value>) -> String {
    match probe {
        None => "not probed".into(),
        Some(p) => p["networkIsolation"]
            .as_str()
            .map_or_else(|| "not reported".into(), str::to_owned),
    }
}

/// A Namespace page's query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamespaceQuery {
    /// Only Agents in this observed state.
    state: Option<String>,
    /// Continue after this Agent id.
    after: Option<String>,
}

/// `GET /console/namespaces/{ns}`.
pub(crate) async fn namespace<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path(ns): Path<String>,
    Query(q): Query<NamespaceQuery>,
) -> PageResult {
    let service = &console.app.service;
    let now = crate::clock::now_seconds();
    let stale = console.stale_after();
    let namespace = service.namespace(&ns).await?;
    let filter = match q.state.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(Seen::parse(s).ok_or_else(|| super::page::ConsoleError {
            status: axum::http::StatusCode::BAD_REQUEST,
            code: crate::codes::Code::InvalidQuery.as_str(),
            message: format!(
                "state: {s:?} is not one of {}",
                Seen::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ),
        })?),
    };
    let drift = service.drift(&DriftQuery::default()).await?;
    let findings = by_agent(&drift);
    let judge = |a: &Agent| {
        seen(
            a,
            findings.get(&(ns.as_str(), a.id.as_str())).copied(),
            now,
            stale,
        )
    };
    let (agents, more): (Vec<Agent>, bool) = match filter {
        None => {
            // The service's own page, continued after the last id shown.
            let cursor = q
                .after
                .as_deref()
                .map(|a| crate::service::page::cursor(crate::service::page::List::Agents, a));
            let page = service
                .agents_page(
                    &ns,
                    &PageQuery {
                        cursor,
                        limit: Some(PAGE_ROWS),
                    },
                )
                .await?;
            let more = page.next.is_some();
            (page.items, more)
        }
        Some(want) => {
            let mut all: Vec<Agent> = service
                .agents(&ns)
                .await?
                .into_iter()
                .filter(|a| q.after.as_deref().is_none_or(|after| a.id.as_str() > after))
                .filter(|a| judge(a) == want)
                .collect();
            all.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
            let more = all.len() > PAGE_ROWS as usize;
            all.truncate(PAGE_ROWS as usize);
            (all, more)
        }
    };
    let rollouts = service.rollouts(&ns).await?;
    let next = agents.last().filter(|_| more).map(|a| {
        let mut href = format!("/console/namespaces/{ns}?after={}", a.id);
        if let Some(s) = filter {
            href.push_str("&state=");
            href.push_str(s.as_str());
        }
        href
    });
    ok(layout(
        &session,
        &format!("Namespace {}", namespace.name),
        html! {
            dl.facts {
                dt { "Placement" } dd { @if let Some(c) = &namespace.cluster { "cluster " (c) } @else { (namespace.hosts.join(", ")) } }
                dt { "Ready" } dd { @if namespace.ready { (badge(Tone::Ok, "ready")) } @else { (badge(Tone::Wait, "waiting")) }
                    @if namespace.cluster.is_none() { " " span.muted { (namespace.ready_hosts.len()) " of " (namespace.hosts.len()) " hosts ready" } } }
            }
            h2 { "Agents" }
            form.filters method="get" action={ "/console/namespaces/" (ns) } {
                div { label for="state" { "Observed state" }
                    select id="state" name="state" {
                        option value="" selected[filter.is_none()] { "any" }
                        @for s in Seen::ALL { option value=(s.as_str()) selected[filter == Some(*s)] { (s.as_str()) } }
                    } }
                button type="submit" { "Filter" }
            }
            @if agents.is_empty() { p { "No Agents" @if filter.is_some() { " in this state" } "." } } @else {
                div.scroll { table {
                    thead { tr { th { "Agent" } th { "Desired" } th { "Observed" } th { "Target" } th { "Active revision" } th { "Served revision" } } }
                    tbody { @for a in &agents {
                        @let row = findings.get(&(ns.as_str(), a.id.as_str())).copied();
                        tr {
                            td { a href=(agent_href(&ns, &a.id)) { (a.id) } }
                            td { (a.desired_state.as_str()) }
                            td { (seen_badge(judge(a), row)) }
                            td { (a.host.as_deref().unwrap_or("not placed")) }
                            td { (a.active_revision_id.as_deref().map(|s| s as &str).unwrap_or("none")) }
                            td { (a.served_revision_id.as_deref().map(|s| s as &str).unwrap_or("none reported")) }
                        }
                    } }
                } }
            }
            @if let Some(href) = next { p { a href=(href) rel="next" { "Next " (PAGE_ROWS) " Agents" } } }
            h2 { "Rollouts" }
            @if rollouts.is_empty() { p { "No rollouts." } } @else { (rollout_list(&ns, &rollouts)) }
        },
    ))
}

fn rollout_tone(r: &Rollout) -> (Tone, String) {
    let failures = r.failures();
    match r.state {
        RolloutState::Running | RolloutState::Paused | RolloutState::Waiting => {
            (Tone::Wait, r.state.as_str().to_owned())
        }
        RolloutState::Halted => (Tone::Bad, "halted".into()),
        RolloutState::Aborted => (Tone::Unknown, "aborted".into()),
        RolloutState::Done if failures == 0 => (Tone::Ok, "done".into()),
        RolloutState::Done => (Tone::Bad, format!("done, {failures} failed")),
    }
}

fn subject(r: &Rollout) -> String {
    match (&r.configuration_id, r.configuration_generation, &r.secret) {
        (_, _, Some(s)) => format!("secret {} v{}", s.name.as_str(), s.version),
        (Some(c), Some(g), None) => format!("configuration {c} generation {g}"),
        (Some(c), None, None) => format!("configuration {c}"),
        (None, _, None) => "unknown subject".into(),
    }
}

fn rollout_list(ns: &str, rollouts: &[Rollout]) -> Markup {
    html! {
        div.scroll { table {
            thead { tr { th { "Rollout" } th { "State" } th { "Subject" } th { "Wave" } th { "Failures" } th { "Created" } } }
            tbody { @for r in rollouts {
                @let (tone, text) = rollout_tone(r);
                tr {
                    td { a href={ "/console/namespaces/" (ns) "/rollouts/" (r.id) } { "#" (r.id) } }
                    td { (badge(tone, &text)) }
                    td { (subject(r)) }
                    td { (r.wave) " of " (r.waves) }
                    td { (r.failures()) " of at most " (r.max_failures) }
                    td { (time(r.created_at)) " by " (r.created_by) }
                }
            } }
        } }
    }
}

fn revision_tone(r: &Revision, served: Option<&str>) -> (Tone, String) {
    match r.status {
        RevisionStatus::Active if served == Some(r.id.as_str()) => {
            (Tone::Ok, "active, served".into())
        }
        RevisionStatus::Active => (Tone::Wait, "active, not reported served".into()),
        RevisionStatus::Failed => (Tone::Bad, "failed".into()),
        RevisionStatus::Activating | RevisionStatus::Pending | RevisionStatus::Prepared => {
            (Tone::Wait, r.status.as_str().into())
        }
        _ => (Tone::Unknown, r.status.as_str().into()),
    }
}

/// An Agent's live status block (replaced by the Agent's event stream).
pub(crate) async fn agent_status<B: Backend>(
    console: &Console<B>,
    ns: &str,
    agent: &str,
) -> Result<Markup, crate::service::ServiceError> {
    let service = &console.app.service;
    let now = crate::clock::now_seconds();
    let a = service.agent(ns, agent).await?;
    let status = service.deployment_status(ns, agent).await?;
    let drift = service.drift(&DriftQuery::default()).await?;
    let row = drift
        .iter()
        .find(|r| r.namespace_id == ns && r.agent_id == agent);
    let observed = seen(&a, row, now, console.stale_after());
    let served = a.served_revision_id.as_deref().map(|s| s as &str);
    let mut revisions = status.revisions.clone();
    revisions.sort_by_key(|r| std::cmp::Reverse(r.number));
    let evidence: Vec<&Revision> = revisions
        .iter()
        .filter(|r| r.status == RevisionStatus::Failed || r.runtime_failure.is_some())
        .take(3)
        .collect();
    let active = revisions
        .iter()
        .find(|r| Some(r.id.as_str()) == a.active_revision_id.as_deref().map(|s| s as &str));
    // Open work first, then the newest; an open item is among the newest too.
    let mut work: Vec<&crate::model::WorkRecord> = status.open_work.iter().collect();
    for w in &status.recent_work {
        if !work.iter().any(|o| o.id == w.id) {
            work.push(w);
        }
    }
    Ok(html! {
        dl.facts {
            dt { "Observed" } dd { (seen_badge(observed, row))
                @if let Some(r) = row { " " span.muted { (r.message) " (" (time(r.checked_at)) ")" } } }
            dt { "Desired" } dd { (a.desired_state.as_str()) }
            dt { "Deployment" } dd {
                @if status.converged && observed == Seen::Running { (badge(Tone::Ok, "converged")) }
                @else if status.converged { (badge(Tone::Unknown, "work done")) " " span.muted { "not observed running now" } }
                @else if !status.open_work.is_empty() { (badge(Tone::Wait, "converging")) }
                @else { (badge(Tone::Bad, "not converged")) }
                @if let Some(c) = &status.last_code { " " span.muted { "last code " code { (c) } } }
            }
            dt { "Target" } dd { (a.host.as_deref().unwrap_or("not placed")) @if let Some(p) = a.port { " port " (p) } }
            dt { "Active revision" } dd { (a.active_revision_id.as_deref().map(|s| s as &str).unwrap_or("none")) }
            dt { "Served revision" } dd { (served.unwrap_or("none reported by the target")) }
            dt { "Egress" } dd { @match &a.egress {
                Some(e) => { (e.to_string()) " " span.muted { "(its own, within the target's policy)" } }
                None => { "the target's policy" }
            } }
        }
        @if !evidence.is_empty() {
            h2 { "Failure evidence" }
            @for r in &evidence { (failure(r, served)) }
        }
        h2 { "Work" }
        div.scroll { table {
            thead { tr { th { "Work" } th { "Kind" } th { "State" } th { "Attempts" } th { "Last attempt" } } }
            tbody { @for w in work.iter().take(10) {
                tr {
                    td { (w.id) } td.nowrap { (w.kind.as_str()) }
                    td { @match w.state {
                        crate::model::WorkState::Queued | crate::model::WorkState::Running => { (badge(Tone::Wait, w.state.as_str())) }
                        crate::model::WorkState::Failed => { (badge(Tone::Bad, "failed")) }
                        crate::model::WorkState::Done => { (badge(Tone::Unknown, "done")) }
                    } }
                    td { (w.attempts) }
                    td { @if let Some(l) = &w.last_attempt { code { (l.code) } " " (l.message) } }
                }
            } }
        } }
        h2 { "Revisions" }
        div.scroll { table {
            thead { tr { th { "#" } th { "Revision" } th { "Status" } th { "Configuration" } th { "Created" } } }
            tbody { @for r in revisions.iter().take(20) {
                @let (tone, text) = revision_tone(r, served);
                tr {
                    td { (r.number) } td { (r.id) } td { (badge(tone, &text)) }
                    td { (r.configuration_id) " gen " (r.configuration_generation) }
                    td { (time(r.created_at)) }
                }
            } }
        } }
        h2 { "Secrets bound by the active revision" }
        @match active {
            Some(r) if !r.secrets.is_empty() => {
                ul { @for s in &r.secrets { li { (s.name.as_str()) " version " (s.version) " " span.muted { (s.fingerprint.as_str()) } } } }
            }
            Some(_) => { p { "None." } }
            None => { p { "No active revision." } }
        }
    })
}

fn failure(r: &Revision, served: Option<&str>) -> Markup {
    let (tone, text) = revision_tone(r, served);
    html! {
        section.card aria-label={ "Revision " (r.number) " evidence" } {
            p { strong { "Revision " (r.number) " (" (r.id) ")" } " " (badge(tone, &text)) }
            @if let Some(l) = &r.last_attempt {
                p { "Last attempt " (time(l.at)) ", " (l.attempts) " attempts: " code { (l.code) } " " (l.message) }
            }
            @if let Some(f) = &r.runtime_failure {
                p { "Check " code { (f.check) } " of " (f.component) " at " (time(f.checked_at)) ": " code { (f.code) } " " (f.message) }
                p.muted {
                    @if let Some(s) = &f.active_state { "state " (s) }
                    @if let Some(s) = &f.sub_state { "/" (s) }
                    @if let Some(n) = f.restarts { ", " (n) " restarts" }
                    @if let Some(e) = &f.last_exit { ", last exit " (format!("{:?}", e.kind).to_lowercase()) " " (e.status) @if let Some(r) = &e.reason { " (" (r) ")" } }
                }
                @if !f.events.is_empty() {
                    ul { @for e in &f.events { li { (e.at) " " (e.kind) " " (e.reason) ": " (e.message) } } }
                }
                @if !f.last_lines.is_empty() {
                    ol.log aria-label="Last log lines" { @for l in &f.last_lines { li { time { (l.at) } (l.message) } } }
                }
            }
        }
    }
}

/// `GET /console/namespaces/{ns}/agents/{agent}`.
pub(crate) async fn agent<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, agent)): Path<(String, String)>,
) -> PageResult {
    let a = console.app.service.agent(&ns, &agent).await?;
    let status = agent_status(&console, &ns, &agent).await?;
    let configuration = console
        .app
        .service
        .configuration(&ns, &a.configuration_id)
        .await?;
    let caller = &session.caller;
    let base = agent_href(&ns, &agent);
    ok(layout(
        &session,
        &format!("Agent {}/{}", ns, a.id),
        html! {
            p { a href={ "/console/namespaces/" (ns) } { "Namespace " (ns) } }
            div.actions {
                @if caller.may(&ns, Role::Deploy) {
                    form method="post" action={ (base) "/deploy" } { (csrf_field(&session)) button.primary type="submit" { "Deploy…" } }
                }
                @if caller.may(&ns, Role::Operate) {
                    form method="post" action={ (base) "/reconcile" } { (csrf_field(&session)) button type="submit" { "Reconcile…" } }
                    form method="post" action={ (base) "/stop" } { (csrf_field(&session)) button.danger type="submit" { "Stop…" } }
                }
            }
            // The gateway route takes the console's session cookie (`api/gateway_proxy.rs`)
            // and asks for deploy in the Namespace, as the tunnel does: only then the link.
            @if caller.may(&ns, Role::Deploy) {
                p {
                    a href={ (clawfleet_api::routes::control_ui_path(&ns, &agent)) "/" } target="_blank" rel="noopener noreferrer" { "Open the Control UI" }
                    " (the gateway's own console, through this coordinator; its API is at "
                    a href={ "/namespaces/" (ns) "/agents/" (agent) "/gateway/" } target="_blank" rel="noopener noreferrer" { code { "…/gateway/" } }
                    "), or "
                    code { "occ agent connect " (ns) " " (agent) } " for a local port."
                }
            }
            p.live { "Status: " span id="status-live" { "as served" } }
            div id="status" data-sse={ (base) "/events" } data-sse-status="status-live" { (status) }
            h2 { "Runtime" }
            div id="runtime" { p { (badge(Tone::Unknown, "not asked yet")) " The target is asked by the live stream." } }
            h2 { "Configuration" }
            p { code { (configuration.id) } " generation " (configuration.generation) ", written " (time(configuration.created_at)) }
            pre { (serde_json::to_string_pretty(&configuration.document).unwrap_or_default()) }
            h2 { "Log" }
            p.live { button type="button" hidden aria-pressed="false" aria-controls="log" data-follow={ (base) "/logs" } { "Follow log" }
                " " span id="log-live" { "not following" } }
            ol.log id="log" data-sse-status="log-live" aria-live="off" aria-label="Agent log" {}
        },
    ))
}

/// The runtime block, from the target's answer.
pub(crate) fn runtime_fragment(r: &clawfleet_api::responses::AgentRuntime, at: i64) -> Markup {
    html! {
        dl.facts {
            dt { "Asked" } dd { (r.target) " at " (time(at)) }
            @match &r.workload {
                Some(w) => {
                    dt { "Unit" } dd { (w.name) }
                    dt { "State" } dd {
                        @if w.active_state == "active" || w.active_state == "Running" { (badge(Tone::Ok, &format!("{}/{}", w.active_state, w.sub_state))) }
                        @else if w.active_state == "activating" || w.active_state == "Pending" { (badge(Tone::Wait, &format!("{}/{}", w.active_state, w.sub_state))) }
                        @else { (badge(Tone::Bad, &format!("{}/{}", w.active_state, w.sub_state))) }
                    }
                    dt { "Restarts" } dd { (w.restarts) }
                    @if let Some(s) = &w.started_at { dt { "Started" } dd { (s) } }
                    @if let Some(m) = w.memory_current_bytes { dt { "Memory" } dd { (m / 1024 / 1024) " MiB" } }
                }
                None => { dt { "Unit" } dd { (badge(Tone::Unknown, "none loaded")) } }
            }
            dt { "Served (target)" } dd { (r.observation.served.as_ref().map(|s| s.as_str()).unwrap_or("none")) }
        }
    }
}

/// A rollout's live block (replaced by its event stream).
pub(crate) fn rollout_fragment(session: &Session, ns: &str, r: &Rollout) -> Markup {
    let (tone, text) = rollout_tone(r);
    let may = session.caller.may(ns, Role::Deploy);
    let actions: &[&str] = match r.state {
        RolloutState::Running => &["pause", "abort"],
        RolloutState::Paused => &["resume", "abort"],
        RolloutState::Waiting => &["promote", "pause", "abort"],
        _ => &[],
    };
    let mut waves: BTreeMap<u32, Vec<&crate::model::RolloutAgent>> = BTreeMap::new();
    for a in &r.agents {
        waves.entry(a.wave).or_default().push(a);
    }
    html! {
        dl.facts {
            dt { "State" } dd { (badge(tone, &text)) @if let Some(m) = &r.message { " " (m) } }
            dt { "Subject" } dd { (subject(r)) }
            dt { "Wave" } dd { (r.wave) " of " (r.waves) @if r.canary > 0 { " (wave 0 is the canary of " (r.canary) ")" } }
            dt { "Failures" } dd { (r.failures()) " of at most " (r.max_failures) }
            @if let Some(t) = r.next_wave_at { dt { "Next wave" } dd { (time(t)) } }
        }
        @if may && !actions.is_empty() {
            div.actions { @for act in actions {
                form method="post" action={ "/console/namespaces/" (ns) "/rollouts/" (r.id) "/control" } {
                    (csrf_field(session))
                    input type="hidden" name="action" value=(act);
                    button type="submit" class=@if *act == "abort" { "danger" } @else { "" } { (act) "…" }
                }
            } }
        }
        @for (wave, agents) in &waves {
            h2 { "Wave " (wave) @if *wave == 0 && r.canary > 0 { " (canary)" } }
            div.scroll { table {
                thead { tr { th { "Agent" } th { "State" } th { "Revision" } th { "Outcome" } } }
                tbody { @for a in agents {
                    tr {
                        td { a href=(agent_href(ns, &a.agent_id)) { (a.agent_id) } }
                        td { @match a.state {
                            RolloutAgentState::Succeeded => { (badge(Tone::Ok, "succeeded")) }
                            RolloutAgentState::Failed | RolloutAgentState::Restored => { (badge(Tone::Bad, a.state.as_str())) }
                            RolloutAgentState::Pending => { (badge(Tone::Wait, "waiting")) }
                            RolloutAgentState::Deploying => { (badge(Tone::Wait, "deploying")) }
                            RolloutAgentState::Skipped => { (badge(Tone::Unknown, "skipped")) }
                        } }
                        td { (a.revision_id.as_deref().unwrap_or("")) }
                        td { @if let Some(c) = &a.code { code { (c) } " " } (a.message.as_deref().unwrap_or("")) }
                    }
                } }
            } }
        }
    }
}

/// Parses a rollout id from the path.
pub(crate) fn rollout_id(text: &str) -> Result<i64, super::page::ConsoleError> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| super::page::ConsoleError {
            status: axum::http::StatusCode::BAD_REQUEST,
            code: crate::codes::Code::InvalidIdentifier.as_str(),
            message: format!("rollout id {text:?} must be a whole number from 1"),
        })
}

/// `GET /console/namespaces/{ns}/rollouts/{rollout}`.
pub(crate) async fn rollout<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Path((ns, id)): Path<(String, String)>,
) -> PageResult {
    let id = rollout_id(&id)?;
    let r = console.app.service.rollout(&ns, id).await?;
    ok(layout(
        &session,
        &format!("Rollout #{id} in {ns}"),
        html! {
            p { a href={ "/console/namespaces/" (ns) } { "Namespace " (ns) } }
            p.live { "Progress: " span id="rollout-live" { "as served" } }
            div id="rollout" data-sse={ "/console/namespaces/" (ns) "/rollouts/" (id) "/events" } data-sse-status="rollout-live" {
                (rollout_fragment(&session, &ns, &r))
            }
        },
    ))
}

/// The hosts page's query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostsQuery {
    /// Continue after this host name.
    after: Option<String>,
}

/// `GET /console/hosts`.
pub(crate) async fn hosts<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Query(q): Query<HostsQuery>,
) -> PageResult {
    let service = &console.app.service;
    let now = crate::clock::now_seconds();
    let cursor = q
        .after
        .as_deref()
        .map(|a| crate::service::page::cursor(crate::service::page::List::Hosts, a));
    let page = service
        .hosts_page(&PageQuery {
            cursor,
            limit: Some(PAGE_ROWS),
        })
        .await?;
    let clusters = service.clusters().await?;
    let drift = service.drift(&DriftQuery::default()).await?;
    let reach = reach(&drift, now, console.stale_after());
    let of = |name: &str| reach.get(name).copied().unwrap_or(Reach::Unknown);
    let next = page
        .items
        .last()
        .filter(|_| page.next.is_some())
        .map(|h| format!("/console/hosts?after={}", h.name.as_str()));
    ok(layout(
        &session,
        "Hosts and clusters",
        html! {
            h2 { "Hosts" }
            div.scroll { table {
                thead { tr { th { "Host" } th { "Address" } th { "Reachability" } th { "Enrolled" } th { "hostd" } th { "Protocol" } th { "Fencing" } th { "Isolation" } th { "Missing tools" } th { "Probe" } } }
                tbody { @for h in &page.items {
                    @let p = h.last_probe.as_ref();
                    tr {
                        td { (h.name.as_str()) }
                        td { (h.address) ":" (h.port) br; span.muted { (h.fingerprint) } }
                        td { (reach_badge(of(h.name.as_str()))) }
                        td { (time(h.enrolled_at)) }
                        td { @match p.and_then(|p| p["hostdVersion"].as_str()) { Some(v) => { (v) } None => { (badge(Tone::Unknown, "not probed")) } } }
                        td { @if let Some(v) = p.and_then(|p| p["protocolVersions"].as_array()) {
                            (v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")) } }
                        td { (h.fencing.as_str()) }
                        td { (isolation(p)) }
                        td { @if let Some(v) = p.and_then(|p| p["missingTools"].as_array()) {
                            @if v.is_empty() { "none" } @else { (v.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", ")) } } }
                        td { form method="post" action={ "/console/hosts/" (h.name.as_str()) "/probe" } {
                            (csrf_field(&session)) button type="submit" { "Probe" } } }
                    }
                } }
            } }
            @if let Some(href) = next { p { a href=(href) rel="next" { "Next " (PAGE_ROWS) " hosts" } } }
            h2 { "Clusters" }
            @if clusters.is_empty() { p { "None registered." } } @else {
                div.scroll { table {
                    thead { tr { th { "Cluster" } th { "Server" } th { "Reachability" } th { "Registered" } } }
                    tbody { @for c in &clusters {
                        tr { td { (c.name) } td { (c.server) } td { (reach_badge(of(&c.name))) } td { (time(c.created_at)) } }
                    } }
                } }
            }
        },
    ))
}

/// The audit page's filters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditFilters {
    action: Option<String>,
    actor: Option<String>,
    target: Option<String>,
    limit: Option<u32>,
}

/// `GET /console/audit`.
pub(crate) async fn audit<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    session: Session,
    Query(f): Query<AuditFilters>,
) -> PageResult {
    let nonempty = |s: &Option<String>| {
        s.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let action = nonempty(&f.action);
    let actor = nonempty(&f.actor);
    let target = nonempty(&f.target);
    let limit = f.limit.unwrap_or(100);
    let events: Vec<AuditEvent> = console
        .app
        .service
        .audit_events(&AuditQuery {
            limit: Some(limit),
            action: action.clone(),
        })
        .await?
        .into_iter()
        .filter(|e| actor.as_deref().is_none_or(|a| e.actor == a))
        .filter(|e| target.as_deref().is_none_or(|t| e.target.contains(t)))
        .collect();
    ok(layout(
        &session,
        "Audit",
        html! {
            form.filters method="get" action="/console/audit" {
                div { label for="action" { "Action" } input id="action" name="action" value=(action.as_deref().unwrap_or("")) placeholder="agent.deploy"; }
                div { label for="actor" { "Actor (token id)" } input id="actor" name="actor" value=(actor.as_deref().unwrap_or("")); }
                div { label for="target" { "Target contains" } input id="target" name="target" value=(target.as_deref().unwrap_or("")); }
                div { label for="limit" { "Newest" } input id="limit" name="limit" type="number" min="1" max="1000" value=(limit); }
                button type="submit" { "Filter" }
            }
            p.muted { (events.len()) " events, newest first (actor and target filter the newest " (limit) ")." }
            div.scroll { table {
                thead { tr { th { "Time (UTC)" } th { "Actor" } th { "Action" } th { "Target" } th { "Detail" } } }
                tbody { @for e in &events {
                    tr { td { (time(e.at)) } td { (e.actor) } td { (e.action) } td { (e.target) }
                         td { @if !e.detail.is_null() { code { (e.detail.to_string()) } } } }
                } }
            } }
        },
    ))
}
