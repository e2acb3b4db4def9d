//! `occ agent runtime`, `occ agent logs` and the runtime-failure lines of `occ agent status`.
//! Logs page by cursor until the range is read; `--follow` keeps asking after the last
//! cursor. A 429 is waited out (its Retry-After), never shown as a failure.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use coordinator::client::{Client, ClientError, percent_encode};
use serde_json::Value;

use super::out::say;
use super::table::print;
use super::{Cli, Output};

/// How often `--follow` asks for new lines.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Longest wait on 429 before giving up.
const RATE_LIMIT_PATIENCE: Duration = Duration::from_secs(300);

#[derive(Args, Debug, Clone)]
pub(crate) struct LogsArgs {
    /// The newest N lines (1 to 1000; default 100 unless --since is given).
    #[arg(long)]
    tail: Option<u32>,
    /// Only lines newer than this: seconds, or a number with s, m, h or d (`10m`).
    #[arg(long, value_parser = parse_duration)]
    since: Option<u64>,
    /// The run before the current one (after a restart or a crash).
    #[arg(long)]
    previous: bool,
    /// Keep printing new lines as they come (Ctrl-C ends).
    #[arg(long, short = 'f')]
    follow: bool,
}

/// `10`, `10s`, `5m`, `2h`, `1d` as seconds.
fn parse_duration(text: &str) -> std::result::Result<u64, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s, 10m, 2h or 1d"))?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit must be s, m, h or d")),
    };
    let seconds = n
        .checked_mul(factor)
        .filter(|s| *s > 0)
        .ok_or_else(|| format!("{text:?} must be at least 1 s and not absurdly long"))?;
    Ok(seconds)
}

/// A GET that waits out 429s.
fn get_patiently(c: &Client, path: &str) -> Result<Value> {
    let started = Instant::now();
    loop {
        match c.request("GET", path, None) {
            Err(ClientError::RateLimited { retry_after, .. })
                if started.elapsed() < RATE_LIMIT_PATIENCE =>
            {
                std::thread::sleep(Duration::from_secs(retry_after.clamp(1, 60)));
            }
            other => return Ok(other?),
        }
    }
}

/// `occ agent runtime NS AGENT`.
pub(crate) fn show(cli: &Cli, c: &Client, ns: &str, id: &str) -> Result<()> {
    let v = get_patiently(c, &format!("/namespaces/{ns}/agents/{id}/runtime"))?;
    print(cli, &v, &[]);
    Ok(())
}

fn print_entries(cli: &Cli, page: &Value) {
    for e in page["entries"].as_array().into_iter().flatten() {
        if cli.output == Output::Json {
            super::out::json_line(e);
        } else {
            let marker = if e["source"] == "supervisor" {
                " [supervisor]"
            } else {
                ""
            };
            say(&format!(
                "{}{marker} {}",
                e["at"].as_str().unwrap_or_default(),
                e["message"].as_str().unwrap_or_default()
            ));
        }
    }
}

/// `occ agent logs NS AGENT`.
pub(crate) fn logs(cli: &Cli, c: &Client, ns: &str, id: &str, args: &LogsArgs) -> Result<()> {
    if args.previous && args.follow {
        bail!("--previous reads a finished run, which has nothing more to follow; drop --follow");
    }
    let base = format!("/namespaces/{ns}/agents/{id}/runtime/logs");
    let previous = if args.previous { "&previous=true" } else { "" };
    let mut query = match (args.tail, args.since) {
        (Some(n), Some(s)) => format!("tailLines={n}&sinceSeconds={s}"),
        (Some(n), None) => format!("tailLines={n}"),
        (None, Some(s)) => format!("sinceSeconds={s}"),
        (None, None) => String::new(),
    };
    let started = Instant::now();
    let mut cursor: Option<String> = None;
    loop {
        let path = format!("{base}?{query}{previous}");
        let page = get_patiently(c, path.replace("?&", "?").trim_end_matches('?'))
            .with_context(|| format!("reading the log of {ns}/{id}"))?;
        print_entries(cli, &page);
        if let Some(next) = page["cursor"].as_str() {
            cursor = Some(next.to_owned());
        }
        let more = page["more"].as_bool().unwrap_or(false);
        if !more && !args.follow {
            return Ok(());
        }
        if !more {
            std::thread::sleep(FOLLOW_EVERY);
        }
        // Polls of a follow say so: the follow is audited once, not at every poll.
        let follow = if args.follow { "&follow=true" } else { "" };
        query = match &cursor {
            Some(c) => format!("cursor={}{follow}", percent_encode(c)),
            // Nothing logged yet: ask again for what came since following began.
            None => format!("sinceSeconds={}{follow}", started.elapsed().as_secs() + 2),
        };
    }
}

/// After `occ agent status`'s table: why the newest failed activation failed.
pub(crate) fn print_failure(cli: &Cli, status: &Value) {
    if cli.output == Output::Json {
        return;
    }
    let Some(rev) = status["revisions"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find(|r| r["runtimeFailure"].is_object())
    else {
        return;
    };
    let f = &rev["runtimeFailure"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    say("");
    say(&format!(
        "runtime failure of {} ({}, check {}): {}",
        text(&rev["id"]),
        text(&f["code"]),
        text(&f["check"]),
        text(&f["message"])
    ));
    if let Some(exit) = f["lastExit"].as_object() {
        say(&format!(
            "  last exit: {} status {}{}",
            exit.get("kind").and_then(Value::as_str).unwrap_or("?"),
            exit.get("status").map(Value::to_string).unwrap_or_default(),
            exit.get("reason")
                .and_then(Value::as_str)
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ));
    }
    if let (Some(state), Some(restarts)) = (f["activeState"].as_str(), f["restarts"].as_u64()) {
        say(&format!(
            "  state: {state}/{} after {restarts} restarts",
            text(&f["subState"])
        ));
    }
    for line in f["lastLines"].as_array().into_iter().flatten() {
        say(&format!(
            "  {} {}",
            text(&line["at"]),
            text(&line["message"])
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("30"), Ok(30));
        assert_eq!(parse_duration("10m"), Ok(600));
        assert_eq!(parse_duration("2h"), Ok(7200));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn cursors_are_percent_encoded() {
        assert_eq!(percent_encode("s=1;i=2"), "s%3D1%3Bi%3D2");
    }
}
