//! Redaction of log text before it leaves a host or a cluster: the rules of "Runtime status,
//! logs and drift" in DESIGN.md. hostd applies them to journal lines, the Kubernetes backend to
//! Pod logs, and the coordinator once more to the evidence it stores, so no path depends on
//! another having done it.
//!
//! What is replaced by [`REDACTED`]: PEM blocks (also when their lines arrive as separate log
//! entries), the value after `Bearer`/`Basic`, JWTs, keys with well-known prefixes (`sk-`,
//! `ghp_`, `AKIA`, …), URL query values and URL passwords, the value of `*_KEY=`, `*_TOKEN=`,
//! `*_SECRET=`, `*_PASSWORD=` (and JSON or YAML keys of those names), long base64 runs, and
//! literal secrets the caller names (the Agent's own gateway password).

/// What a redacted value becomes.
pub const REDACTED: &str = "[REDACTED]";

/// Literal secrets shorter than this are not searched for (they would match ordinary text).
pub const MIN_SECRET_LEN: usize = 8;

/// Prefixes of API keys and tokens that are secret whatever surrounds them.
const KEY_PREFIXES: &[&str] = &[
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxs-",
    "xapp-",
    "AKIA",
    "ASIA",
    "AIza",
    "hf_",
    "npm_",
    "ya29.",
];

/// Characters a key after a prefix is made of.
fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// A key name whose value is secret: `OPENAI_API_KEY`, `apiKey`, `access_token`, `password`…
fn is_secret_name(name: &str) -> bool {
    let lower: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .map(|c| {
            if c == '-' {
                '_'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect();
    if lower.is_empty() {
        return false;
    }
    [
        "_key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "credentials",
    ]
    .iter()
    .any(|s| lower.ends_with(s))
}

/// One log line after redaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    pub text: String,
    /// How many values were replaced.
    pub count: u32,
}

/// Redacts a sequence of log lines. It carries one piece of state from line to line: whether
/// a PEM block is open, so the body lines of a key logged line by line are caught too.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
    in_pem: bool,
}

impl Redactor {
    /// A redactor that also replaces each of `secrets` (those of at least
    /// [`MIN_SECRET_LEN`] characters) wherever it appears.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.chars().count() >= MIN_SECRET_LEN)
            .collect();
        // Longest first, so a secret that contains another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Self {
            secrets,
            in_pem: false,
        }
    }

    /// Redacts one line (it may hold newlines: one journal entry can).
    pub fn line(&mut self, text: &str) -> Redacted {
        let mut count = 0u32;
        let mut text = text.to_owned();
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                count += u32::try_from(text.matches(secret.as_str()).count()).unwrap_or(u32::MAX);
                text = text.replace(secret.as_str(), REDACTED);
            }
        }
        let (text, pem) = self.pem(&text);
        count += pem;
        let (text, tokens) = redact_tokens(&text);
        Redacted {
            text,
            count: count.saturating_add(tokens),
        }
    }

    /// Replaces PEM blocks, and everything while one is open.
    fn pem(&mut self, text: &str) -> (String, u32) {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        let mut count = 0;
        loop {
            if self.in_pem {
                match rest.find("-----END") {
                    Some(end) => {
                        let after = &rest[end + "-----END".len()..];
                        let close = after
                            .find("-----")
                            .map(|i| i + "-----".len())
                            .unwrap_or(after.len());
                        out.push_str(REDACTED);
                        count += 1;
                        rest = &after[close..];
                        self.in_pem = false;
                    }
                    None => {
                        if !rest.trim().is_empty() {
                            out.push_str(REDACTED);
                            count += 1;
                        }
                        return (out, count);
                    }
                }
            } else {
                match rest.find("-----BEGIN ") {
                    Some(begin) => {
                        out.push_str(&rest[..begin]);
                        rest = &rest[begin..];
                        self.in_pem = true;
                    }
                    None => {
                        out.push_str(rest);
                        return (out, count);
                    }
                }
            }
        }
    }
}

/// Redacts the values the token rules find, keeping all whitespace as it was.
fn redact_tokens(text: &str) -> (String, u32) {
    let mut out = String::with_capacity(text.len());
    let mut count = 0u32;
    let mut secret_next = false;
    let mut start = None;
    let flush = |token: &str, out: &mut String, count: &mut u32, secret_next: &mut bool| {
        let (redacted, n, next) = redact_token(token, *secret_next);
        out.push_str(&redacted);
        *count = count.saturating_add(n);
        *secret_next = next;
    };
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                flush(&text[s..i], &mut out, &mut count, &mut secret_next);
            }
            out.push(c);
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        flush(&text[s..], &mut out, &mut count, &mut secret_next);
    }
    (out, count)
}

/// One whitespace-free token: the redacted text, how many values went, and whether the next
/// token is a secret value (after `Bearer`, `password:`, `"apiKey":`).
fn redact_token(token: &str, secret: bool) -> (String, u32, bool) {
    if secret {
        // The value runs to its closing quote (or to the punctuation that ends it); what
        // follows it stays: `"abc",` → `"[REDACTED]",`, `xyz","n":1}` → `[REDACTED]","n":1}`.
        let quote = token.chars().next().filter(|c| matches!(c, '"' | '\''));
        let body = &token[quote.map_or(0, char::len_utf8)..];
        let end = match quote {
            Some(q) => body.find(q).unwrap_or(body.len()),
            None => body
                .find(['"', '\'', ',', ';', '}', ')'])
                .unwrap_or(body.len()),
        };
        let head = quote.map(String::from).unwrap_or_default();
        if body[..end].is_empty() {
            return (token.to_owned(), 0, false);
        }
        return (format!("{head}{REDACTED}{}", &body[end..]), 1, false);
    }
    let bare = token.trim_matches(|c: char| matches!(c, '"' | '\'' | ',' | '{' | '(' | '['));
    let lower = bare.to_ascii_lowercase();
    // `Bearer`, `"Bearer` and `{"authorization":"Bearer`: the scheme ends the token.
    let ends_with_scheme = ["bearer", "basic"].iter().any(|s| {
        let t = token.to_ascii_lowercase();
        t.ends_with(s)
            && t[..t.len() - s.len()]
                .chars()
                .last()
                .is_none_or(|c| !c.is_ascii_alphanumeric())
    });
    if matches!(lower.as_str(), "bearer" | "basic") || ends_with_scheme {
        return (token.to_owned(), 0, true);
    }
    // `password:` / `"apiKey":` / `API_KEY=` with the value in the next token.
    if let Some(name) = bare.strip_suffix(':').or_else(|| bare.strip_suffix('='))
        && is_secret_name(name)
    {
        return (token.to_owned(), 0, true);
    }
    let mut count = 0;
    let mut text = token.to_owned();
    if let Some((redacted, n)) = assignment(&text) {
        text = redacted;
        count += n;
    }
    if text.contains("://") {
        let (redacted, n) = url(&text);
        text = redacted;
        count += n;
    } else if let Some(q) = text.find('?')
        && text[q..].contains('=')
    {
        // A path with a query and no scheme (`GET /v1/x?key=…`).
        let (redacted, n) = query(&text[q + 1..]);
        text = format!("{}?{redacted}", &text[..q]);
        count += n;
    }
    let (redacted, n) = jwts(&text);
    text = redacted;
    count += n;
    let (redacted, n) = prefixed_keys(&text);
    text = redacted;
    count += n;
    if is_base64_run(text.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '=')) {
        return (REDACTED.to_owned(), count + 1, false);
    }
    (text, count, false)
}

/// `NAME=value`, `name:value` and `"name":"value"` inside one token, each with a secret name:
/// the value goes, its quotes and what follows it stay.
fn assignment(token: &str) -> Option<(String, u32)> {
    let mut out = String::with_capacity(token.len());
    let mut count = 0;
    let mut copied = 0;
    let bytes = token.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if !(c == b'=' || c == b':') || token[i + 1..].starts_with("//") {
            i += 1;
            continue;
        }
        let mut name_end = i;
        if name_end > 0 && matches!(bytes[name_end - 1], b'"' | b'\'') {
            name_end -= 1;
        }
        let name_start = token[..name_end]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
            .map(|(p, c)| p + c.len_utf8())
            .unwrap_or(0);
        let name = &token[name_start..name_end];
        let mut value_start = i + 1;
        let quote = bytes
            .get(value_start)
            .copied()
            .filter(|q| matches!(q, b'"' | b'\''));
        if quote.is_some() {
            value_start += 1;
        }
        let rest = &token[value_start..];
        if rest.starts_with(REDACTED) {
            // Already redacted (a second pass): keep it as it is.
            i = value_start + REDACTED.len();
            continue;
        }
        let value_len = match quote {
            Some(q) => rest.find(char::from(q)).unwrap_or(rest.len()),
            None => rest
                .find([',', ';', '&', '}', ')', ']', '"', '\''])
                .unwrap_or(rest.len()),
        };
        let value = &rest[..value_len];
        if is_secret_name(name) && !value.is_empty() && value != REDACTED {
            out.push_str(&token[copied..value_start]);
            out.push_str(REDACTED);
            copied = value_start + value_len;
            count += 1;
            i = copied;
        } else {
            i += 1;
        }
    }
    if count == 0 {
        return None;
    }
    out.push_str(&token[copied..]);
    Some((out, count))
}

/// A URL's password and every query value.
fn url(token: &str) -> (String, u32) {
    let mut count = 0;
    let Some(scheme_end) = token.find("://") else {
        return (token.to_owned(), 0);
    };
    let (head, rest) = token.split_at(scheme_end + 3);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => match authority[..at].find(':') {
            Some(colon) => {
                count += 1;
                format!("{}:{REDACTED}{}", &authority[..colon], &authority[at..])
            }
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let path = match path.find('?') {
        Some(q) => {
            let (before, rest) = path.split_at(q + 1);
            let (redacted, n) = query(rest);
            count += n;
            format!("{before}{redacted}")
        }
        None => path.to_owned(),
    };
    (format!("{head}{authority}{path}"), count)
}

/// Every value of a query string (`a=1&b=2#frag`), the fragment kept.
fn query(text: &str) -> (String, u32) {
    let mut count = 0;
    let end = text.find('#').unwrap_or(text.len());
    let (query, fragment) = text.split_at(end);
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.find('=') {
            Some(eq) if &pair[eq + 1..] == REDACTED => pair.to_owned(),
            Some(eq) if eq + 1 < pair.len() => {
                count += 1;
                // Keep trailing punctuation that ends the sentence, not the value.
                let value = &pair[eq + 1..];
                let tail: String = value
                    .chars()
                    .rev()
                    .take_while(|c| matches!(c, '"' | '\'' | ',' | ')' | ']' | '>'))
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                format!("{}={REDACTED}{tail}", &pair[..eq])
            }
            _ => pair.to_owned(),
        })
        .collect();
    (format!("{}{fragment}", pairs.join("&")), count)
}

fn is_b64url(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_')
}

/// `eyJ…` header, payload and signature.
fn jwts(token: &str) -> (String, u32) {
    let mut out = String::new();
    let mut rest = token;
    let mut count = 0;
    while let Some(at) = rest.find("eyJ") {
        let candidate = &rest[at..];
        let len = candidate
            .find(|c: char| !is_b64url(c) && c != '.')
            .unwrap_or(candidate.len());
        let jwt = &candidate[..len];
        let parts: Vec<&str> = jwt.split('.').collect();
        out.push_str(&rest[..at]);
        if parts.len() >= 3 && parts[0].len() >= 8 && parts[1].len() >= 4 {
            out.push_str(REDACTED);
            count += 1;
        } else {
            out.push_str(jwt);
        }
        rest = &candidate[len..];
    }
    out.push_str(rest);
    (out, count)
}

/// Keys with a well-known prefix, at the start of the token or after punctuation.
fn prefixed_keys(token: &str) -> (String, u32) {
    let mut out = String::with_capacity(token.len());
    let mut count = 0;
    let mut i = 0;
    let bytes = token.as_bytes();
    while i < token.len() {
        let boundary = i == 0 || !is_key_char(char::from(bytes[i - 1]));
        let hit = boundary
            .then(|| {
                KEY_PREFIXES
                    .iter()
                    .find(|p| token[i..].starts_with(*p))
                    .and_then(|p| {
                        let body = &token[i + p.len()..];
                        let n = body.find(|c: char| !is_key_char(c)).unwrap_or(body.len());
                        (n >= 16).then_some(p.len() + n)
                    })
            })
            .flatten();
        match hit {
            Some(len) => {
                out.push_str(REDACTED);
                count += 1;
                i += len;
            }
            None => {
                let c = token[i..].chars().next().unwrap_or(' ');
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    (out, count)
}

/// 40 or more base64 characters with letters and digits both: a key's body, a PEM line, a
/// secret blob. Plain words and hex hashes shorter than that stay.
fn is_base64_run(text: &str) -> bool {
    text.len() >= 40
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '-' | '_'))
        && text.chars().any(|c| c.is_ascii_digit())
        && text.chars().any(|c| c.is_ascii_alphabetic())
        && !text.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> String {
        Redactor::new(["gateway-password-123".to_owned()])
            .line(line)
            .text
    }

    #[test]
    fn each_rule_replaces_its_value_and_keeps_the_rest() {
        assert_eq!(
            one("auth Authorization: Bearer abc.def.ghi done"),
            "auth Authorization: Bearer [REDACTED] done"
        );
        assert_eq!(
            one("key sk-proj-ABCDEFGHIJKLMNOPQRSTUV used"),
            "key [REDACTED] used"
        );
        assert_eq!(
            one("fetch https://api.example.com/v1?key=s3cr3t&x=1 ok"),
            "fetch https://api.example.com/v1?key=[REDACTED]&x=[REDACTED] ok"
        );
        assert_eq!(
            one("get https://x.example/v1?api_key=s3cr3t&page=2 now"),
            "get https://x.example/v1?api_key=[REDACTED]&page=[REDACTED] now"
        );
        assert_eq!(
            one("db postgres://app:hunter2@db:5432/x"),
            "db postgres://app:[REDACTED]@db:5432/x"
        );
        assert_eq!(
            one("env OPENAI_API_KEY=abc123 HOME=/x"),
            "env OPENAI_API_KEY=[REDACTED] HOME=/x"
        );
        assert_eq!(
            one(r#"{"apiKey":"v1","name":"n"}"#),
            r#"{"apiKey":"[REDACTED]","name":"n"}"#
        );
        assert_eq!(
            one(r#"password: "abc", ok"#),
            r#"password: "[REDACTED]", ok"#
        );
        assert_eq!(
            one("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig_nature-x end"),
            "jwt [REDACTED] end"
        );
        assert_eq!(one("pw is gateway-password-123!"), "pw is [REDACTED]!");
        assert_eq!(
            one("plain words stay as they are"),
            "plain words stay as they are"
        );
        assert_eq!(
            one(r#"{"authorization":"Bearer xyz123","n":1}"#),
            r#"{"authorization":"Bearer [REDACTED]","n":1}"#
        );
        assert_eq!(
            one("GET /v1/x?key=abc&sig=def HTTP/1.1"),
            "GET /v1/x?key=[REDACTED]&sig=[REDACTED] HTTP/1.1"
        );
        assert_eq!(one("what? yes"), "what? yes");
        assert_eq!(
            one("sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn pem_blocks_go_in_one_entry_and_across_entries() {
        let mut r = Redactor::new([]);
        let one_entry =
            r.line("key: -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY----- after");
        assert_eq!(one_entry.text, "key: [REDACTED] after");
        let lines = [
            "-----BEGIN OPENSSH PRIVATE KEY-----",
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",
            "short",
            "-----END OPENSSH PRIVATE KEY-----",
            "next line",
        ];
        let out: Vec<String> = lines.iter().map(|l| r.line(l).text).collect();
        assert_eq!(
            out,
            [
                "[REDACTED]",
                "[REDACTED]",
                "[REDACTED]",
                "[REDACTED]",
                "next line"
            ]
        );
        // A PEM body line met without its BEGIN (a page that starts inside a block).
        assert_eq!(
            Redactor::new([])
                .line("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC")
                .text,
            "[REDACTED]"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_text_is_redacted_without_a_panic(text in "\\PC{0,200}", pem in proptest::bool::ANY) {
            let mut r = Redactor::new(["p4ssw0rd-secret".to_owned()]);
            if pem {
                r.line("-----BEGIN KEY-----");
            }
            let out = r.line(&text);
            proptest::prop_assert!(!out.text.contains("p4ssw0rd-secret"));
        }
    }

    #[test]
    fn a_second_pass_changes_nothing() {
        for line in [
            "GET https://api.example.com/v1?api_key=hunter2secret&x=1",
            "env OPENAI_API_KEY=abc123 HOME=/x",
            r#"{"apiKey":"v1","name":"n"}"#,
            "password: \"abc\", ok",
            "Authorization: Bearer abc.def",
            "key sk-proj-ABCDEFGHIJKLMNOPQRSTUV used",
            "db postgres://app:hunter2@db:5432/x",
        ] {
            let once = Redactor::new([]).line(line).text;
            let twice = Redactor::new([]).line(&once);
            assert_eq!(twice.text, once, "{line}");
        }
    }

    #[test]
    fn counts_what_it_replaced_and_ignores_short_secrets() {
        let mut r = Redactor::new(["short".to_owned()]);
        let out = r.line("short Bearer x TOKEN=y");
        assert_eq!(out.text, "short Bearer [REDACTED] TOKEN=[REDACTED]");
        assert_eq!(out.count, 2);
    }
}
