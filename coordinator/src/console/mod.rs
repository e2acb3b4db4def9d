//! The web console `occ serve` serves under `/console`: server-rendered HTML (maud escapes
//! every value it interpolates), live updates over server-sent events, one small
//! first-party script and one stylesheet embedded in the binary; nothing from a CDN.
//!
//! It calls the same service layer as the API (never the API over loopback), under the
//! same roles: [`PAGES`] is the one list of console routes, each with the [`Access`] rule
//! the API's route table would give it, checked by [`auth::authorize`] before the handler
//! runs; every change goes through the service, which writes its audit event with the
//! caller's token id as the actor, exactly as the API does.
//!
//! - `auth.rs`: sign-in with an API token (kept in an HttpOnly, SameSite=Strict cookie,
//!   Secure behind TLS), sign-out, the access check and the CSRF check on every POST.
//! - `views.rs`: the pages (overview, Namespace, Agent, rollouts, hosts, audit).
//! - `actions.rs`: the changes (deploy with its plan, stop, reconcile, rollout controls,
//!   probe), each shown as a plan to confirm before it is applied.
//! - `sse.rs`: the live streams (an Agent's status and runtime, its log follow, a rollout's
//!   progress).
//! - `assets.rs`: the embedded stylesheet and script.
//! - `state.rs`: what the console shows as an Agent's or a target's state, from what was
//!   observed (never green without an observation).

mod actions;
mod assets;
pub mod auth;
pub mod page;
mod sse;
mod state;
mod views;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::routing::MethodFilter;
pub use clawfleet_api::{Access, Method};

use crate::api::AppState;
use crate::backend::Backend;

/// The prefix every console route starts with.
pub const PREFIX: &str = "/console";

/// One console route: its method, path, who may use it, and what it is.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
    pub summary: &'static str,
}

/// The console's settings.
#[derive(Debug, Clone)]
pub struct ConsoleSettings {
    /// Mark the session cookie `Secure` on every answer (the listener is off loopback, so a
    /// TLS proxy is in front); otherwise only when the request says it came over HTTPS
    /// (`X-Forwarded-Proto: https`).
    pub secure_cookie: bool,
    /// How often a status or rollout stream looks for a change.
    pub status_interval: Duration,
    /// How often a log follow asks the target for new lines.
    pub log_interval: Duration,
    /// How long a stream waits for a target's runtime or log answer.
    pub target_timeout: Duration,
    /// How old a drift finding may be and still count as an observation (three drift
    /// intervals in `occ serve`): an older one shows its Agent as unknown.
    pub stale_after: Duration,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        ConsoleSettings {
            secure_cookie: false,
            status_interval: Duration::from_secs(1),
            log_interval: Duration::from_secs(2),
            target_timeout: Duration::from_secs(5),
            stale_after: Duration::from_secs(180),
        }
    }
}

/// The console's shared state: the API's (its service and backend) and the settings.
pub struct Console<B: Backend> {
    pub app: Arc<AppState<B>>,
    pub settings: ConsoleSettings,
}

impl<B: Backend> std::fmt::Debug for Console<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

/// The console's routes: the one list, from which [`PAGES`] and the router are built.
macro_rules! console_routes {
    ($callback:ident) => {
        $callback! {
            Get "/console", Token => views::overview, "Fleet overview: targets, Namespaces, Agents by observed state, drift";
            Get "/console/sign-in", Public => auth::sign_in_page, "The sign-in form";
            Post "/console/sign-in", Public => auth::sign_in, "Sign in with an API token";
            Post "/console/sign-out", Token => auth::sign_out, "Sign out";
            Get "/console/assets/{name}", Public => assets::asset, "The embedded stylesheet and script";
            Get "/console/namespaces/{ns}", Namespace(Read) => views::namespace, "A Namespace: its Agents (filtered by state, paginated) and rollouts";
            Get "/console/namespaces/{ns}/agents/{agent}", Namespace(Read) => views::agent, "An Agent: deployment status, evidence, revisions, runtime, drift, secrets, log";
            Get "/console/namespaces/{ns}/agents/{agent}/events", Namespace(Read) => sse::agent_events, "An Agent's status and runtime, live (server-sent events)";
            Get "/console/namespaces/{ns}/agents/{agent}/logs", Namespace(Read) => sse::agent_logs, "An Agent's log, followed (server-sent events; audited as a follow)";
            Post "/console/namespaces/{ns}/agents/{agent}/deploy", Namespace(Deploy) => actions::deploy, "Plan a deploy, then apply that plan";
            Post "/console/namespaces/{ns}/agents/{agent}/stop", Namespace(Operate) => actions::stop, "Stop an Agent (after confirming)";
            Post "/console/namespaces/{ns}/agents/{agent}/reconcile", Namespace(Operate) => actions::reconcile, "Re-apply the active revision (after confirming)";
            Get "/console/namespaces/{ns}/rollouts/{rollout}", Namespace(Read) => views::rollout, "A rollout: every Agent's wave and state";
            Get "/console/namespaces/{ns}/rollouts/{rollout}/events", Namespace(Read) => sse::rollout_events, "A rollout's progress, live (server-sent events)";
            Post "/console/namespaces/{ns}/rollouts/{rollout}/control", Namespace(Deploy) => actions::rollout_control, "Pause, resume, promote or abort a rollout (after confirming)";
            Get "/console/hosts", Global(Admin) => views::hosts, "Hosts and clusters: enrolment, reachability, probe, protocol, isolation";
            Post "/console/hosts/{host}/probe", Global(Admin) => actions::probe, "Probe a host over SSH";
            Get "/console/audit", Global(Admin) => views::audit, "The audit log, filtered";
        }
    };
}

macro_rules! pages {
    ($( $method:ident $path:literal, $access:ident $(($role:ident))? => $module:ident :: $handler:ident, $summary:literal; )*) => {
        /// Every console route (the one list; the router is built from the same rows).
        pub const PAGES: &[Page] = &[$(Page {
            method: Method::$method,
            path: $path,
            access: Access::$access $((clawfleet_api::Role::$role))?,
            summary: $summary,
        },)*];

        fn add_pages<B: Backend>(
            mut router: Router<Arc<Console<B>>>,
            console: &Arc<Console<B>>,
        ) -> Router<Arc<Console<B>>> {
            $(
                router = router.route(
                    $path,
                    axum::routing::on(filter(Method::$method), $module::$handler::<B>)
                        .route_layer(axum::middleware::from_fn_with_state(
                            (console.clone(), Access::$access $((clawfleet_api::Role::$role))?, Method::$method),
                            auth::authorize::<B>,
                        )),
                );
            )*
            router
        }
    };
}

console_routes!(pages);

fn filter(method: Method) -> MethodFilter {
    match method {
        Method::Get => MethodFilter::GET,
        Method::Post => MethodFilter::POST,
        Method::Put => MethodFilter::PUT,
        Method::Patch => MethodFilter::PATCH,
        Method::Delete => MethodFilter::DELETE,
    }
}

/// The console's router, to merge with the API's (`occ serve`).
pub fn router<B: Backend>(app: Arc<AppState<B>>, settings: ConsoleSettings) -> Router {
    let console = Arc::new(Console { app, settings });
    add_pages(Router::new(), &console)
        .with_state(console)
        .layer(axum::middleware::map_response(headers))
        .layer(axum::extract::DefaultBodyLimit::max(auth::MAX_FORM))
}

/// What `occ serve` serves: the console's routes and the API's. Console requests go through
/// the API's admission with the session's token (the console its own session and CSRF
/// checks after it), so a token's concurrency and rate limits count its console requests
/// and its API requests together, and a console user cannot bypass them.
pub fn with_api<B: Backend>(
    app: Arc<AppState<B>>,
    settings: ConsoleSettings,
    api: &crate::config::ApiSettings,
) -> Router {
    let (api, admission) = crate::api::router_parts(app.clone(), api);
    crate::api::admitted(router(app.clone(), settings), app, admission)
        .layer(axum::middleware::from_fn(auth::session_as_bearer))
        .merge(api)
}

/// The content security policy of every console answer: only this origin's own script and
/// stylesheet, no inline script, no frames, forms only to this origin.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null`
    // with the console's own forms, which the origin check refuses.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_is_unique_under_the_prefix_and_its_access_fits_its_path() {
        let mut seen = std::collections::HashSet::new();
        for p in PAGES {
            assert!(seen.insert((p.method, p.path)), "{} twice", p.path);
            assert!(p.path.starts_with(PREFIX), "{}", p.path);
            if matches!(p.access, Access::Namespace(_)) {
                assert!(p.path.starts_with("/console/namespaces/{ns}"), "{}", p.path);
            }
            // A change is never open to everyone but the sign-in itself.
            if p.method == Method::Post && p.access == Access::Public {
                assert_eq!(p.path, "/console/sign-in");
            }
        }
    }
}
