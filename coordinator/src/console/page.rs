//! What every console page shares: the layout (navigation, skip link, sign-out form), the
//! error page, and small renderers (times, state badges).

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::assets;
use super::auth::Session;
use crate::api::ApiError;
use crate::model::Role;
use crate::service::ServiceError;

/// A console page or a refusal, as HTML.
pub(crate) type PageResult = Result<Response, ConsoleError>;

/// A refusal shown as an HTML page with the API's status and code.
#[derive(Debug)]
pub struct ConsoleError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl From<ApiError> for ConsoleError {
    fn from(e: ApiError) -> Self {
        ConsoleError {
            status: e.status(),
            code: e.code(),
            message: e.message().to_owned(),
        }
    }
}

impl From<ServiceError> for ConsoleError {
    fn from(e: ServiceError) -> Self {
        ApiError::from(e).into()
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let body = bare(
            "Refused",
            html! {
                main id="main" tabindex="-1" {
                    h1 { "Refused: " (self.status.as_u16()) }
                    p.error { code { (self.code) } ": " (self.message) }
                    p { a href="/console" { "Back to the overview" } }
                }
            },
        );
        (self.status, Html(body.into_string())).into_response()
    }
}

/// An HTML answer.
pub(crate) fn ok(markup: Markup) -> PageResult {
    Ok(Html(markup.into_string()).into_response())
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · clawfleet" }
            link rel="stylesheet" href=(assets::href(assets::STYLE));
            script src=(assets::href(assets::SCRIPT)) defer {}
        }
    }
}

/// A page without navigation (sign-in, refusals).
pub(crate) fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { (body) }
        }
    }
}

/// A signed-in page: skip link, navigation by what the token may read, the content.
pub(crate) fn layout(session: &Session, title: &str, content: Markup) -> Markup {
    let admin = session.caller.is_global(Role::Admin);
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    nav aria-label="Console" {
                        a href="/console" { "Overview" }
                        @if admin {
                            a href="/console/hosts" { "Hosts" }
                            a href="/console/audit" { "Audit" }
                        }
                        form method="post" action="/console/sign-out" {
                            (csrf_field(session))
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" tabindex="-1" {
                    h1 { (title) }
                    (content)
                }
            }
        }
    }
}

/// The hidden CSRF field every form of a signed-in page carries.
pub(crate) fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

/// Seconds since the epoch as UTC `YYYY-MM-DD HH:MM:SS`.
pub(crate) fn time(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 as (year, month, day) (H. Hinnant's civil_from_days).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// How a state looks: `ok` only for what was observed healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    /// Observed healthy.
    Ok,
    /// Being changed, or waiting.
    Wait,
    /// Observed failing, drifted or unreachable.
    Bad,
    /// Not observed (yet), or intentionally off.
    Unknown,
}

impl Tone {
    fn class(self) -> &'static str {
        match self {
            Tone::Ok => "badge ok",
            Tone::Wait => "badge wait",
            Tone::Bad => "badge bad",
            Tone::Unknown => "badge unknown",
        }
    }
}

/// A state as text with its tone (the text always says it; colour only repeats it).
pub(crate) fn badge(tone: Tone, text: &str) -> Markup {
    html! { span class=(tone.class()) data-state=(text) { (text) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(time(0), "1970-01-01 00:00:00");
        assert_eq!(time(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(time(1_796_342_400 + 3661), "2026-12-04 01:01:01");
    }
}
