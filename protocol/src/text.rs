//! Untrusted text on its way into a message or a log line: control characters become spaces
//! and the text is cut, marked with `…`. Every crate uses this one rule.

/// At most `max` characters of `text`, control characters replaced by spaces; a cut text
/// ends with `…` (counted in `max`).
pub fn clean(text: &str, max: usize) -> String {
    let replaced = text.chars().map(|c| if c.is_control() { ' ' } else { c });
    if text.chars().count() <= max {
        return replaced.collect();
    }
    let mut out: String = replaced.take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_go_and_long_text_is_cut_within_the_limit() {
        assert_eq!(clean("a\nb\u{1b}[31m", 20), "a b [31m");
        let cut = clean(&"x".repeat(100), 10);
        assert_eq!(cut.chars().count(), 10);
        assert!(cut.ends_with('…'));
        assert_eq!(clean("short", 5), "short");
    }
}
