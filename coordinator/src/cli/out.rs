//! Everything `occ` prints goes through here. Text for people ([`say`], [`note`]) is passed
//! through [`sanitise`]: names, messages and log lines come from configurations, hosts and
//! Agents, and a control character (ESC starts a terminal escape sequence), a bidi override or
//! an invisible format character could recolour, retitle or hide what the operator reads, or
//! show it in another order. Such characters are shown as visible escapes (`\u{1b}`). JSON
//! ([`json`]) is printed exactly as the API answered. A stdout closed by its reader
//! (`occ … | head`) ends `occ` quietly, as it would end any Unix tool.

use std::borrow::Cow;
use std::io::Write;

use serde_json::Value;

/// Whether a character must not reach a terminal as it is: control characters (C0, DEL, C1),
/// the line and paragraph separators, and the invisible format characters (Unicode category
/// Cf: bidi embeddings, overrides, isolates and marks, zero-width spaces and joiners, the
/// byte-order mark, soft hyphen, tags, interlinear annotations, …).
pub(crate) fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061C}'
                | '\u{06DD}'
                | '\u{070F}'
                | '\u{0890}'..='\u{0891}'
                | '\u{08E2}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{110BD}'
                | '\u{110CD}'
                | '\u{13430}'..='\u{1343F}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0001}'
                | '\u{E0020}'..='\u{E007F}'
        )
}

/// `text` with every [`is_hidden`] character replaced by its escape (`\u{1b}`, `\u{202e}`).
pub(crate) fn sanitise(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The exit code when stdout was closed by its reader: what a shell reports for a process
/// ended by SIGPIPE (128 + 13), as for any Unix tool whose reader went away.
pub(crate) const STDOUT_CLOSED: u8 = 141;

/// Writes `text` and a newline to stdout. A closed stdout ends the process quietly with
/// [`STDOUT_CLOSED`]; another write error ends it with an error line.
fn write_stdout(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let result = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    match result {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(i32::from(STDOUT_CLOSED))
        }
        Err(e) => {
            note(&format!("occ: cannot write to stdout: {e}"));
            std::process::exit(i32::from(super::wait::exit::ERROR))
        }
    }
}

/// One line for people on stdout, sanitised.
pub(crate) fn say(line: &str) {
    write_stdout(&sanitise(line));
}

/// One JSON document (pretty) on stdout, exactly as given.
pub(crate) fn json(value: &Value) {
    write_stdout(&serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()));
}

/// One JSON document on one line (NDJSON), exactly as given.
pub(crate) fn json_line(value: &Value) {
    write_stdout(&value.to_string());
}

/// One line for people on stderr (progress, notes, warnings, errors), sanitised. A failed
/// write is dropped: stderr is where failures would be reported, so there is nowhere left.
pub(crate) fn note(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _unreported: std::io::Result<()> = stderr
        .write_all(sanitise(line).as_bytes())
        .and_then(|()| stderr.write_all(b"\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_bidi_and_invisible_characters_become_visible_escapes() {
        assert_eq!(
            sanitise("a\u{1b}[31mred\u{7}\u{9b}x"),
            "a\\u{1b}[31mred\\u{7}\\u{9b}x"
        );
        assert_eq!(
            sanitise("evil\u{202e}txt.exe\u{2066}\u{200b}\u{2028}\u{feff}\u{e0041}"),
            "evil\\u{202e}txt.exe\\u{2066}\\u{200b}\\u{2028}\\u{feff}\\u{e0041}"
        );
        assert_eq!(
            sanitise("line\nnext\ttab\r"),
            "line\\u{a}next\\u{9}tab\\u{d}"
        );
        // Printable text, other scripts and emoji stay as they are (and are not copied).
        assert!(matches!(sanitise("plain é 日本 🦀"), Cow::Borrowed(_)));
    }
}
