//! File SecretRefs, resolved the way OpenClaw 2026.9.6's `file` secret provider resolves them
//! (`src/secrets/resolve.ts` and `@openclaw/fs-safe`'s `readSecureFile`; see the crate README),
//! and env SecretRefs (the coordinator renders `gateway.auth.password` as one).
//!
//! - [`parse_spec`] reads `secrets.providers` and every SecretRef in the configuration (pure; its
//!   errors are configuration errors, exit 78). `exec` and `store` are refused.
//! - [`resolve`] reads each provider's file once with the same refusals and messages as OpenClaw
//!   (symlink, not a regular file, hard link, too large, group/world readable or writable, not
//!   owned by the effective uid) and builds a [`Snapshot`].
//! - [`Runtime`] holds the active snapshot, swaps it atomically on a successful reload and keeps
//!   the last good one on failure.
//!
//! Values never leave this module except through [`Runtime::value_at`] (the gateway's own password
//! check); everything reported is a `sha256:` fingerprint.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::config::sha256_hex;

/// The only ref id a `singleValue` file provider accepts (OpenClaw's `SINGLE_VALUE_FILE_REF_ID`).
pub const SINGLE_VALUE_ID: &str = "value";
/// OpenClaw's default and largest `maxBytes` for a file provider.
const DEFAULT_MAX_BYTES: u64 = 1024 * 1024;
const LIMIT_MAX_BYTES: u64 = 20 * 1024 * 1024;
/// OpenClaw's largest `timeoutMs` (accepted and validated; local reads are not timed).
const LIMIT_TIMEOUT_MS: u64 = 120_000;
/// The settings a file provider entry may carry (OpenClaw's schema is strict).
const FILE_PROVIDER_KEYS: [&str; 5] = ["source", "path", "mode", "timeoutMs", "maxBytes"];
/// The settings an env provider entry may carry.
const ENV_PROVIDER_KEYS: [&str; 2] = ["source", "allowlist"];
/// The sources a SecretRef can name; `file` and `env` are resolved here.
const REF_SOURCES: [&str; 4] = ["env", "file", "exec", "store"];
/// The built-in env provider's alias unless `secrets.defaults.env` names another.
const DEFAULT_ENV_ALIAS: &str = "default";

/// Where a SecretRef's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    File,
    Env,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Env => "env",
        }
    }
}

/// `^[A-Z][A-Z0-9_]{0,127}$` (OpenClaw's env SecretRef id).
pub fn is_valid_env_ref_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some('A'..='Z'))
        && id.len() <= 128
        && chars.all(|c| matches!(c, 'A'..='Z' | '0'..='9' | '_'))
}

/// How a file provider turns its file into values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A JSON object; ref ids are JSON pointers into it (the default).
    Json,
    /// The whole file is one value, ref id `"value"`.
    SingleValue,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Json => "json",
            Mode::SingleValue => "singleValue",
        }
    }
}

/// One `secrets.providers.<name>` entry with `source: "file"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProvider {
    pub name: String,
    /// After `~` expansion; absolute paths are checked when the file is read, as OpenClaw does.
    pub path: PathBuf,
    pub mode: Mode,
    pub max_bytes: u64,
}

/// One distinct SecretRef `{source, provider, id}` and where it appears in the configuration
/// (JSON paths such as `channels.slack.botToken`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub source: Source,
    pub provider: String,
    pub id: String,
    pub paths: Vec<String>,
}

impl SecretRef {
    /// OpenClaw's ref key: `<source>:<provider>:<id>`.
    pub fn key(&self) -> String {
        format!("{}:{}:{}", self.source.as_str(), self.provider, self.id)
    }
}

/// What the configuration asks for: providers by name and the refs in order of appearance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub providers: BTreeMap<String, FileProvider>,
    /// `source: "env"` providers by name, with their optional allowlist.
    pub env_providers: BTreeMap<String, Option<Vec<String>>>,
    /// `secrets.defaults.env`, or `default`.
    pub default_env_alias: String,
    pub refs: Vec<SecretRef>,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            providers: BTreeMap::new(),
            env_providers: BTreeMap::new(),
            default_env_alias: DEFAULT_ENV_ALIAS.to_owned(),
            refs: Vec::new(),
        }
    }
}

/// `^[a-z][a-z0-9_-]{0,63}$` (OpenClaw's `SECRET_PROVIDER_ALIAS_PATTERN`).
pub fn is_valid_provider_alias(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name.len() <= 64
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
}

/// `"value"` or an absolute JSON pointer whose `~` escapes are `~0`/`~1` only
/// (OpenClaw's `isValidFileSecretRefId`).
pub fn is_valid_file_ref_id(id: &str) -> bool {
    if id == SINGLE_VALUE_ID {
        return true;
    }
    let Some(rest) = id.strip_prefix('/') else {
        return false;
    };
    rest.split('/').all(|segment| {
        let mut chars = segment.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return false;
            }
        }
        true
    })
}

/// Reads `secrets.providers` and every SecretRef in the configuration. `home` expands a leading
/// `~` in a provider path, like OpenClaw's `resolveUserPath`. Errors are sentences naming the field.
pub fn parse_spec(root: &Map<String, Value>, home: Option<&str>) -> Result<Spec, String> {
    let mut spec = Spec::default();
    match root.get("secrets") {
        None => {}
        Some(Value::Object(secrets)) => {
            match secrets.get("providers") {
                None => {}
                Some(Value::Object(providers)) => {
                    for (name, entry) in providers {
                        match parse_provider(name, entry, home)? {
                            Provider::File(p) => {
                                spec.providers.insert(name.clone(), p);
                            }
                            Provider::Env(allowlist) => {
                                spec.env_providers.insert(name.clone(), allowlist);
                            }
                        }
                    }
                }
                Some(_) => return Err("secrets.providers is not a JSON object".into()),
            }
            let default_env = secrets
                .get("defaults")
                .and_then(|d| d.get("env"))
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|a| !a.is_empty());
            if let Some(alias) = default_env {
                spec.default_env_alias = alias.to_owned();
            }
        }
        Some(_) => return Err("secrets is not a JSON object".into()),
    }
    let mut found: Vec<SecretRef> = Vec::new();
    for (key, value) in root {
        if key == "secrets" || key == crate::config::SWITCHES_KEY {
            continue;
        }
        collect_refs(value, key.clone(), &mut found)?;
    }
    spec.refs = found;
    Ok(spec)
}

/// A parsed `secrets.providers` entry.
enum Provider {
    File(FileProvider),
    Env(Option<Vec<String>>),
}

fn parse_provider(name: &str, entry: &Value, home: Option<&str>) -> Result<Provider, String> {
    let field = format!("secrets.providers.{name}");
    if !is_valid_provider_alias(name) {
        return Err(format!(
            "{field}: the provider name must match ^[a-z][a-z0-9_-]{{0,63}}$"
        ));
    }
    let Value::Object(map) = entry else {
        return Err(format!("{field} is not a JSON object"));
    };
    let source = map.get("source").and_then(Value::as_str).ok_or_else(|| {
        format!("{field}.source must be one of \"env\", \"file\", \"exec\", \"store\"")
    })?;
    if source == "env" {
        if let Some(other) = map
            .keys()
            .find(|k| !ENV_PROVIDER_KEYS.contains(&k.as_str()))
        {
            return Err(format!(
                "{field}.{other} is not an env provider setting (known: {})",
                ENV_PROVIDER_KEYS.join(", ")
            ));
        }
        let allowlist = match map.get("allowlist") {
            None => None,
            Some(Value::Array(items)) if items.len() <= 256 => Some(
                items
                    .iter()
                    .map(|i| {
                        i.as_str()
                            .filter(|s| is_valid_env_ref_id(s))
                            .map(str::to_owned)
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        format!(
                            "{field}.allowlist must hold names matching ^[A-Z][A-Z0-9_]{{0,127}}$"
                        )
                    })?,
            ),
            Some(_) => {
                return Err(format!(
                    "{field}.allowlist must be an array of at most 256 names"
                ));
            }
        };
        return Ok(Provider::Env(allowlist));
    }
    if source != "file" {
        return Err(format!(
            "{field}.source is \"{source}\": the test gateway resolves only file and env providers"
        ));
    }
    if let Some(other) = map
        .keys()
        .find(|k| !FILE_PROVIDER_KEYS.contains(&k.as_str()))
    {
        return Err(format!(
            "{field}.{other} is not a file provider setting (known: {})",
            FILE_PROVIDER_KEYS.join(", ")
        ));
    }
    let raw_path = map
        .get("path")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| format!("{field}.path must be a non-empty string"))?;
    let mode = match map.get("mode") {
        None => Mode::Json,
        Some(Value::String(m)) if m == "json" => Mode::Json,
        Some(Value::String(m)) if m == "singleValue" => Mode::SingleValue,
        Some(_) => return Err(format!("{field}.mode must be \"json\" or \"singleValue\"")),
    };
    let positive = |key: &str, limit: u64| -> Result<Option<u64>, String> {
        match map.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=limit).contains(n))
                .map(Some)
                .ok_or_else(|| format!("{field}.{key} must be an integer between 1 and {limit}")),
        }
    };
    positive("timeoutMs", LIMIT_TIMEOUT_MS)?;
    let max_bytes = positive("maxBytes", LIMIT_MAX_BYTES)?.unwrap_or(DEFAULT_MAX_BYTES);
    Ok(Provider::File(FileProvider {
        name: name.to_owned(),
        path: expand_home(raw_path, home),
        mode,
        max_bytes,
    }))
}

fn expand_home(path: &str, home: Option<&str>) -> PathBuf {
    match (path, home) {
        ("~", Some(h)) => PathBuf::from(h),
        (p, Some(h)) if p.starts_with("~/") => Path::new(h).join(&p[2..]),
        (p, _) => PathBuf::from(p),
    }
}

/// Depth-first walk; an object with a string `source` naming a SecretRef source and a `provider`
/// or `id` key is a SecretRef and must be exactly `{source, provider, id}`.
fn collect_refs(value: &Value, path: String, out: &mut Vec<SecretRef>) -> Result<(), String> {
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_refs(item, format!("{path}[{i}]"), out)?;
            }
            Ok(())
        }
        Value::Object(map) => {
            let source = map.get("source").and_then(Value::as_str);
            let looks_like_ref = source.is_some_and(|s| REF_SOURCES.contains(&s))
                && (map.contains_key("provider") || map.contains_key("id"));
            if !looks_like_ref {
                for (key, child) in map {
                    collect_refs(child, format!("{path}.{key}"), out)?;
                }
                return Ok(());
            }
            let source = match source.unwrap_or_default() {
                "file" => Source::File,
                "env" => Source::Env,
                other => {
                    return Err(format!(
                        "{path} is a \"{other}\" SecretRef: the test gateway resolves only file and \
                         env SecretRefs"
                    ));
                }
            };
            if map.len() != 3 {
                return Err(format!(
                    "{path}: a SecretRef has exactly the keys source, provider and id"
                ));
            }
            let provider = map
                .get("provider")
                .and_then(Value::as_str)
                .filter(|p| is_valid_provider_alias(p))
                .ok_or_else(|| format!("{path}.provider must match ^[a-z][a-z0-9_-]{{0,63}}$"))?;
            let id = map.get("id").and_then(Value::as_str);
            let id = match source {
                Source::File => id.filter(|id| is_valid_file_ref_id(id)).ok_or_else(|| {
                    format!(
                        "{path}.id: File secret reference id must be an absolute JSON pointer \
                         (example: \"/providers/openai/apiKey\"), or \"value\" for singleValue mode."
                    )
                })?,
                Source::Env => id.filter(|id| is_valid_env_ref_id(id)).ok_or_else(|| {
                    format!(
                        "{path}.id: Env secret reference id must match /^[A-Z][A-Z0-9_]{{0,127}}$/ \
                         (example: \"OPENAI_API_KEY\")."
                    )
                })?,
            };
            match out
                .iter_mut()
                .find(|r| r.source == source && r.provider == provider && r.id == id)
            {
                Some(existing) => existing.paths.push(path),
                None => out.push(SecretRef {
                    source,
                    provider: provider.to_owned(),
                    id: id.to_owned(),
                    paths: vec![path],
                }),
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A resolved value; its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
struct SecretValue(String);

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// `sha256:<64 lowercase hex>` of `bytes`.
pub fn fingerprint(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

#[derive(Debug, Clone)]
struct HeldProvider {
    path: PathBuf,
    mode: Mode,
    /// Of the file's bytes as read (before OpenClaw's decoding and trimming).
    fingerprint: String,
    bytes: usize,
}

#[derive(Debug, Clone)]
struct HeldRef {
    secret_ref: SecretRef,
    /// Of the resolved value, the string the gateway uses.
    fingerprint: String,
    value: SecretValue,
}

/// One successful resolution of every ref: what the gateway uses until the next good reload.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub generation: u64,
    pub loaded_at_unix_ms: u64,
    providers: BTreeMap<String, HeldProvider>,
    refs: Vec<HeldRef>,
}

impl Snapshot {
    /// Fingerprints only: per provider (file bytes) and per ref (resolved value).
    pub fn to_json(&self) -> Value {
        let providers: Map<String, Value> = self
            .providers
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    json!({
                        "source": "file",
                        "path": p.path.to_string_lossy(),
                        "mode": p.mode.as_str(),
                        "fingerprint": p.fingerprint,
                        "bytes": p.bytes,
                    }),
                )
            })
            .collect();
        let refs: Vec<Value> = self
            .refs
            .iter()
            .map(|r| {
                json!({
                    "source": r.secret_ref.source.as_str(),
                    "provider": r.secret_ref.provider,
                    "id": r.secret_ref.id,
                    "paths": r.secret_ref.paths,
                    "fingerprint": r.fingerprint,
                })
            })
            .collect();
        json!({
            "generation": self.generation,
            "loadedAtUnixMs": self.loaded_at_unix_ms,
            "providers": providers,
            "refs": refs,
        })
    }
}

/// Why a ref could not be resolved; `Display` names the ref, where it is used and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveError {
    pub secret_ref: SecretRef,
    pub message: String,
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "secret reference {} (at {}) cannot be resolved: {}",
            self.secret_ref.key(),
            self.secret_ref.paths.join(", "),
            self.message
        )
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Reads an environment variable of the gateway process.
pub type EnvLookup = fn(&str) -> Option<String>;

/// The process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// An env ref's value, like OpenClaw's env provider (the built-in one under the default alias,
/// or a configured one with its allowlist).
fn resolve_env(spec: &Spec, r: &SecretRef, env: EnvLookup) -> Result<String, String> {
    match spec.env_providers.get(&r.provider) {
        Some(Some(allowlist)) if !allowlist.contains(&r.id) => {
            return Err(format!(
                "Environment variable \"{}\" is not allowlisted in secrets.providers.{}.allowlist.",
                r.id, r.provider
            ));
        }
        Some(_) => {}
        None if r.provider == spec.default_env_alias => {}
        None if spec.providers.contains_key(&r.provider) => {
            return Err(format!(
                "Secret provider \"{}\" has source \"file\" but ref requests \"env\".",
                r.provider
            ));
        }
        None => {
            return Err(format!(
                "Secret provider \"{}\" is not configured (ref: {}).",
                r.provider,
                r.key()
            ));
        }
    }
    env(&r.id)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("Environment variable \"{}\" is missing or empty.", r.id))
}

/// Resolves every ref of `spec` as the user `euid`; all or nothing.
pub fn resolve(
    spec: &Spec,
    euid: u32,
    env: EnvLookup,
    generation: u64,
) -> Result<Snapshot, ResolveError> {
    let mut providers: BTreeMap<String, (HeldProvider, Payload)> = BTreeMap::new();
    let mut refs = Vec::with_capacity(spec.refs.len());
    for r in &spec.refs {
        let fail = |message: String| ResolveError {
            secret_ref: r.clone(),
            message,
        };
        if r.source == Source::Env {
            let value = resolve_env(spec, r, env).map_err(&fail)?;
            refs.push(HeldRef {
                secret_ref: r.clone(),
                fingerprint: fingerprint(value.as_bytes()),
                value: SecretValue(value),
            });
            continue;
        }
        let Some(provider) = spec.providers.get(&r.provider) else {
            if spec.env_providers.contains_key(&r.provider) {
                return Err(fail(format!(
                    "Secret provider \"{}\" has source \"env\" but ref requests \"file\".",
                    r.provider
                )));
            }
            return Err(fail(format!(
                "Secret provider \"{}\" is not configured (ref: {}).",
                r.provider,
                r.key()
            )));
        };
        if !providers.contains_key(&r.provider) {
            let label = format!("secrets.providers.{}.path", provider.name);
            let bytes = read_secure_file(&provider.path, &label, provider.max_bytes, euid)
                .map_err(&fail)?;
            let payload = decode_payload(provider, &bytes).map_err(&fail)?;
            let held = HeldProvider {
                path: provider.path.clone(),
                mode: provider.mode,
                fingerprint: fingerprint(&bytes),
                bytes: bytes.len(),
            };
            providers.insert(r.provider.clone(), (held, payload));
        }
        let Some((_, payload)) = providers.get(&r.provider) else {
            return Err(fail("the provider's payload was not kept".into()));
        };
        let value = lookup(provider, payload, &r.id).map_err(&fail)?;
        let value = match value {
            Value::String(s) if !s.is_empty() => s,
            _ => {
                return Err(fail(format!(
                    "Secret reference \"{}\" resolved to a non-string or empty value.",
                    r.key()
                )));
            }
        };
        refs.push(HeldRef {
            secret_ref: r.clone(),
            fingerprint: fingerprint(value.as_bytes()),
            value: SecretValue(value),
        });
    }
    Ok(Snapshot {
        generation,
        loaded_at_unix_ms: unix_ms(),
        providers: providers.into_iter().map(|(k, (p, _))| (k, p)).collect(),
        refs,
    })
}

/// A provider's decoded file: the whole text (singleValue) or the JSON object.
#[derive(Debug)]
enum Payload {
    Text(SecretValue),
    Object(Value),
}

/// UTF-8 (lossy, like Node's `Buffer.toString("utf8")`), one leading BOM dropped; singleValue
/// drops one trailing `\n` or `\r\n`; json must be an object.
fn decode_payload(provider: &FileProvider, bytes: &[u8]) -> Result<Payload, String> {
    let text = String::from_utf8_lossy(bytes);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    match provider.mode {
        Mode::SingleValue => {
            let trimmed = text
                .strip_suffix("\r\n")
                .or_else(|| text.strip_suffix('\n'))
                .unwrap_or(text);
            Ok(Payload::Text(SecretValue(trimmed.to_owned())))
        }
        Mode::Json => {
            let parsed: Value = serde_json::from_str(text).map_err(|e| {
                format!(
                    "File provider \"{}\" payload is not valid JSON: {e}",
                    provider.name
                )
            })?;
            if !parsed.is_object() {
                return Err(format!(
                    "File provider \"{}\" payload is not a JSON object.",
                    provider.name
                ));
            }
            Ok(Payload::Object(parsed))
        }
    }
}

fn lookup(provider: &FileProvider, payload: &Payload, id: &str) -> Result<Value, String> {
    match (provider.mode, payload) {
        (Mode::SingleValue, Payload::Text(text)) => {
            if id != SINGLE_VALUE_ID {
                return Err(format!(
                    "singleValue file provider \"{}\" expects ref id \"{SINGLE_VALUE_ID}\".",
                    provider.name
                ));
            }
            Ok(Value::String(text.0.clone()))
        }
        (Mode::Json, Payload::Object(root)) => read_json_pointer(root, id),
        _ => Err("the provider's payload does not match its mode".into()),
    }
}

/// OpenClaw's `readJsonPointer` with `onMissing: "throw"`, including its lenient
/// `Number.parseInt` for array indexes.
pub fn read_json_pointer(root: &Value, pointer: &str) -> Result<Value, String> {
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(
            "File-backed secret ids must be absolute JSON pointers (for example: \
                    \"/providers/openai/apiKey\")."
                .into(),
        );
    };
    let mut current = root;
    for raw in rest.split('/') {
        let token = raw.replace("~1", "/").replace("~0", "~");
        current = match current {
            Value::Array(items) => {
                let index = parse_int_prefix(&token)
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| *n < items.len());
                match index.and_then(|i| items.get(i)) {
                    Some(v) => v,
                    None => {
                        return Err(format!(
                            "JSON pointer segment \"{token}\" is out of bounds."
                        ));
                    }
                }
            }
            Value::Object(map) => match map.get(&token) {
                Some(v) => v,
                None => return Err(format!("JSON pointer segment \"{token}\" does not exist.")),
            },
            _ => return Err(format!("JSON pointer segment \"{token}\" does not exist.")),
        };
    }
    Ok(current.clone())
}

/// JavaScript's `Number.parseInt(s, 10)`: leading whitespace, a sign, then digits; `None` for NaN.
fn parse_int_prefix(s: &str) -> Option<i64> {
    let s = s.trim_start();
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let n: i64 = digits[..end].parse().ok()?;
    Some(if negative { -n } else { n })
}

/// `@openclaw/fs-safe`'s `readSecureFile` for a file provider (no insecure allowance, no
/// symlinks), same order and messages: absolute path, lstat, not a symlink, a regular file, open
/// with `O_NOFOLLOW`, one link, the same inode as the path, at most `max_bytes`, neither group
/// nor world readable/writable, owned by `euid`, and still one link after the read.
pub fn read_secure_file(
    path: &Path,
    label: &str,
    max_bytes: u64,
    euid: u32,
) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = path.display();
    if !path.is_absolute() {
        return Err(format!("{label} must be an absolute path."));
    }
    let before =
        std::fs::symlink_metadata(path).map_err(|_| format!("{label} is not readable: {shown}"))?;
    if before.file_type().is_symlink() {
        return Err(format!("{label} must not be a symlink: {shown}"));
    }
    if !before.is_file() {
        return Err(format!("{label} must be a file: {shown}"));
    }
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) {
                format!("{label} symlink open blocked")
            } else {
                format!("{label} cannot be opened: {shown}: {e}")
            }
        })?;
    let hardlinked = || format!("{label} must not be hardlinked: {shown}");
    let opened = file
        .metadata()
        .map_err(|e| format!("{label} cannot be inspected: {shown}: {e}"))?;
    if !opened.is_file() {
        return Err(format!("{label} must be a file: {shown}"));
    }
    if opened.nlink() > 1 {
        return Err(hardlinked());
    }
    let again =
        std::fs::symlink_metadata(path).map_err(|_| format!("{label} is not readable: {shown}"))?;
    if again.file_type().is_symlink() {
        return Err(format!("{label} must not be a symlink: {shown}"));
    }
    if (again.dev(), again.ino()) != (opened.dev(), opened.ino()) {
        return Err(format!(
            "{label} changed while it was being opened: {shown}"
        ));
    }
    if again.nlink() > 1 {
        return Err(hardlinked());
    }
    let real = std::fs::canonicalize(path)
        .map_err(|e| format!("{label} cannot be resolved: {shown}: {e}"))?;
    let real_shown = real.display();
    if opened.size() > max_bytes {
        return Err(format!("{label} exceeded maxBytes ({max_bytes})."));
    }
    if opened.mode() & 0o066 != 0 {
        return Err(format!("{label} permissions are too open: {real_shown}"));
    }
    if opened.uid() != euid {
        return Err(format!(
            "{label} must be owned by the effective user (uid={euid}): {real_shown}"
        ));
    }
    let mut bytes = Vec::new();
    (&file)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{label} cannot be read: {shown}: {e}"))?;
    if bytes.len() as u64 > max_bytes {
        return Err(format!("{label} exceeded maxBytes ({max_bytes})."));
    }
    let after = file
        .metadata()
        .map_err(|e| format!("{label} cannot be inspected: {shown}: {e}"))?;
    if !after.is_file() {
        return Err(format!("{label} must remain a file: {shown}"));
    }
    if after.nlink() > 1 {
        return Err(hardlinked());
    }
    Ok(bytes)
}

/// The outcome of the latest `secrets.reload`, for the status report.
#[derive(Debug, Clone)]
struct ReloadOutcome {
    at_unix_ms: u64,
    error: Option<String>,
}

/// The active snapshot and its reloads.
#[derive(Debug)]
pub struct Runtime {
    spec: Spec,
    euid: u32,
    env: EnvLookup,
    current: Mutex<Arc<Snapshot>>,
    /// Serialises reloads so generations are consecutive and a slow reload cannot overwrite a
    /// newer one.
    reloading: Mutex<()>,
    last_reload: Mutex<Option<ReloadOutcome>>,
    counts: Mutex<(u64, u64)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Runtime {
    /// Resolves eagerly; the gateway does not start when a ref cannot be resolved.
    pub fn start(spec: Spec, euid: u32, env: EnvLookup) -> Result<Self, ResolveError> {
        let snapshot = resolve(&spec, euid, env, 1)?;
        Ok(Runtime {
            spec,
            euid,
            env,
            current: Mutex::new(Arc::new(snapshot)),
            reloading: Mutex::new(()),
            last_reload: Mutex::new(None),
            counts: Mutex::new((0, 0)),
        })
    }

    pub fn current(&self) -> Arc<Snapshot> {
        Arc::clone(&lock(&self.current))
    }

    /// Re-resolves every ref; swaps the snapshot only when all of them resolve, otherwise keeps
    /// the last good one and returns why.
    pub fn reload(&self) -> Result<Arc<Snapshot>, ResolveError> {
        let _serial = lock(&self.reloading);
        let next_generation = self.current().generation + 1;
        let outcome = resolve(&self.spec, self.euid, self.env, next_generation);
        let at_unix_ms = unix_ms();
        match outcome {
            Ok(snapshot) => {
                let snapshot = Arc::new(snapshot);
                *lock(&self.current) = Arc::clone(&snapshot);
                *lock(&self.last_reload) = Some(ReloadOutcome {
                    at_unix_ms,
                    error: None,
                });
                lock(&self.counts).0 += 1;
                Ok(snapshot)
            }
            Err(e) => {
                *lock(&self.last_reload) = Some(ReloadOutcome {
                    at_unix_ms,
                    error: Some(e.to_string()),
                });
                lock(&self.counts).1 += 1;
                Err(e)
            }
        }
    }

    /// The value used at a configuration path (e.g. `gateway.auth.password`), if a ref is there.
    pub fn value_at(&self, config_path: &str) -> Option<String> {
        self.current()
            .refs
            .iter()
            .find(|r| r.secret_ref.paths.iter().any(|p| p == config_path))
            .map(|r| r.value.0.clone())
    }

    /// `text` with every `${SECRET:<source>:<provider>:<id>}` replaced by the value held for that
    /// ref (empty when there is none): the `secretLogLines` switch, for redaction tests only.
    pub fn expand(&self, text: &str) -> String {
        let snapshot = self.current();
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find("${SECRET:") {
            let after = &rest[at + "${SECRET:".len()..];
            let Some(end) = after.find('}') else {
                break;
            };
            out.push_str(&rest[..at]);
            let key = &after[..end];
            if let Some(r) = snapshot.refs.iter().find(|r| r.secret_ref.key() == key) {
                out.push_str(&r.value.0);
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out
    }

    /// The active snapshot's fingerprints plus the latest reload's outcome; never a value.
    pub fn status_json(&self) -> Value {
        let mut out = self.current().to_json();
        let last = lock(&self.last_reload).clone();
        let (ok, failed) = *lock(&self.counts);
        if let Value::Object(map) = &mut out {
            map.insert(
                "lastReload".into(),
                match last {
                    None => Value::Null,
                    Some(r) => json!({
                        "ok": r.error.is_none(),
                        "atUnixMs": r.at_unix_ms,
                        "error": r.error,
                    }),
                },
            );
            map.insert("reloads".into(), json!({"ok": ok, "failed": failed}));
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn euid() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Self {
            let d = std::env::temp_dir().join(format!("cftg-sec-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
        fn file(&self, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, bytes).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn read(p: &Path) -> Result<Vec<u8>, String> {
        read_secure_file(p, "secrets.providers.x.path", DEFAULT_MAX_BYTES, euid())
    }

    fn spec_of(config: &str) -> Result<Spec, String> {
        let v: Value = serde_json::from_str(config).unwrap();
        parse_spec(v.as_object().unwrap(), Some("/home/gw"))
    }

    #[test]
    fn provider_aliases_and_file_ref_ids_follow_openclaw() {
        assert!(is_valid_provider_alias("clawfleet-slack-bot"));
        assert!(is_valid_provider_alias(&format!("a{}", "b".repeat(63))));
        assert!(!is_valid_provider_alias(&format!("a{}", "b".repeat(64))));
        assert!(!is_valid_provider_alias("Clawfleet"));
        assert!(!is_valid_provider_alias("1abc"));
        assert!(!is_valid_provider_alias(""));
        assert!(is_valid_file_ref_id("value"));
        assert!(is_valid_file_ref_id("/providers/openai/apiKey"));
        assert!(is_valid_file_ref_id("/a~0b/c~1d"));
        assert!(is_valid_file_ref_id("/"));
        assert!(!is_valid_file_ref_id("providers/openai"));
        assert!(!is_valid_file_ref_id("/a~2"));
        assert!(!is_valid_file_ref_id("/a~"));
        assert!(!is_valid_file_ref_id("Value"));
    }

    #[test]
    fn spec_collects_providers_and_refs_with_their_paths() {
        let spec = spec_of(
            r#"{"secrets":{"providers":{
                  "clawfleet-bot":{"source":"file","path":"/run/clawfleet/secrets/bot","mode":"singleValue"},
                  "j":{"source":"file","path":"~/s.json","maxBytes":10,"timeoutMs":100}}},
                "channels":{"slack":{"botToken":{"source":"file","provider":"clawfleet-bot","id":"value"},
                   "extra":[{"source":"file","provider":"clawfleet-bot","id":"value"}]}},
                "models":{"k":{"source":"file","provider":"j","id":"/openai/key"}},
                "x-clawfleet-test":{"label":"r"}}"#,
        )
        .unwrap();
        let bot = &spec.providers["clawfleet-bot"];
        assert_eq!(bot.mode, Mode::SingleValue);
        assert_eq!(bot.path, PathBuf::from("/run/clawfleet/secrets/bot"));
        assert_eq!(bot.max_bytes, DEFAULT_MAX_BYTES);
        assert_eq!(spec.providers["j"].path, PathBuf::from("/home/gw/s.json"));
        assert_eq!(spec.providers["j"].mode, Mode::Json);
        assert_eq!(spec.providers["j"].max_bytes, 10);
        assert_eq!(spec.refs.len(), 2);
        assert_eq!(spec.refs[0].key(), "file:clawfleet-bot:value");
        assert_eq!(
            spec.refs[0].paths,
            vec!["channels.slack.botToken", "channels.slack.extra[0]"]
        );
        assert_eq!(spec.refs[1].paths, vec!["models.k"]);
        // Objects that merely have a "source" are not refs.
        let plain = spec_of(r#"{"x":{"source":"github","url":"u"}}"#).unwrap();
        assert!(plain.refs.is_empty());
    }

    #[test]
    fn spec_refuses_what_openclaw_or_the_contract_refuses() {
        let cases = [
            (
                r#"{"secrets":{"providers":{"f":{"source":"file","path":"/p","allowInsecurePath":true}}}}"#,
                "secrets.providers.f.allowInsecurePath",
            ),
            (
                r#"{"secrets":{"providers":{"f":{"source":"file"}}}}"#,
                "secrets.providers.f.path",
            ),
            (
                r#"{"secrets":{"providers":{"f":{"source":"file","path":"/p","mode":"raw"}}}}"#,
                "secrets.providers.f.mode",
            ),
            (
                r#"{"secrets":{"providers":{"f":{"source":"file","path":"/p","maxBytes":0}}}}"#,
                "secrets.providers.f.maxBytes",
            ),
            (
                r#"{"secrets":{"providers":{"f":{"source":"file","path":"/p","timeoutMs":120001}}}}"#,
                "secrets.providers.f.timeoutMs",
            ),
            (
                r#"{"secrets":{"providers":{"Bad":{"source":"file","path":"/p"}}}}"#,
                "secrets.providers.Bad",
            ),
            (r#"{"secrets":{"providers":[]}}"#, "secrets.providers"),
            (
                r#"{"a":{"b":{"source":"exec","provider":"vault","id":"x/y"}}}"#,
                "a.b is a \"exec\" SecretRef",
            ),
            (
                r#"{"secrets":{"providers":{"v":{"source":"exec","command":"/bin/x"}}}}"#,
                "secrets.providers.v.source",
            ),
            (
                r#"{"secrets":{"providers":{"e":{"source":"env","allowlist":["lower"]}}}}"#,
                "secrets.providers.e.allowlist",
            ),
            (
                r#"{"a":{"source":"env","provider":"default","id":"lower"}}"#,
                "a.id: Env",
            ),
            (
                r#"{"a":{"source":"file","provider":"p","id":"value","extra":1}}"#,
                "a: a SecretRef has exactly",
            ),
            (
                r#"{"a":{"source":"file","provider":"P","id":"value"}}"#,
                "a.provider",
            ),
            (
                r#"{"a":[{"source":"file","provider":"p","id":"key"}]}"#,
                "a[0].id",
            ),
        ];
        for (config, expected) in cases {
            let e = spec_of(config).unwrap_err();
            assert!(e.contains(expected), "{config}: {e}");
        }
    }

    #[test]
    fn single_value_drops_one_bom_and_one_trailing_newline() {
        let d = Dir::new("sv");
        let p = d.file("tok", "\u{feff}tok-1\r\n\n".as_bytes(), 0o600);
        let spec = Spec {
            providers: BTreeMap::from([(
                "p".to_owned(),
                FileProvider {
                    name: "p".into(),
                    path: p,
                    mode: Mode::SingleValue,
                    max_bytes: DEFAULT_MAX_BYTES,
                },
            )]),
            refs: vec![SecretRef {
                source: Source::File,
                provider: "p".into(),
                id: "value".into(),
                paths: vec!["a".into()],
            }],
            ..Spec::default()
        };
        let snap = resolve(&spec, euid(), no_env, 1).unwrap();
        let status = snap.to_json();
        assert_eq!(
            status["refs"][0]["fingerprint"],
            fingerprint("tok-1\r\n".as_bytes())
        );
        assert_eq!(
            status["providers"]["p"]["fingerprint"],
            fingerprint("\u{feff}tok-1\r\n\n".as_bytes())
        );
        assert!(!status.to_string().contains("tok-1"), "{status}");
        assert!(!format!("{snap:?}").contains("tok-1"));
    }

    #[test]
    fn json_pointers_resolve_like_openclaw() {
        let root: Value =
            serde_json::from_str(r#"{"a":{"b/c":{"d~e":"v1"}},"list":["x","y"],"n":5}"#).unwrap();
        assert_eq!(read_json_pointer(&root, "/a/b~1c/d~0e").unwrap(), "v1");
        assert_eq!(read_json_pointer(&root, "/list/1").unwrap(), "y");
        assert_eq!(read_json_pointer(&root, "/list/1abc").unwrap(), "y");
        assert!(
            read_json_pointer(&root, "/list/2")
                .unwrap_err()
                .contains("\"2\" is out of bounds")
        );
        assert!(
            read_json_pointer(&root, "/a/zz")
                .unwrap_err()
                .contains("\"zz\" does not exist")
        );
        assert!(read_json_pointer(&root, "/n/x").is_err());
        assert!(
            read_json_pointer(&root, "value")
                .unwrap_err()
                .contains("absolute JSON pointers")
        );
    }

    fn one_ref_spec(path: PathBuf, mode: Mode, id: &str) -> Spec {
        Spec {
            providers: BTreeMap::from([(
                "p".to_owned(),
                FileProvider {
                    name: "p".into(),
                    path,
                    mode,
                    max_bytes: 64,
                },
            )]),
            refs: vec![SecretRef {
                source: Source::File,
                provider: "p".into(),
                id: id.into(),
                paths: vec!["channels.x.token".into()],
            }],
            ..Spec::default()
        }
    }

    #[test]
    fn resolution_errors_name_the_ref_and_the_reason() {
        let d = Dir::new("res");
        let sv = d.file("sv", b"v", 0o600);
        let e = resolve(
            &one_ref_spec(sv.clone(), Mode::SingleValue, "/x"),
            euid(),
            no_env,
            1,
        )
        .unwrap_err();
        assert!(e.message.contains("expects ref id \"value\""), "{e}");
        let s = e.to_string();
        assert!(
            s.contains("file:p:/x") && s.contains("channels.x.token"),
            "{s}"
        );
        let empty = d.file("empty", b"\n", 0o600);
        let e = resolve(
            &one_ref_spec(empty, Mode::SingleValue, "value"),
            euid(),
            no_env,
            1,
        )
        .unwrap_err();
        assert!(e.message.contains("non-string or empty"), "{e}");
        let arr = d.file("arr", b"[1]", 0o600);
        let e = resolve(&one_ref_spec(arr, Mode::Json, "/0"), euid(), no_env, 1).unwrap_err();
        assert!(e.message.contains("not a JSON object"), "{e}");
        let obj = d.file("obj", br#"{"k":1,"s":"ok"}"#, 0o600);
        let e = resolve(
            &one_ref_spec(obj.clone(), Mode::Json, "/k"),
            euid(),
            no_env,
            1,
        )
        .unwrap_err();
        assert!(e.message.contains("non-string"), "{e}");
        assert!(resolve(&one_ref_spec(obj, Mode::Json, "/s"), euid(), no_env, 1).is_ok());
        let big = d.file("big", &[b'a'; 65], 0o600);
        let e = resolve(
            &one_ref_spec(big, Mode::SingleValue, "value"),
            euid(),
            no_env,
            1,
        )
        .unwrap_err();
        assert!(e.message.contains("exceeded maxBytes (64)"), "{e}");
        let mut missing_provider = one_ref_spec(sv, Mode::SingleValue, "value");
        missing_provider.refs[0].provider = "q".into();
        let e = resolve(&missing_provider, euid(), no_env, 1).unwrap_err();
        assert!(e.message.contains("\"q\" is not configured"), "{e}");
    }

    #[test]
    fn refuses_a_symlink_even_to_a_good_file() {
        let d = Dir::new("link");
        let target = d.file("target", b"v", 0o600);
        let link = d.0.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = read(&link).unwrap_err();
        assert!(e.contains("must not be a symlink"), "{e}");
        assert!(read(&target).is_ok());
    }

    #[test]
    fn refuses_group_or_world_access() {
        let d = Dir::new("mode");
        for (mode, ok) in [
            (0o600, true),
            (0o400, true),
            (0o644, false),
            (0o640, false),
            (0o620, false),
            (0o604, false),
            (0o602, false),
        ] {
            let p = d.file(&format!("m{mode:o}"), b"v", mode);
            let r = read(&p);
            assert_eq!(r.is_ok(), ok, "mode {mode:o}: {r:?}");
            if let Err(e) = r {
                assert!(e.contains("permissions are too open"), "{e}");
            }
        }
    }

    #[test]
    fn refuses_hard_links_directories_missing_and_relative_paths() {
        let d = Dir::new("misc");
        let p = d.file("one", b"v", 0o600);
        std::fs::hard_link(&p, d.0.join("two")).unwrap();
        assert!(read(&p).unwrap_err().contains("must not be hardlinked"));
        assert!(read(&d.0).unwrap_err().contains("must be a file"));
        assert!(
            read(&d.0.join("absent"))
                .unwrap_err()
                .contains("is not readable")
        );
        assert!(
            read(Path::new("relative/file"))
                .unwrap_err()
                .contains("must be an absolute path")
        );
    }

    /// Needs root to hand the file to another uid; skipped (loudly) otherwise, a failure under CI.
    #[test]
    fn refuses_a_file_owned_by_another_uid() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "refuses_a_file_owned_by_another_uid needs root under CI=true"
            );
            eprintln!("SKIP refuses_a_file_owned_by_another_uid: not root, cannot chown");
            return;
        }
        let d = Dir::new("owner");
        let p = d.file("tok", b"v", 0o600);
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        let e = read(&p).unwrap_err();
        assert!(
            e.contains("must be owned by the effective user (uid=0)"),
            "{e}"
        );
        // The same file is fine for its owner.
        assert!(read_secure_file(&p, "l", 64, 65534).is_ok());
    }

    #[test]
    fn env_refs_resolve_like_the_env_provider() {
        fn env(name: &str) -> Option<String> {
            match name {
                "OPENCLAW_GATEWAY_PASSWORD" => Some("pw".into()),
                "EMPTY" => Some(String::new()),
                _ => None,
            }
        }
        // The coordinator's rendering of the gateway password.
        let spec = spec_of(
            r#"{"gateway":{"auth":{"mode":"password","password":
                {"source":"env","provider":"default","id":"OPENCLAW_GATEWAY_PASSWORD"}}}}"#,
        )
        .unwrap();
        let snap = resolve(&spec, euid(), env, 1).unwrap();
        assert_eq!(snap.to_json()["refs"][0]["fingerprint"], fingerprint(b"pw"));
        assert_eq!(snap.to_json()["refs"][0]["source"], "env");
        let message = |config: &str| {
            resolve(&spec_of(config).unwrap(), euid(), env, 1)
                .unwrap_err()
                .message
        };
        assert!(
            message(r#"{"a":{"source":"env","provider":"default","id":"EMPTY"}}"#)
                .contains("\"EMPTY\" is missing or empty")
        );
        assert!(
            message(r#"{"a":{"source":"env","provider":"other","id":"X"}}"#)
                .contains("\"other\" is not configured")
        );
        assert!(
            message(
                r#"{"secrets":{"providers":{"e":{"source":"env","allowlist":["A"]}}},
                    "a":{"source":"env","provider":"e","id":"OPENCLAW_GATEWAY_PASSWORD"}}"#
            )
            .contains("not allowlisted in secrets.providers.e.allowlist")
        );
        assert!(
            message(
                r#"{"secrets":{"providers":{"f":{"source":"file","path":"/x"}}},
                    "a":{"source":"env","provider":"f","id":"X"}}"#
            )
            .contains("has source \"file\" but ref requests \"env\"")
        );
        // secrets.defaults.env renames the built-in provider.
        let renamed = spec_of(
            r#"{"secrets":{"defaults":{"env":"mine"}},
                "a":{"source":"env","provider":"mine","id":"OPENCLAW_GATEWAY_PASSWORD"}}"#,
        )
        .unwrap();
        assert!(resolve(&renamed, euid(), env, 1).is_ok());
    }

    #[test]
    fn reload_swaps_on_success_and_keeps_the_last_good_snapshot_on_failure() {
        let d = Dir::new("reload");
        let p = d.file("tok", b"one", 0o600);
        let rt = Runtime::start(
            one_ref_spec(p.clone(), Mode::SingleValue, "value"),
            euid(),
            no_env,
        )
        .unwrap();
        let first = rt.current();
        assert_eq!(first.generation, 1);
        assert_eq!(rt.value_at("channels.x.token").as_deref(), Some("one"));
        std::fs::write(&p, b"two").unwrap();
        let second = rt.reload().unwrap();
        assert_eq!(second.generation, 2);
        assert_eq!(
            rt.status_json()["refs"][0]["fingerprint"],
            fingerprint(b"two")
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = rt.reload().unwrap_err();
        assert!(e.message.contains("too open"), "{e}");
        let status = rt.status_json();
        assert_eq!(status["generation"], 2);
        assert_eq!(status["refs"][0]["fingerprint"], fingerprint(b"two"));
        assert_eq!(status["lastReload"]["ok"], false);
        assert!(
            status["lastReload"]["error"]
                .as_str()
                .unwrap()
                .contains("too open")
        );
        assert_eq!(status["reloads"], json!({"ok": 1, "failed": 1}));
        assert_eq!(rt.value_at("channels.x.token").as_deref(), Some("two"));
        assert_eq!(rt.value_at("elsewhere"), None);
        assert_eq!(
            rt.expand("a ${SECRET:file:p:value} b ${SECRET:file:q:value} c ${SECRET:x"),
            "a two b  c ${SECRET:x"
        );
    }
}
