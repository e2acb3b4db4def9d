//! Redaction of log text before it leaves a host or a cluster: the same rules everywhere. hostd applies them to journal lines, the Kubernetes backend to
//! Pod logs, and the coordinator once more to the evidence it stores, so no path depends on
//! another having done it.
//!
//! What is replaced by [`REDACTED`]:
//! - literal secrets the caller names (the Agent's gateway password, its env files' values),
//!   also JSON-escaped or percent-encoded, and their fragments at the edges of a line that
//!   journald cut (see [`Redactor::entry`]);
//! - PEM blocks, also when their lines arrive as separate log entries;
//! - the value of a key with a secret name (`*_KEY`, `*token`, `*secret`, `*password`,
//!   `passwd`, `passphrase`, `credential(s)`, `*_pass`, `auth`, `dsn`; camelCase too) after
//!   `=`, `:`, `=>` or `:=`, with blanks around the separator, quoted (escapes honoured, spaces
//!   kept inside) or not; at the start of a line (env files, YAML) an unquoted value runs to
//!   the line's end; `Authorization` keeps its scheme word and loses the credential, `Cookie`
//!   and `Set-Cookie` lose their whole value;
//! - the credential after `Bearer` and `Basic`;
//! - URL passwords and every URL query value; JWTs; Telegram bot tokens (`123456:AA…`, also
//!   in `/bot…/` paths); Discord tokens; keys with well-known prefixes (`sk-`, `ghp_`, `AKIA`, …);
//! - runs of 40 or more base64 characters mixing upper case, lower case and digits; runs of 40
//!   or more hex digits, except those of a digest's length (40, 56, 64, 96, 128: sha1 to sha512
//!   hashes stay readable).
//!
//! What stays: lower-case names such as Kubernetes objects (`gw-<hex>-<hash>-<id>`, unit names
//! `clawfleet-agent-<hex>`), paths, digests, ordinary words. The corpus
//! `protocol/testdata/redaction-corpus.txt` holds the cases, and every log path runs it.
//!
//! Every rule is a linear scan (no backtracking, no regex): it runs on every log line.

/// What a redacted value becomes.
pub const REDACTED: &str = "[REDACTED]";

/// Literal secrets shorter than this are not searched for (they would match ordinary text).
pub const MIN_SECRET_LEN: usize = 8;

/// A literal secret's prefix at the end of a line, or its suffix at the start of one, is
/// replaced from this many characters on (journald may cut a line inside a secret). Where the
/// reader knows that journald cut the line ([`Redactor::entry`]), any length is.
pub const MIN_FRAGMENT_LEN: usize = 4;

/// Shortest base64 or hex run replaced for its shape alone.
const RUN_MIN: usize = 40;

/// Lengths of hex digests (sha1, sha224, sha256, sha384, sha512): such runs are hashes.
const DIGEST_HEX_LENGTHS: &[usize] = &[40, 56, 64, 96, 128];

/// Labels before a base64 digest (`SHA256:` fingerprints, `sha512-` integrity values).
const DIGEST_LABELS: &[&str] = &[
    "sha1:", "sha256:", "sha384:", "sha512:", "sha1-", "sha256-", "sha384-", "sha512-",
];

/// Prefixes of API keys and tokens that are secret whatever surrounds them.
const KEY_PREFIXES: &[&str] = &[
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "rk_test_",
    "whsec_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "glptt-",
    "gldt-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxe-",
    "xoxs-",
    "xapp-",
    "AKIA",
    "ASIA",
    "AIza",
    "hf_",
    "npm_",
    "pypi-",
    "ya29.",
    "SG.",
    "shpat_",
    "shpss_",
    "dop_v1_",
    "doo_v1_",
    "gsk_",
    "pplx-",
    "nvapi-",
    "tvly-",
    "r8_",
    "dckr_pat_",
    "AGE-SECRET-KEY-",
];

/// Name endings (after normalising to `snake_case`) whose value is secret.
const SECRET_NAME_ENDINGS: &[&str] = &[
    "_key",
    "_keys",
    "apikey",
    "token",
    "secret",
    "password",
    "passwords",
    "passwd",
    "passphrase",
    "credential",
    "credentials",
    "_pass",
    "_auth",
    "_dsn",
];

/// Whole names whose value is secret.
const SECRET_NAMES: &[&str] = &["auth", "dsn", "pass", "pwd"];

/// Names that end like a secret one but are not (`publicKey`, `primary_key`).
const NOT_SECRET_ENDINGS: &[&str] = &[
    "public_key",
    "primary_key",
    "foreign_key",
    "sort_key",
    "partition_key",
    "cache_key",
    "key_key",
];

/// Values of a secret-named key that are not secrets.
const PLAIN_VALUES: &[&str] = &["null", "true", "false", "none", "nil", "undefined"];

/// `Authorization` schemes whose credential is one token (others keep the rest of the line).
const ONE_TOKEN_SCHEMES: &[&str] = &["bearer", "basic", "token", "bot", "apikey", "key"];

/// What a secret name's value looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    /// One value.
    Plain,
    /// `<scheme> <credential>`: the scheme stays.
    Authorization,
    /// The whole rest of the header.
    Cookie,
}

/// A key name whose value is secret: `OPENAI_API_KEY`, `apiKey`, `access_token`, `password`…
fn secret_name(name: &str) -> Option<Name> {
    let mut norm = String::with_capacity(name.len() + 4);
    let mut after_lower = false;
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            if after_lower {
                norm.push('_');
            }
            norm.push(c.to_ascii_lowercase());
            after_lower = false;
        } else if c.is_ascii_alphanumeric() {
            norm.push(c);
            after_lower = true;
        } else {
            norm.push('_');
            after_lower = false;
        }
    }
    let norm = norm.trim_matches('_');
    if norm.is_empty() {
        return None;
    }
    if norm == "authorization" || norm.ends_with("_authorization") {
        return Some(Name::Authorization);
    }
    if norm == "cookie" || norm.ends_with("_cookie") {
        return Some(Name::Cookie);
    }
    if NOT_SECRET_ENDINGS.iter().any(|e| norm.ends_with(e)) {
        return None;
    }
    (SECRET_NAMES.contains(&norm) || SECRET_NAME_ENDINGS.iter().any(|e| norm.ends_with(e)))
        .then_some(Name::Plain)
}

/// Whether the redaction rules call a key of this name secret (its value is replaced).
pub fn is_secret_name(name: &str) -> bool {
    secret_name(name).is_some()
}

/// One log line after redaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    pub text: String,
    /// How many values were replaced.
    pub count: u32,
}

/// How a quoted value is closed: its quote character, and 1 when the quote itself is escaped
/// (`\"`, JSON inside a JSON string).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quote {
    ch: u8,
    escaped: bool,
}

/// A secret value that reached the end of an entry journald cut: how it goes on in the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Open {
    #[default]
    None,
    /// A secret name and its separator (or `Bearer`) ended the entry: the value starts the next.
    Value { name: Name, rest: bool },
    /// An unquoted value, or a redacted run, ran to the end: the next entry's first word.
    Word,
    /// The value was the rest of the line: so is the next entry.
    Rest,
    /// A quoted value is still open: the next entry up to its closing quote.
    Quoted(Quote),
}

/// Redacts a sequence of log lines. It carries state from line to line: whether a PEM block
/// is open, so the body lines of a key logged line by line are caught too, and, across an
/// entry journald cut at its line limit, the secret value or literal secret that the cut split.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
    in_pem: bool,
    open: Open,
    /// A literal secret (its index) whose first bytes (this many) ended the previous entry.
    pending: Option<(usize, usize)>,
}

impl Redactor {
    /// A redactor that also replaces each of `secrets` (those of at least
    /// [`MIN_SECRET_LEN`] characters) wherever it appears, also JSON-escaped or
    /// percent-encoded.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut all: Vec<String> = Vec::new();
        for secret in secrets {
            if secret.chars().count() < MIN_SECRET_LEN {
                continue;
            }
            let json = serde_json::to_string(&secret)
                .ok()
                .and_then(|q| Some(q.strip_prefix('"')?.strip_suffix('"')?.to_owned()));
            let percent = percent_encoded(&secret);
            all.extend(json);
            all.push(percent);
            all.push(secret);
        }
        // Longest first, so a secret that contains another is replaced whole.
        all.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        all.dedup();
        Self {
            secrets: all,
            ..Self::default()
        }
    }

    /// Redacts one line (it may hold newlines: one journal entry can).
    pub fn line(&mut self, text: &str) -> Redacted {
        self.entry(text, false)
    }

    /// Redacts one log entry. `cut` says that the writer's line goes on in the next entry
    /// (journald cut it at its line limit, `_LINE_BREAK=line-max`): a secret value or literal
    /// secret that runs to the end of this entry is then also replaced at the start of the
    /// next one, whatever its length.
    pub fn entry(&mut self, text: &str, cut: bool) -> Redacted {
        let (text, literal) = self.literals(text, cut);
        let (text, pem) = self.pem(&text);
        let open = std::mem::take(&mut self.open);
        let (text, pairs, open) = pairs(&text, open);
        let (text, tokens, ends_redacted) = redact_tokens(&text);
        self.open = match open {
            Open::None if cut && ends_redacted => Open::Word,
            _ if cut => open,
            _ => Open::None,
        };
        if !cut {
            self.pending = None;
        }
        Redacted {
            text,
            count: literal
                .saturating_add(pem)
                .saturating_add(pairs)
                .saturating_add(tokens),
        }
    }

    /// Replaces the literal secrets, whole or as fragments at the edges of the line.
    fn literals(&mut self, text: &str, cut: bool) -> (String, u32) {
        if self.secrets.is_empty() {
            return (text.to_owned(), 0);
        }
        let mut ranges = Vec::new();
        let mut pending = None;
        if let Some((i, k)) = self.pending.take()
            && let Some(rest) = self.secrets.get(i).and_then(|s| s.get(k..))
        {
            if text.starts_with(rest) {
                ranges.push((0, rest.len()));
            } else if !text.is_empty() && rest.starts_with(text) {
                // The whole entry lies inside the secret.
                ranges.push((0, text.len()));
                if cut {
                    pending = Some((i, k + text.len()));
                }
            }
        }
        let bytes = text.as_bytes();
        let min_end = if cut { 1 } else { MIN_FRAGMENT_LEN };
        for (i, secret) in self.secrets.iter().enumerate() {
            for (at, m) in text.match_indices(secret.as_str()) {
                ranges.push((at, at + m.len()));
            }
            let sb = secret.as_bytes();
            // Its suffix starting the line (the rest of a secret cut at the previous line's end).
            if let Some(&first) = bytes.first()
                && let Some(j) = (1..sb.len().saturating_sub(MIN_FRAGMENT_LEN - 1)).find(|&j| {
                    sb[j] == first && secret.is_char_boundary(j) && text.starts_with(&secret[j..])
                })
            {
                ranges.push((0, sb.len() - j));
            }
            // Its prefix ending the line.
            if let Some(&last) = bytes.last()
                && let Some(k) = (min_end..sb.len()).rev().find(|&k| {
                    sb[k - 1] == last && secret.is_char_boundary(k) && text.ends_with(&secret[..k])
                })
            {
                ranges.push((text.len() - k, text.len()));
                if cut && pending.is_none_or(|(_, longest)| k > longest) {
                    pending = Some((i, k));
                }
            }
        }
        self.pending = pending;
        replace_ranges(text, ranges)
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

/// `%XX` for every byte but the unreserved ones (a secret in a URL or a form).
fn percent_encoded(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The text with each range (merged where they touch) replaced by [`REDACTED`], and how many.
fn replace_ranges(text: &str, mut ranges: Vec<(usize, usize)>) -> (String, u32) {
    if ranges.is_empty() {
        return (text.to_owned(), 0);
    }
    ranges.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut count = 0u32;
    for (s, e) in merged {
        if s >= e || !text.is_char_boundary(s) || !text.is_char_boundary(e) {
            continue;
        }
        out.push_str(&text[copied..s]);
        out.push_str(REDACTED);
        copied = e;
        count = count.saturating_add(1);
    }
    out.push_str(&text[copied..]);
    (out, count)
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// Where an unquoted value ends.
fn ends_value(b: u8) -> bool {
    b.is_ascii_whitespace()
        || matches!(
            b,
            b',' | b';' | b'&' | b'}' | b']' | b')' | b'"' | b'\'' | b'`' | b'<' | b'>' | b'|'
        )
}

/// The scan of a line for secret-named values and `Bearer`/`Basic` credentials.
struct Pairs<'a> {
    text: &'a str,
    b: &'a [u8],
    ranges: Vec<(usize, usize)>,
    open: Open,
}

/// Replaces the values of secret names and the credentials after `Bearer`/`Basic`. `open` is
/// what the previous entry left open; the result says what this one leaves open.
fn pairs(text: &str, open: Open) -> (String, u32, Open) {
    let mut scan = Pairs {
        text,
        b: text.as_bytes(),
        ranges: Vec::new(),
        open: Open::None,
    };
    let mut i = scan.carried(open);
    while i < scan.b.len() {
        i = scan.at(i);
    }
    let (out, count) = replace_ranges(text, scan.ranges);
    (out, count, scan.open)
}

impl Pairs<'_> {
    fn push(&mut self, start: usize, end: usize) {
        if start < end {
            self.ranges.push((start, end));
        }
    }

    fn skip_blanks(&self, mut i: usize) -> usize {
        while i < self.b.len() && is_blank(self.b[i]) {
            i += 1;
        }
        i
    }

    /// The end of the line without its trailing whitespace.
    fn trimmed_end(&self, from: usize) -> usize {
        let mut e = self.b.len();
        while e > from && self.b[e - 1].is_ascii_whitespace() {
            e -= 1;
        }
        e
    }

    fn word_end(&self, from: usize) -> usize {
        self.b[from..]
            .iter()
            .position(|&c| ends_value(c))
            .map_or(self.b.len(), |p| from + p)
    }

    /// What the previous entry left open, applied to the start of this one.
    fn carried(&mut self, open: Open) -> usize {
        match open {
            Open::None => 0,
            Open::Value { name, rest } => self.value(0, name, rest, None),
            Open::Word => {
                let end = self.word_end(0);
                self.push(0, end);
                if end == self.b.len() {
                    self.open = Open::Word;
                }
                end
            }
            Open::Rest => {
                let end = self.trimmed_end(0);
                self.push(0, end);
                self.open = Open::Rest;
                self.b.len()
            }
            Open::Quoted(q) => self.quoted(0, q),
        }
    }

    /// The quoted value whose body starts at `start`; returns where the scan goes on.
    fn quoted(&mut self, start: usize, q: Quote) -> usize {
        match closing(self.b, start, q) {
            Some((end, next)) => {
                self.push(start, end);
                next
            }
            None => {
                self.push(start, self.b.len());
                self.open = Open::Quoted(q);
                self.b.len()
            }
        }
    }

    /// One position of the scan; returns the next.
    fn at(&mut self, i: usize) -> usize {
        let b = self.b;
        let c = b[i];
        if c == b'=' || c == b':' {
            let next = b.get(i + 1).copied();
            let sep_len = match (c, next) {
                (b'=', Some(b'=')) | (b':', Some(b':')) => return i + 2,
                (b':', Some(b'/')) if b.get(i + 2) == Some(&b'/') => return i + 3,
                (b'=', Some(b'>')) | (b':', Some(b'=')) => 2,
                _ => 1,
            };
            if i > 0 && matches!(b[i - 1], b'!' | b'<' | b'>' | b'=') {
                return i + 1;
            }
            let Some((name_start, name_end, head)) = name_before(b, i) else {
                return i + sep_len;
            };
            if self.text[..head].ends_with("://") {
                // `scheme://user:password@host`: the URL rule's.
                return i + sep_len;
            }
            let Some(name) = secret_name(&self.text[name_start..name_end]) else {
                return i + sep_len;
            };
            // A YAML or header line, or an env file's `NAME=value` (a log's `key=value …`
            // pairs aside): an unquoted value is the rest of the line.
            let before = self.text[..head].trim();
            let line_start = before.is_empty() || before == "-" || before == "export";
            let rest = line_start
                && (c == b':'
                    || (self.text[name_start..name_end]
                        .bytes()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
                        && !self.text[i + sep_len..].contains('=')));
            // A header inside a quoted string ends at that string's quote.
            let enclosing = head
                .checked_sub(1)
                .map(|h| b[h])
                .filter(|q| matches!(q, b'"' | b'\'') && head == name_start);
            return self.value(i + sep_len, name, rest, enclosing);
        }
        if (c | 0x20) == b'b' && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) {
            for (scheme, basic) in [("bearer", false), ("basic", true)] {
                let end = i + scheme.len();
                if self
                    .text
                    .get(i..end)
                    .is_some_and(|w| w.eq_ignore_ascii_case(scheme))
                    && (end == b.len() || is_blank(b[end]))
                {
                    let v = self.skip_blanks(end);
                    if v == b.len() {
                        if !basic {
                            self.open = Open::Value {
                                name: Name::Plain,
                                rest: false,
                            };
                        }
                        return v;
                    }
                    if self.text[v..].starts_with(REDACTED) {
                        return v + REDACTED.len();
                    }
                    let value_end = self.word_end(v);
                    let value = &self.text[v..value_end];
                    if basic && !looks_like_basic(value) {
                        return end;
                    }
                    self.push(v, value_end);
                    if value_end == b.len() {
                        self.open = Open::Word;
                    }
                    return value_end;
                }
            }
        }
        i + 1
    }

    /// The value of a secret name, from `v` (blanks first); returns where the scan goes on.
    fn value(&mut self, v: usize, name: Name, rest: bool, enclosing: Option<u8>) -> usize {
        let b = self.b;
        let v = self.skip_blanks(v);
        if v >= b.len() {
            self.open = Open::Value { name, rest };
            return v;
        }
        let quote = match (b[v], b.get(v + 1)) {
            (b'"' | b'\'', _) => Some(Quote {
                ch: b[v],
                escaped: false,
            }),
            (b'\\', Some(b'"')) => Some(Quote {
                ch: b'"',
                escaped: true,
            }),
            _ => None,
        };
        let mut start = v + quote.map_or(0, |q| if q.escaped { 2 } else { 1 });
        let mut one_token = true;
        if name == Name::Authorization {
            let (after, scheme) = after_scheme(b, start);
            start = after;
            one_token = scheme.is_none_or(|s| ONE_TOKEN_SCHEMES.contains(&s.as_str()));
            if start >= b.len() {
                // `Authorization: Bearer` and the cut: the credential starts the next entry.
                self.open = Open::Value {
                    name: Name::Plain,
                    rest: false,
                };
                return start;
            }
        }
        if let Some(q) = quote {
            if self.text[start..].starts_with(REDACTED)
                && closing(b, start, q).is_none_or(|(end, _)| end == start + REDACTED.len())
            {
                return start + REDACTED.len();
            }
            return self.quoted(start, q);
        }
        let to_rest = match name {
            Name::Cookie => true,
            Name::Authorization => !one_token,
            Name::Plain => rest,
        };
        if self.text[start..].starts_with(REDACTED) {
            // Already redacted (a literal secret, a second pass); in a value that is the rest
            // of the line, what follows it goes too.
            let after = start + REDACTED.len();
            if to_rest && enclosing.is_none() && self.trimmed_end(after) > after {
                self.push(start, self.trimmed_end(start));
                return b.len();
            }
            return after;
        }
        match b.get(start) {
            None => return start,
            Some(b'{') => return start + 1,
            Some(b'[') => {
                let end = b[start..]
                    .iter()
                    .position(|&c| c == b']')
                    .map_or(b.len(), |p| start + p);
                self.push(start + 1, end);
                return end;
            }
            _ => {}
        }
        let end = match (to_rest, enclosing) {
            (_, Some(q)) if to_rest || name != Name::Plain => b[start..]
                .iter()
                .position(|&c| c == q)
                .map_or(self.trimmed_end(start), |p| start + p),
            (true, _) => self.trimmed_end(start),
            (false, _) => self.word_end(start),
        };
        let word = &self.text[start..end];
        if word == REDACTED || PLAIN_VALUES.iter().any(|p| word.eq_ignore_ascii_case(p)) {
            return end;
        }
        self.push(start, end);
        if end == b.len() {
            self.open = if to_rest { Open::Rest } else { Open::Word };
        }
        end
    }
}

/// The name before the separator at `sep` (blanks and a closing quote skipped): its start,
/// its end, and where it begins with its opening quote.
fn name_before(b: &[u8], sep: usize) -> Option<(usize, usize, usize)> {
    let mut j = sep;
    while j > 0 && is_blank(b[j - 1]) {
        j -= 1;
    }
    let mut quoted = false;
    if j > 0 && matches!(b[j - 1], b'"' | b'\'') {
        j -= 1;
        quoted = true;
        if j > 0 && b[j - 1] == b'\\' {
            j -= 1;
        }
    }
    let end = j;
    while j > 0 && is_name_byte(b[j - 1]) {
        j -= 1;
    }
    if j == end {
        return None;
    }
    let mut head = j;
    if quoted && head > 0 && matches!(b[head - 1], b'"' | b'\'') {
        head -= 1;
        if head > 0 && b[head - 1] == b'\\' {
            head -= 1;
        }
    }
    Some((j, end, head))
}

/// After an `Authorization` scheme word (`Bearer `, `Token `): where the credential starts,
/// and the scheme in lower case; `start` itself when there is no scheme.
fn after_scheme(b: &[u8], start: usize) -> (usize, Option<String>) {
    let word = b[start..]
        .iter()
        .take_while(|c| c.is_ascii_alphabetic() || **c == b'-')
        .count();
    let mut v = start + word;
    if !(2..=20).contains(&word) {
        return (start, None);
    }
    let scheme = String::from_utf8_lossy(&b[start..start + word]).to_ascii_lowercase();
    if v >= b.len() {
        // A known scheme alone at the end (a cut line): the credential comes next.
        return if ONE_TOKEN_SCHEMES.contains(&scheme.as_str()) {
            (v, Some(scheme))
        } else {
            (start, None)
        };
    }
    if !is_blank(b[v]) {
        return (start, None);
    }
    while v < b.len() && is_blank(b[v]) {
        v += 1;
    }
    if v >= b.len() || ends_value(b[v]) {
        return (start, None);
    }
    (v, Some(scheme))
}

/// The credential after `Basic`: base64 of `user:password`, not an ordinary word.
fn looks_like_basic(value: &str) -> bool {
    value.len() >= 8
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
        && value.bytes().skip(1).any(|c| {
            c.is_ascii_digit() || c.is_ascii_uppercase() || matches!(c, b'+' | b'/' | b'=')
        })
}

/// The end of a quoted value's body from `from`, and where the scan goes on after the quote.
/// A quote preceded by an odd number of backslashes is part of the value; for an escaped
/// quote (`\"…\"`) the closing one is `\"` (and a bare `"` ends the enclosing string).
fn closing(b: &[u8], from: usize, q: Quote) -> Option<(usize, usize)> {
    let mut i = from;
    while i < b.len() {
        if b[i] == q.ch {
            let mut n = 0;
            while i - n > from && b[i - n - 1] == b'\\' {
                n += 1;
            }
            if q.escaped {
                if n <= 1 {
                    return Some((i - n, i + 1));
                }
            } else if n % 2 == 0 {
                return Some((i, i + 1));
            }
        }
        i += 1;
    }
    None
}

/// Redacts the values the token rules find, keeping all whitespace as it was. Also says
/// whether the line ends inside what was redacted (for a line journald cut).
fn redact_tokens(text: &str) -> (String, u32, bool) {
    let mut out = String::with_capacity(text.len());
    let mut count = 0u32;
    let mut start = None;
    let mut last_redacted = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                let (redacted, n) = redact_token(&text[s..i]);
                out.push_str(&redacted);
                count = count.saturating_add(n);
            }
            out.push(c);
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        let (redacted, n) = redact_token(&text[s..]);
        last_redacted = n > 0 && redacted.ends_with(REDACTED);
        out.push_str(&redacted);
        count = count.saturating_add(n);
    }
    (out, count, last_redacted)
}

/// One whitespace-free token: the redacted text and how many values went.
fn redact_token(token: &str) -> (String, u32) {
    let mut count = 0;
    let mut text = token.to_owned();
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
    for rule in [telegram, jwts, discord, prefixed_keys, runs] {
        let (redacted, n) = rule(&text);
        text = redacted;
        count += n;
    }
    (text, count)
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
            Some(colon) if &authority[colon + 1..at] != REDACTED && colon + 1 < at => {
                count += 1;
                format!("{}:{REDACTED}{}", &authority[..colon], &authority[at..])
            }
            _ => authority.to_owned(),
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
            Some(eq) if pair[eq + 1..].starts_with(REDACTED) => pair.to_owned(),
            Some(eq) if eq + 1 < pair.len() => {
                // Keep trailing punctuation that ends the sentence, not the value.
                let value = &pair[eq + 1..];
                let kept = value
                    .trim_end_matches(['"', '\'', ',', ')', ']', '>'])
                    .len();
                if kept == 0 {
                    return pair.to_owned();
                }
                count += 1;
                format!("{}={REDACTED}{}", &pair[..eq], &value[kept..])
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

/// Telegram bot tokens: 6 to 12 digits, `:`, 30 or more base64url characters (also as in
/// `/bot123456:AA…/sendMessage`, where `bot` stays).
fn telegram(token: &str) -> (String, u32) {
    let b = token.as_bytes();
    let mut ranges = Vec::new();
    let mut i = 0;
    while let Some(p) = b[i..].iter().position(|&c| c == b':') {
        let colon = i + p;
        let digits = b[..colon]
            .iter()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let body = b[colon + 1..]
            .iter()
            .take_while(|c| is_b64url(char::from(**c)))
            .count();
        if (6..=12).contains(&digits) && body >= 30 {
            ranges.push((colon - digits, colon + 1 + body));
            i = colon + 1 + body;
        } else {
            i = colon + 1;
        }
    }
    replace_ranges(token, ranges)
}

/// Discord tokens: base64 of the user id (20 to 32 characters), `.`, a 5 to 7 character
/// timestamp, `.`, an HMAC of 25 or more characters.
fn discord(token: &str) -> (String, u32) {
    let b = token.as_bytes();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let run = b[i..]
            .iter()
            .take_while(|c| is_b64url(char::from(**c)) || **c == b'.')
            .count();
        if run == 0 {
            i += 1;
            continue;
        }
        let text = &token[i..i + run];
        let parts: Vec<&str> = text.split('.').collect();
        let mut offset = 0;
        for w in 0..parts.len() {
            if let &[a, t, h] = &parts[w..(w + 3).min(parts.len())] {
                let mixed = |s: &str| {
                    s.bytes().any(|c| c.is_ascii_digit())
                        && s.bytes().any(|c| c.is_ascii_uppercase())
                };
                if (20..=32).contains(&a.len())
                    && (5..=7).contains(&t.len())
                    && h.len() >= 25
                    && mixed(a)
                {
                    let start = i + offset;
                    ranges.push((start, start + a.len() + t.len() + h.len() + 2));
                }
            }
            offset += parts[w].len() + 1;
        }
        i += run;
    }
    replace_ranges(token, ranges)
}

/// Characters a key after a prefix is made of.
fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
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

fn is_base64(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'-' | b'_')
}

/// Long base64 runs that mix upper case, lower case and digits (a key's body, a PEM line, a
/// secret blob), and long hex runs that are not a digest's length. Lower-case names
/// (`clawfleet-agent-<hex>`, Pod names), digests (`SHA256:…`) and paths of words stay; in a
/// path, each segment is judged on its own.
fn runs(token: &str) -> (String, u32) {
    let b = token.as_bytes();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let len = b[i..].iter().take_while(|c| is_base64(**c)).count();
        if len == 0 {
            i += 1;
            continue;
        }
        let run = &b[i..i + len];
        let padding = b[i + len..]
            .iter()
            .take(2)
            .take_while(|c| **c == b'=')
            .count();
        let digest = DIGEST_LABELS.iter().any(|l| {
            let l = l.as_bytes();
            (i >= l.len() && b[i - l.len()..i].eq_ignore_ascii_case(l))
                || (run.len() > l.len() && run[..l.len()].eq_ignore_ascii_case(l))
        });
        let is_path = run.contains(&b'/')
            && run
                .split(|c| *c == b'/')
                .any(|s| s.len() >= 3 && s.iter().all(u8::is_ascii_lowercase));
        if digest {
            // A digest stays.
        } else if is_path {
            let mut at = i;
            for segment in run.split(|c| *c == b'/') {
                ranges.extend(shape(segment, 0).into_iter().map(|(s, e)| (at + s, at + e)));
                at += segment.len() + 1;
            }
        } else {
            ranges.extend(shape(run, padding).into_iter().map(|(s, e)| (i + s, i + e)));
        }
        i += len + padding;
    }
    replace_ranges(token, ranges)
}

/// What of one base64 run is secret by its shape: all of it (with its `padding`) when it
/// mixes upper case, lower case and digits, else its long hex pieces that are not a digest.
fn shape(run: &[u8], padding: usize) -> Vec<(usize, usize)> {
    let mixed = run.iter().any(u8::is_ascii_uppercase)
        && run.iter().any(u8::is_ascii_lowercase)
        && run.iter().any(u8::is_ascii_digit);
    if run.len() >= RUN_MIN && mixed {
        return vec![(0, run.len() + padding)];
    }
    let mut out = Vec::new();
    let mut j = 0;
    while j < run.len() {
        let piece = run[j..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric())
            .count();
        if piece == 0 {
            j += 1;
            continue;
        }
        let p = &run[j..j + piece];
        let hex = p.strip_prefix(b"0x").unwrap_or(p);
        if hex.len() >= RUN_MIN
            && hex.iter().all(u8::is_ascii_hexdigit)
            && !DIGEST_HEX_LENGTHS.contains(&hex.len())
        {
            out.push((j, j + piece));
        }
        j += piece;
    }
    out
}

/// The redaction corpus, `protocol/testdata/redaction-corpus.txt`: realistic log lines and
/// what each must become. protocol, hostd's and the Kubernetes backend's log paths run it.
///
/// Its format, one line each: `@ value` a literal secret (the Agent's password, an env
/// value) for every case; `< text` an entry; `<+ text` an entry journald cut at its line
/// limit (the line goes on in the next); `> text` what the entry before must become;
/// `= text` an entry that must stay as it is; `#` a comment. A blank line ends a case: the
/// entries of one case are read by one reader, in order.
pub mod corpus {
    /// The corpus file.
    pub const TEXT: &str = include_str!("../testdata/redaction-corpus.txt");

    /// One entry of a case and what it must become.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Entry {
        /// Line number in the corpus file, for messages.
        pub line: usize,
        pub input: String,
        /// journald cut this entry: the line goes on in the next.
        pub cut: bool,
        pub expected: String,
    }

    /// The corpus: its literal secrets and its cases.
    #[derive(Debug, Clone, Default)]
    pub struct Corpus {
        pub secrets: Vec<String>,
        pub cases: Vec<Vec<Entry>>,
    }

    /// Parses a corpus text; an error names the line that does not fit the format.
    pub fn parse(text: &str) -> Result<Corpus, String> {
        let mut corpus = Corpus::default();
        let mut case: Vec<Entry> = Vec::new();
        let mut input: Option<(usize, String, bool)> = None;
        for (n, line) in text.lines().enumerate() {
            let n = n + 1;
            let body = |tag: &str| {
                let rest = &line[tag.len()..];
                rest.strip_prefix(' ').unwrap_or(rest).to_owned()
            };
            if line.is_empty() {
                if let Some((at, _, _)) = input.take() {
                    return Err(format!("line {at}: an entry without its `>` line"));
                }
                if !case.is_empty() {
                    corpus.cases.push(std::mem::take(&mut case));
                }
            } else if line.starts_with('#') {
            } else if line.starts_with('@') {
                corpus.secrets.push(body("@"));
            } else if line.starts_with("<+") || line.starts_with('<') || line.starts_with('=') {
                if let Some((at, _, _)) = input.take() {
                    return Err(format!("line {at}: an entry without its `>` line"));
                }
                let (tag, cut) = if line.starts_with("<+") {
                    ("<+", true)
                } else {
                    (&line[..1], false)
                };
                if tag == "=" {
                    case.push(Entry {
                        line: n,
                        input: body(tag),
                        cut,
                        expected: body(tag),
                    });
                } else {
                    input = Some((n, body(tag), cut));
                }
            } else if line.starts_with('>') {
                let Some((at, text, cut)) = input.take() else {
                    return Err(format!("line {n}: a `>` line without its entry"));
                };
                case.push(Entry {
                    line: at,
                    input: text,
                    cut,
                    expected: body(">"),
                });
            } else {
                return Err(format!("line {n}: starts with none of @ < <+ > = #"));
            }
        }
        if let Some((at, _, _)) = input {
            return Err(format!("line {at}: an entry without its `>` line"));
        }
        if !case.is_empty() {
            corpus.cases.push(case);
        }
        Ok(corpus)
    }

    /// The corpus file, parsed.
    pub fn load() -> Result<Corpus, String> {
        parse(TEXT)
    }

    /// Runs every case through `redact` (a fresh reader per case, given the corpus's
    /// secrets; it gets each entry's text and cut flag) and lists every entry whose result is
    /// not the expected one, or that shows a literal secret.
    pub fn mismatches<R>(
        corpus: &Corpus,
        mut reader: impl FnMut(&[String]) -> R,
        mut redact: impl FnMut(&mut R, &str, bool) -> String,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for case in &corpus.cases {
            let mut r = reader(&corpus.secrets);
            for e in case {
                let got = redact(&mut r, &e.input, e.cut);
                if got != e.expected {
                    out.push(format!(
                        "line {}:\n  input:    {}\n  expected: {}\n  got:      {}",
                        e.line, e.input, e.expected, got
                    ));
                }
                if let Some(s) = corpus.secrets.iter().find(|s| got.contains(s.as_str())) {
                    out.push(format!(
                        "line {}: the secret {s:?} shows in {got:?}",
                        e.line
                    ));
                }
            }
        }
        out
    }
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
    fn the_corpus_passes() {
        let corpus = corpus::load().unwrap();
        let bad = corpus::mismatches(
            &corpus,
            |secrets| Redactor::new(secrets.iter().cloned()),
            |r, text, cut| r.entry(text, cut).text,
        );
        assert!(
            bad.is_empty(),
            "{} of the corpus fail:\n{}",
            bad.len(),
            bad.join("\n")
        );
        let entries = corpus.cases.iter().map(Vec::len).sum::<usize>();
        assert!(entries >= 300, "{entries}");
    }

    /// Every rule is a linear scan: 200 KB lines built to make a scanner go back and forth
    /// take well under a second each here (the old rules took 670 s for 100 KB of `1:`).
    #[test]
    fn hostile_long_lines_take_linear_time() {
        let mut r = Redactor::new(["gateway-password-123".to_owned()]);
        for line in [
            "1:".repeat(100_000),
            ":=:\"\\".repeat(40_000),
            "password=\"a\" ".repeat(20_000),
            "password=".repeat(20_000),
            "Authorization: ".repeat(10_000),
            "eyJ.".repeat(50_000),
            "123456:".repeat(30_000),
            "a.".repeat(100_000),
        ] {
            let t = std::time::Instant::now();
            r.line(&line);
            let took = t.elapsed();
            assert!(
                took < std::time::Duration::from_secs(10),
                "{took:?} for {}…",
                &line[..20]
            );
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
