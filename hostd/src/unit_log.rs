//! Reading a unit's journal: `journalctl` run directly (no shell, fixed argv, matches built
//! from validated names), its export format parsed as a stream with bounded memory.
//!
//! Why journalctl and not the journal files: the file format is versioned, compressed and
//! rotated by journald, and a native reader (or libsystemd through FFI) would add code or
//! `unsafe` to a root binary for what journalctl, which every systemd host has, already does
//! correctly. Why the export format: every field arrives with its length or on its own line,
//! so a 50 MB message costs one bounded buffer, never 50 MB, and the cursor of every entry is
//! kept even when its message is cut.
//!
//! Redaction happens here too ([`redact`]): every entry with the Agent's literal secrets (its
//! gateway password and the values of its env files, [`env_file`]) and journald's
//! line cuts (`_LINE_BREAK=line-max`) known, so a secret that a cut splits across two entries
//! is caught in both.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawfleet_protocol::redact::{Redacted, Redactor};

use crate::system::{JournalQuery, JournalRecord, JournalStart, SystemError};

/// Longest field value kept, in bytes (messages are cut to this; the rest is skipped).
pub const FIELD_MAX: usize = clawfleet_protocol::runtime::MAX_ENTRY_CHARS * 4;

/// The journalctl argv for a query (without the program).
pub fn arguments(query: &JournalQuery) -> Result<Vec<String>, SystemError> {
    if !crate::layout::is_unit_name(&query.unit) {
        return Err(SystemError::Journal {
            detail: format!("{:?} is not an Agent unit name", query.unit),
        });
    }
    let mut args = vec![
        "--no-pager".to_owned(),
        "--quiet".to_owned(),
        "--output=export".to_owned(),
        "--output-fields=MESSAGE,_PID,_SYSTEMD_INVOCATION_ID,INVOCATION_ID,EXIT_CODE,EXIT_STATUS,_LINE_BREAK"
            .to_owned(),
    ];
    let (span_from, span_until) = query.span.unwrap_or((None, None));
    // The later of the start's own "since" and the span's start, in microseconds.
    let since = |seconds: Option<u64>| -> Option<u64> {
        let from_start = seconds.map(|s| s.saturating_mul(1_000_000));
        from_start.max(span_from)
    };
    let at = |usec: u64| format!("@{}.{:06}", usec / 1_000_000, usec % 1_000_000);
    let since_usec = match &query.start {
        JournalStart::Head => since(None),
        JournalStart::Tail { n, since: s } => {
            args.push(format!("--lines={n}"));
            since(*s)
        }
        JournalStart::Since(s) => since(Some(*s)),
        JournalStart::After(cursor) => {
            clawfleet_protocol::runtime::LogCursor::new(cursor.clone())
                .map_err(|detail| SystemError::JournalCursor { detail })?;
            args.push(format!("--after-cursor={cursor}"));
            since(None)
        }
    };
    if let Some(usec) = since_usec {
        args.push(format!("--since={}", at(usec)));
    }
    // journalctl's --until includes its time; the span's end does not.
    if let Some(until) = span_until {
        args.push(format!("--until={}", at(until.saturating_sub(1))));
    }
    if let Some(prefix) = query.message_prefix {
        if !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b' ' | b'-' | b':'))
        {
            return Err(SystemError::Journal {
                detail: format!("{prefix:?} is not a plain message prefix"),
            });
        }
        args.push(format!("--grep=^{prefix}"));
        args.push("--case-sensitive=true".to_owned());
    }
    if query.reverse {
        args.push("--reverse".to_owned());
    }
    let unit = &query.unit;
    match &query.invocation {
        Some(id) => {
            if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(SystemError::Journal {
                    detail: format!("{id:?} is not an invocation id"),
                });
            }
            // The run's own lines, or systemd's lines about that run.
            if !query.supervisor_only {
                args.push(format!("_SYSTEMD_INVOCATION_ID={id}"));
                args.push("+".to_owned());
            }
            args.push(format!("INVOCATION_ID={id}"));
            args.push("_PID=1".to_owned());
        }
        None => {
            if !query.supervisor_only {
                args.push(format!("_SYSTEMD_UNIT={unit}"));
                args.push("+".to_owned());
            }
            args.push(format!("UNIT={unit}"));
            args.push("_PID=1".to_owned());
        }
    }
    Ok(args)
}

/// Runs journalctl for the query and hands each entry to `visit`. journalctl is killed when
/// `visit` stops early or the deadline passes.
pub fn read(
    journalctl: &std::path::Path,
    query: &JournalQuery,
    deadline: Instant,
    visit: &mut dyn FnMut(JournalRecord) -> bool,
) -> Result<(), SystemError> {
    let args = arguments(query)?;
    let mut child = Command::new(journalctl)
        .args(&args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("SYSTEMD_PAGER", "")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| SystemError::Journal {
            detail: format!("cannot run {}: {e}", journalctl.display()),
        })?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(SystemError::Journal {
            detail: "journalctl has no output pipes".to_owned(),
        });
    };
    let err_text = std::thread::spawn(move || {
        let mut stderr = stderr;
        let mut buf = Vec::new();
        let _ = (&mut stderr).take(4096).read_to_end(&mut buf);
        // The rest is drained, not dropped: a closed pipe would kill journalctl with SIGPIPE.
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        String::from_utf8_lossy(&buf).trim().to_owned()
    });
    // The watchdog kills journalctl at the deadline; `reaped` keeps it from signalling a pid
    // that was already waited for (and could belong to another process by then).
    let pid = child.id();
    let reaped = Arc::new(Mutex::new(false));
    let watchdog = {
        let reaped = Arc::clone(&reaped);
        std::thread::spawn(move || {
            loop {
                if *reaped.lock().unwrap_or_else(|p| p.into_inner()) {
                    return false;
                }
                if Instant::now() >= deadline {
                    let guard = reaped.lock().unwrap_or_else(|p| p.into_inner());
                    if !*guard {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut stopped_early = false;
    let mut any = false;
    let parsed = parse_export(&mut reader, &mut |record| {
        any = true;
        let go_on = visit(record);
        stopped_early |= !go_on;
        go_on
    });
    drop(reader);
    if stopped_early || parsed.is_err() {
        let _ = child.kill();
    }
    let status = {
        let mut guard = reaped.lock().unwrap_or_else(|p| p.into_inner());
        let status = child.wait();
        *guard = true;
        status
    };
    let timed_out = watchdog.join().unwrap_or(false);
    let stderr = err_text.join().unwrap_or_default();
    if timed_out && !stopped_early {
        return Err(SystemError::Journal {
            detail: "journalctl did not finish before the operation's deadline".to_owned(),
        });
    }
    parsed?;
    match status {
        Ok(s) if s.success() || stopped_early => Ok(()),
        // journalctl --grep ends with status 1, and says nothing, when no entry matched.
        Ok(s) if no_match(query, s.code(), any, &stderr) => Ok(()),
        Ok(_) if stderr.contains("cursor") => Err(SystemError::JournalCursor {
            detail: clawfleet_protocol::text::clean(&stderr, 200),
        }),
        Ok(s) => Err(SystemError::Journal {
            detail: format!(
                "journalctl exited with {s}: {}",
                clawfleet_protocol::text::clean(&stderr, 200)
            ),
        }),
        Err(e) => Err(SystemError::Journal {
            detail: format!("cannot wait for journalctl: {e}"),
        }),
    }
}

/// Whether journalctl's exit is its answer to a `--grep` that matched nothing (status 1, no
/// entry and nothing on stderr), not a failure.
fn no_match(query: &JournalQuery, code: Option<i32>, any_entry: bool, stderr: &str) -> bool {
    query.message_prefix.is_some() && code == Some(1) && !any_entry && stderr.is_empty()
}

/// A value read with at most `max` bytes kept.
fn bounded(
    reader: &mut dyn BufRead,
    max: usize,
    until_newline: bool,
    mut len: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut out = Vec::new();
    let mut any = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(if any || !out.is_empty() {
                Some(out)
            } else {
                None
            });
        }
        any = true;
        let (take, done) = if until_newline {
            match buf.iter().position(|b| *b == b'\n') {
                Some(p) => (p, true),
                None => (buf.len(), false),
            }
        } else {
            let n = usize::try_from(len).unwrap_or(usize::MAX).min(buf.len());
            (n, n as u64 == len)
        };
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&buf[..take.min(room)]);
        let consumed = if until_newline && done {
            take + 1
        } else {
            take
        };
        reader.consume(consumed);
        if !until_newline {
            len -= take as u64;
        }
        if done {
            return Ok(Some(out));
        }
    }
}

/// Parses journalctl's export format: entries of `FIELD=value` lines and binary fields
/// (`FIELD`, a little-endian 64-bit length, the bytes, a newline), separated by empty lines.
pub fn parse_export(
    reader: &mut dyn BufRead,
    visit: &mut dyn FnMut(JournalRecord) -> bool,
) -> Result<(), SystemError> {
    let io = |e: std::io::Error| SystemError::Journal {
        detail: format!("reading journalctl's output: {e}"),
    };
    let mut entry = Entry::default();
    loop {
        let Some(line) = bounded(reader, FIELD_MAX + 64, true, 0).map_err(io)? else {
            if let Some(record) = entry.take() {
                visit(record);
            }
            return Ok(());
        };
        if line.is_empty() {
            if let Some(record) = entry.take()
                && !visit(record)
            {
                return Ok(());
            }
            continue;
        }
        match line.iter().position(|b| *b == b'=') {
            Some(eq) => entry.field(&line[..eq], &line[eq + 1..]),
            None => {
                // A binary field: its name, then the length and the bytes.
                let mut len = [0u8; 8];
                reader.read_exact(&mut len).map_err(io)?;
                let len = u64::from_le_bytes(len);
                let value = bounded(reader, FIELD_MAX, false, len)
                    .map_err(io)?
                    .unwrap_or_default();
                let mut newline = [0u8; 1];
                reader.read_exact(&mut newline).map_err(io)?;
                entry.field(&line, &value);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Entry {
    cursor: Option<String>,
    realtime: u64,
    message: Option<String>,
    pid1: bool,
    invocation: Option<String>,
    exit_code: Option<String>,
    exit_status: Option<i32>,
    line_break: Option<String>,
}

impl Entry {
    fn field(&mut self, name: &[u8], value: &[u8]) {
        let text = || String::from_utf8_lossy(value).into_owned();
        match name {
            b"__CURSOR" => self.cursor = Some(text()),
            b"__REALTIME_TIMESTAMP" => self.realtime = text().trim().parse().unwrap_or(0),
            b"MESSAGE" => self.message = Some(text()),
            b"_PID" => self.pid1 = value == b"1",
            b"_SYSTEMD_INVOCATION_ID" | b"INVOCATION_ID" => self.invocation = Some(text()),
            b"EXIT_CODE" => self.exit_code = Some(text()),
            b"EXIT_STATUS" => self.exit_status = text().trim().parse().ok(),
            b"_LINE_BREAK" => self.line_break = Some(text()),
            _ => {}
        }
    }

    fn take(&mut self) -> Option<JournalRecord> {
        let e = std::mem::take(self);
        let cursor = e.cursor?;
        Some(JournalRecord {
            cursor,
            realtime_usec: e.realtime,
            // Bounded by FIELD_MAX already; cut to its shown length only after redaction, so
            // a secret at the cut is never half shown.
            message: e.message.unwrap_or_default(),
            from_supervisor: e.pid1,
            // journald cut the line at its limit; the rest is the next entry.
            cut: e.line_break.as_deref() == Some("line-max"),
            invocation: e.invocation,
            // Only systemd's own message counts: a gateway can log any field it likes.
            exit: match (e.pid1, e.exit_code, e.exit_status) {
                (true, Some(code), Some(status)) => Some((code, status)),
                _ => None,
            },
        })
    }
}

/// One entry's message as it leaves the host: redacted by the reader that saw the entries
/// before it (so a secret split by journald's cut is caught), then cut to its shown length (a
/// secret at that cut is never half shown).
pub fn redact(redactor: &mut Redactor, record: &JournalRecord) -> Redacted {
    let r = redactor.entry(&record.message, record.cut);
    Redacted {
        text: clawfleet_protocol::text::clean(
            &r.text,
            clawfleet_protocol::runtime::MAX_ENTRY_CHARS,
        ),
        count: r.count,
    }
}

/// The names and values of a systemd `EnvironmentFile=` (the Agent's password file, its
/// operator env file, its launch environment), as the unit sees them: `"…"` with `\`
/// escapes undone, `'…'` verbatim, unquoted values trimmed. Comments (`#`, `;`) and blank
/// lines skipped.
pub fn env_file(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((name, raw)) = line.split_once('=') else {
            continue;
        };
        let raw = raw.trim_start();
        let value = if let Some(body) = raw.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = body.chars();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => v.extend(chars.next()),
                    c => v.push(c),
                }
            }
            v
        } else if let Some(body) = raw.strip_prefix('\'') {
            body.split('\'').next().unwrap_or_default().to_owned()
        } else {
            raw.trim_end().to_owned()
        };
        if !value.is_empty() {
            out.push((name.trim().to_owned(), value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(bytes: &[u8]) -> Vec<JournalRecord> {
        let mut out = Vec::new();
        parse_export(&mut std::io::Cursor::new(bytes), &mut |r| {
            out.push(r);
            true
        })
        .unwrap();
        out
    }

    #[test]
    fn text_and_binary_fields_parse_and_huge_values_are_cut() {
        let mut bytes = b"__CURSOR=s=1;i=1\n__REALTIME_TIMESTAMP=1700000000123456\nMESSAGE=hello\n_PID=42\n_SYSTEMD_INVOCATION_ID=ab\n\n".to_vec();
        bytes.extend_from_slice(
            b"__CURSOR=s=1;i=2\n__REALTIME_TIMESTAMP=1700000000223456\nMESSAGE\n",
        );
        let body = b"two\nlines";
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(body);
        bytes.extend_from_slice(b"\n_PID=1\nINVOCATION_ID=ab\n\n");
        bytes.extend_from_slice(b"__CURSOR=s=1;i=3\nMESSAGE=");
        bytes.extend(std::iter::repeat_n(b'x', 10 * FIELD_MAX));
        bytes.extend_from_slice(b"\n\n");
        let r = records(&bytes);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].message, "hello");
        assert_eq!(r[0].realtime_usec, 1_700_000_000_123_456);
        assert!(!r[0].from_supervisor);
        assert_eq!(r[1].message, "two\nlines");
        assert!(r[1].from_supervisor);
        assert_eq!(r[1].invocation.as_deref(), Some("ab"));
        assert!(r[2].message.len() <= FIELD_MAX + 64 && r[2].message.len() >= FIELD_MAX);
        assert_eq!(r[2].cursor, "s=1;i=3");
    }

    #[test]
    fn matches_are_built_from_checked_names_only() {
        let q = |unit: &str, invocation: Option<&str>| JournalQuery {
            unit: unit.to_owned(),
            invocation: invocation.map(str::to_owned),
            supervisor_only: false,
            start: JournalStart::Tail { n: 5, since: None },
            reverse: false,
            message_prefix: None,
            span: None,
        };
        assert!(arguments(&q("sshd.service", None)).is_err());
        let unit = "clawfleet-agent-0123456789abcdef0123456789abcdef.service";
        let args = arguments(&q(unit, None)).unwrap();
        assert!(args.contains(&format!("_SYSTEMD_UNIT={unit}")));
        assert!(arguments(&q(unit, Some("not-hex"))).is_err());
        let bad_cursor = JournalQuery {
            start: JournalStart::After("a b".to_owned()),
            ..q(unit, None)
        };
        assert!(arguments(&bad_cursor).is_err());
        // One gateway run: from its start (included) to the next one's (excluded), the
        // later of two starts winning.
        let run = JournalQuery {
            start: JournalStart::Tail {
                n: 5,
                since: Some(1_700_000_000),
            },
            span: Some((Some(1_700_000_001_000_002), Some(1_700_000_009_500_000))),
            message_prefix: Some("hostd exec-gateway: relaunched"),
            ..q(unit, None)
        };
        let args = arguments(&run).unwrap();
        for want in [
            "--lines=5",
            "--since=@1700000001.000002",
            "--until=@1700000009.499999",
            "--grep=^hostd exec-gateway: relaunched",
            "--case-sensitive=true",
        ] {
            assert!(args.contains(&want.to_owned()), "{want} in {args:?}");
        }
        let bad_prefix = JournalQuery {
            message_prefix: Some("a.*"),
            ..q(unit, None)
        };
        assert!(arguments(&bad_prefix).is_err());
    }

    /// journalctl ends with status 1 and prints nothing when `--grep` matches no entry
    /// (systemd 252 does): for a query by message prefix that is an empty answer, and for any
    /// other query, or with something on stderr, a failure.
    #[test]
    fn a_grep_that_matches_nothing_is_an_empty_answer_not_a_failure() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path
        };
        let silent = script("silent", "exit 1");
        let loud = script("loud", "echo 'Failed to open journal' >&2; exit 1");
        let unit = "clawfleet-agent-0123456789abcdef0123456789abcdef.service";
        let plain = JournalQuery {
            unit: unit.to_owned(),
            invocation: None,
            supervisor_only: false,
            start: JournalStart::Head,
            reverse: true,
            message_prefix: None,
            span: None,
        };
        let by_prefix = JournalQuery {
            message_prefix: Some(crate::supervise::RELAUNCHED),
            ..plain.clone()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = 0;
        read(&silent, &by_prefix, deadline, &mut |_| {
            seen += 1;
            true
        })
        .unwrap();
        assert_eq!(seen, 0);
        let e = read(&silent, &plain, deadline, &mut |_| true).unwrap_err();
        assert!(e.to_string().contains("exited with"), "{e}");
        let e = read(&loud, &by_prefix, deadline, &mut |_| true).unwrap_err();
        assert!(e.to_string().contains("Failed to open journal"), "{e}");
    }

    /// The redaction corpus through hostd's log path: each case as journalctl's export
    /// output (an entry journald cut carries `_LINE_BREAK=line-max`), parsed, then redacted
    /// entry by entry as a page is, the corpus's literal secrets as the Agent's.
    #[test]
    fn journal_entries_pass_the_redaction_corpus() {
        use clawfleet_protocol::redact::corpus;
        let corpus = corpus::load().unwrap();
        let mut bad = Vec::new();
        let mut checked = 0;
        for case in &corpus.cases {
            let mut bytes = Vec::new();
            for (n, e) in case.iter().enumerate() {
                bytes.extend_from_slice(format!("__CURSOR=s=1;i={n}\nMESSAGE\n").as_bytes());
                bytes.extend_from_slice(&(e.input.len() as u64).to_le_bytes());
                bytes.extend_from_slice(e.input.as_bytes());
                bytes.extend_from_slice(b"\n_PID=4242\n");
                if e.cut {
                    bytes.extend_from_slice(b"_LINE_BREAK=line-max\n");
                }
                bytes.push(b'\n');
            }
            let got = records(&bytes);
            assert_eq!(got.len(), case.len());
            let mut redactor = Redactor::new(corpus.secrets.iter().cloned());
            for (e, record) in case.iter().zip(&got) {
                checked += 1;
                assert_eq!(record.cut, e.cut, "line {}", e.line);
                let out = redact(&mut redactor, record).text;
                if out != e.expected {
                    bad.push(format!(
                        "line {}: {:?}\n  expected {:?}\n  got      {:?}",
                        e.line, e.input, e.expected, out
                    ));
                }
            }
        }
        assert!(checked >= 300, "{checked}");
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn env_files_give_the_values_the_unit_sees() {
        let text = "# comment\n; also a comment\n\nA=plain value  \nB=\"quoted \\\"inner\\\" \\\\ end\"\nC='single $x'\n D = spaced\nE=\nnot an assignment\n";
        assert_eq!(
            env_file(text),
            [
                ("A".to_owned(), "plain value".to_owned()),
                ("B".to_owned(), "quoted \"inner\" \\ end".to_owned()),
                ("C".to_owned(), "single $x".to_owned()),
                ("D".to_owned(), "spaced".to_owned()),
            ]
        );
        // What hostd writes for the launch environment reads back verbatim.
        let mut env = std::collections::BTreeMap::new();
        env.insert("DB_PASSWORD".to_owned(), "a \"b\" \\c".to_owned());
        let written = crate::engine::hooks::render_env_file(&env);
        assert_eq!(
            env_file(&written),
            [("DB_PASSWORD".to_owned(), "a \"b\" \\c".to_owned())]
        );
    }
}
