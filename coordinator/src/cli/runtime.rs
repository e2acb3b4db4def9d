//! `occ agent runtime`, `occ agent logs` and the runtime-failure lines of `occ agent status`.
//! Logs page by cursor until the range is read; `--follow` keeps asking after the last
//! cursor. A 429 is waited out (its Retry-After), never shown as a failure.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use clawfleet_api::types::{AgentLogPage, DeploymentStatus, LogsQuery};
use clawfleet_protocol::runtime::LogSource;
use coordinator::client::{Api, Client, ClientError};

use super::out::say;
use super::table::print_fields;
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

/// A read that waits out 429s.
fn patiently<T>(read: impl Fn() -> Result<T, ClientError>) -> Result<T> {
    let started = Instant::now();
    loop {
        match read() {
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
    let v = patiently(|| c.runtime([ns, id]))?;
    print_fields(cli, &v);
    Ok(())
}

fn print_entries(cli: &Cli, page: &AgentLogPage) {
    for e in &page.entries {
        if cli.output == Output::Json {
            super::out::json_line(&super::table::to_json(e));
        } else {
            let marker = if e.source == LogSource::Supervisor {
                " [supervisor]"
            } else {
                ""
            };
            say(&format!("{}{marker} {}", e.at, e.message));
        }
    }
}

/// `occ agent logs NS AGENT`.
pub(crate) fn logs(cli: &Cli, c: &Client, ns: &str, id: &str, args: &LogsArgs) -> Result<()> {
    if args.previous && args.follow {
        bail!("--previous reads a finished run, which has nothing more to follow; drop --follow");
    }
    let previous = args.previous.then_some(true);
    let mut query = LogsQuery {
        tail_lines: args.tail,
        since_seconds: args.since,
        previous,
        ..LogsQuery::default()
    };
    let started = Instant::now();
    let mut cursor: Option<String> = None;
    loop {
        let page = patiently(|| c.logs([ns, id], &query))
            .with_context(|| format!("reading the log of {ns}/{id}"))?;
        print_entries(cli, &page);
        if let Some(next) = &page.cursor {
            cursor = Some(next.as_str().to_owned());
        }
        if !page.more && !args.follow {
            return Ok(());
        }
        if !page.more {
            std::thread::sleep(FOLLOW_EVERY);
        }
        // Polls of a follow say so: the follow is audited once, not at every poll.
        let follow = args.follow.then_some(true);
        query = match &cursor {
            Some(c) => LogsQuery {
                cursor: Some(c.clone()),
                previous,
                follow,
                ..LogsQuery::default()
            },
            // Nothing logged yet: ask again for what came since following began.
            None => LogsQuery {
                since_seconds: Some(started.elapsed().as_secs() + 2),
                previous,
                follow,
                ..LogsQuery::default()
            },
        };
    }
}

/// After `occ agent status`'s table: why the newest failed activation failed.
pub(crate) fn print_failure(cli: &Cli, status: &DeploymentStatus) {
    if cli.output == Output::Json {
        return;
    }
    let Some((rev, f)) = status
        .revisions
        .iter()
        .rev()
        .find_map(|r| r.runtime_failure.as_ref().map(|f| (r, f)))
    else {
        return;
    };
    say("");
    say(&format!(
        "runtime failure of {} ({}, check {}): {}",
        rev.id, f.code, f.check, f.message
    ));
    if let Some(exit) = &f.last_exit {
        say(&format!(
            "  last exit: {} status {}{}",
            super::table::text(&exit.kind),
            exit.status,
            exit.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ));
    }
    if let (Some(state), Some(restarts)) = (&f.active_state, f.restarts) {
        say(&format!(
            "  state: {state}/{} after {restarts} restarts",
            f.sub_state.as_deref().unwrap_or_default()
        ));
    }
    for line in &f.last_lines {
        say(&format!("  {} {}", line.at, line.message));
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
        assert_eq!(
            coordinator::client::percent_encode("s=1;i=2"),
            "s%3D1%3Bi%3D2"
        );
    }
}
