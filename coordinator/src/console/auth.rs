//! Sign-in, sign-out, the access check and the CSRF check.
//!
//! The session is the API token itself, in a cookie the page's script cannot read
//! (`HttpOnly`), that no other site's request carries (`SameSite=Strict`), sent only over
//! HTTPS behind a TLS proxy (`Secure`). Its path is `/`: besides `/console` it authenticates
//! the Agents' gateway route (`/namespaces/{ns}/agents/{agent}/gateway/...`, see
//! `api/gateway_proxy.rs`, which never passes it on); every other API route ignores cookies. Every request looks the
//! token up again, so a revoked or expired token ends its session at once. Every POST but
//! the sign-in carries a CSRF token derived from the session's token (a forged form from
//! elsewhere cannot know it) and, when the browser sends an `Origin`, must come from this
//! host.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use sha2::{Digest, Sha256};

use super::page::{ConsoleError, bare};
use super::{Access, Console, Method};
use crate::api::Caller;
use crate::api::access::{caller_of_secret, check};
use crate::backend::Backend;

/// The session cookie's name.
pub use crate::api::access::SESSION_COOKIE as COOKIE;

/// The largest form the console accepts.
pub const MAX_FORM: usize = 16 * 1024;

/// The signed-in caller of a console page, and the CSRF token its forms carry.
#[derive(Debug, Clone)]
pub struct Session {
    pub caller: Caller,
    pub csrf: String,
    /// The hash of the session's token, for the streams to look it up again.
    pub secret_hash: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Session {
    type Rejection = ConsoleError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ConsoleError> {
        parts
            .extensions
            .get::<Session>()
            .cloned()
            .ok_or_else(|| ConsoleError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: crate::codes::Code::InternalError.as_str(),
                message: "this page has no session; see the coordinator log".into(),
            })
    }
}

/// The CSRF token of a session: a hash of its API token under a label of its own, so it
/// names the session without revealing the token.
pub fn csrf_of(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"clawfleet console csrf v1\0");
    h.update(token.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether two strings are equal, in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The session cookie's value in the request, if any.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    crate::api::access::session_cookie_token(headers)
}

/// Gives a console request its session's token as a bearer token, for the API's admission to
/// charge it to that token (`with_api`). A request that names a bearer token itself keeps it.
pub(crate) async fn session_as_bearer(mut request: Request, next: Next) -> Response {
    if !request.headers().contains_key(header::AUTHORIZATION)
        && let Some(token) = cookie_token(request.headers())
        && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
    {
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    next.run(request).await
}

/// A field of a URL-encoded form (the first of its name), if the form parses.
pub(crate) fn form_field(body: &[u8], name: &str) -> Option<String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// Whether the session cookie is marked `Secure` for this request.
fn secure<B: Backend>(console: &Console<B>, headers: &HeaderMap) -> bool {
    console.settings.secure_cookie
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The `Set-Cookie` value of a session (`token`), or of its end (`None`).
pub fn cookie(token: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match token {
        Some(t) => format!("{COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict{secure}"),
        None => format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
}

/// Clears a session cookie of an earlier release (scoped to `/console`), which would
/// otherwise shadow the current one on console pages.
fn clear_legacy_cookie(r: &mut Response) {
    r.headers_mut().append(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "occ_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
}

fn refused(status: StatusCode, code: crate::codes::Code, message: impl Into<String>) -> Response {
    ConsoleError {
        status,
        code: code.as_str(),
        message: message.into(),
    }
    .into_response()
}

/// A POST must come from this host when the browser says where it comes from.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|rest| rest == host)
}

/// The layer in front of every console route: looks the session up, checks the route's
/// [`Access`] and, on a POST, the origin and the form's CSRF token; hands the handler the
/// [`Session`].
pub(crate) async fn authorize<B: Backend>(
    State((console, access, method)): State<(Arc<Console<B>>, Access, Method)>,
    params: RawPathParams,
    request: Request,
    next: Next,
) -> Response {
    use crate::codes::Code;
    if method == Method::Post && !same_origin(request.headers()) {
        return refused(
            StatusCode::FORBIDDEN,
            Code::Forbidden,
            "this form was sent from another site (its Origin is not this host); nothing was changed",
        );
    }
    if access == Access::Public {
        return next.run(request).await;
    }
    let signed_out = |message: &str| -> Response {
        if method == Method::Get {
            let mut r = Redirect::to("/console/sign-in").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie(None, false)) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            clear_legacy_cookie(&mut r);
            r
        } else {
            refused(StatusCode::UNAUTHORIZED, Code::Unauthenticated, message)
        }
    };
    let Some(token) = cookie_token(request.headers()) else {
        return signed_out("sign in first: this request carries no console session");
    };
    let caller = match caller_of_secret(&console.app, &token, crate::clock::now_seconds()).await {
        Ok(c) => c,
        Err(e) if e.status() == StatusCode::UNAUTHORIZED => return signed_out(e.message()),
        Err(e) => return ConsoleError::from(e).into_response(),
    };
    let namespace = params.iter().find(|(k, _)| *k == "ns").map(|(_, v)| v);
    if let Err(e) = check(access, &caller, namespace) {
        return ConsoleError::from(e).into_response();
    }
    let csrf = csrf_of(&token);
    let mut request = request;
    if method == Method::Post {
        let (parts, body) = request.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM).await else {
            return refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                Code::BodyTooLarge,
                format!("console forms are limited to {} KiB", MAX_FORM / 1024),
            );
        };
        let sent = form_field(&bytes, "csrf");
        if !sent.is_some_and(|s| same(&s, &csrf)) {
            tracing::warn!(token = %caller.token_id, "console form refused: CSRF token missing or wrong");
            return refused(
                StatusCode::FORBIDDEN,
                Code::Forbidden,
                "this form's CSRF token is missing or wrong (a form from another site, or a \
                 page from an earlier session); reload the page; nothing was changed",
            );
        }
        request = Request::from_parts(parts, Body::from(bytes));
    }
    request.extensions_mut().insert(Session {
        caller,
        csrf,
        secret_hash: crate::tokens::hash(&token),
    });
    next.run(request).await
}

fn sign_in_form(message: Option<&str>) -> String {
    bare(
        "Sign in",
        html! {
            main id="main" tabindex="-1" class="narrow" {
                h1 { "clawfleet console" }
                form method="post" action="/console/sign-in" {
                    label for="token" { "API token" }
                    input id="token" name="token" type="password" autocomplete="off" required autofocus;
                    button type="submit" { "Sign in" }
                }
                @if let Some(m) = message { p.error role="alert" { (m) } }
                p.hint { "A token from " code { "occ token create" } ". It is kept in a cookie this page's script cannot read, and only for this site." }
            }
        },
    )
    .into_string()
}

/// `GET /console/sign-in` (the state only ties the handler to its router).
pub(crate) async fn sign_in_page<B: Backend>(_: State<Arc<Console<B>>>) -> Response {
    Html(sign_in_form(None)).into_response()
}

/// `POST /console/sign-in`: a known, live token starts a session.
pub(crate) async fn sign_in<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let token = form_field(&body, "token")
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    let refuse =
        |status: StatusCode, m: &str| (status, Html(sign_in_form(Some(m)))).into_response();
    if token.is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "token: enter an API token");
    }
    // A cookie value is a token: tokens are URL-safe text, anything else is no token.
    if !token
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b';' && b != b',')
    {
        return refuse(StatusCode::UNAUTHORIZED, "token: that is not a token");
    }
    match caller_of_secret(&console.app, &token, crate::clock::now_seconds()).await {
        Ok(caller) => {
            tracing::info!(token = %caller.token_id, "console sign-in");
            let mut r = Redirect::to("/console").into_response();
            match HeaderValue::from_str(&cookie(Some(&token), secure(&console, &headers))) {
                Ok(v) => {
                    r.headers_mut().insert(header::SET_COOKIE, v);
                    clear_legacy_cookie(&mut r);
                    r
                }
                Err(_) => refuse(StatusCode::UNAUTHORIZED, "token: that is not a token"),
            }
        }
        Err(e) if e.status() == StatusCode::UNAUTHORIZED => {
            refuse(StatusCode::UNAUTHORIZED, &format!("token: {}", e.message()))
        }
        Err(e) => ConsoleError::from(e).into_response(),
    }
}

/// `POST /console/sign-out`: ends the session (the cookie is cleared).
pub(crate) async fn sign_out<B: Backend>(
    State(console): State<Arc<Console<B>>>,
    headers: HeaderMap,
) -> Response {
    let mut r = Redirect::to("/console/sign-in").into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie(None, secure(&console, &headers))) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    clear_legacy_cookie(&mut r);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_http_only_strict_and_scoped() {
        let c = cookie(Some("abc"), false);
        assert_eq!(c, "occ_console=abc; Path=/; HttpOnly; SameSite=Strict");
        assert!(cookie(Some("abc"), true).ends_with("; Secure"));
        assert!(cookie(None, false).contains("Max-Age=0"));
    }

    #[test]
    fn csrf_tokens_differ_by_session_and_compare_exactly() {
        assert_ne!(csrf_of("a"), csrf_of("b"));
        assert_eq!(csrf_of("a").len(), 64);
        assert!(same(&csrf_of("a"), &csrf_of("a")));
        assert!(!same(&csrf_of("a"), &csrf_of("a")[..63]));
    }

    #[test]
    fn origin_must_be_this_host_when_sent() {
        let mut h = HeaderMap::new();
        assert!(same_origin(&h));
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; occ_console=tok; b=2"),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("tok"));
    }
}
