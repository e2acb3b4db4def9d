//! Rendering of the native `openclaw.json` for an SSH-hosted embedded gateway, before any host
//! work, and clear refusals of everything out of scope (peer study §C.6).
//!
//! Every top-level section of the native configuration has one decision in [`SECTIONS`]: allowed
//! (passed through, after the checks its reason names), rendered (clawfleet sets it) or refused.
//! The reference is the root schema of the real gateway, `openclaw@2026.9.6`
//! (`OpenClawSchemaShape` in its `dist/zod-schema-*.mjs`), which is strict: it refuses keys it
//! does not know, so an unknown top-level section is refused here too, naming the key, rather
//! than shipped to a gateway that would not start. The coordinator README lists the decisions.
//!
//! The rendered document always has `gateway.mode: "local"`, `gateway.bind: "loopback"` and
//! password auth through the managed `OPENCLAW_GATEWAY_PASSWORD` (unless the operator chose
//! trusted-proxy). The port is assigned by the host and given to the gateway in its unit's
//! environment (`OPENCLAW_GATEWAY_PORT`), so a configuration may not set one.
//!
//! Inside allowed sections the design's out-of-scope features are refused too: another harness
//! (any `agentRuntime.id` or `pickerRuntimes` entry other than the embedded `openclaw`, an Agent
//! `runtime` other than `embedded`, an ACP binding), a sandbox, and secret providers (with the
//! file and exec secret references that need one).
//!
//! Secrets: a configuration refers to a secret of its Namespace with
//! `{"source": "file", "provider": "clawfleet", "id": "<name>"}` anywhere in the document
//! ([`secret_references`]). The coordinator renders for each bound secret the one kind of
//! provider it allows, a single-value file provider `clawfleet-<name>` reading
//! `/run/clawfleet/secrets/<name>`, and rewrites the reference to it ([`bind_secrets`]); any
//! `secrets.providers` the operator writes is refused.

use clawfleet_protocol::SecretName;
use clawfleet_protocol::operation::{RevisionNumber, RevisionRef};
use clawfleet_protocol::secret;
use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::codes::Code;
use Decision::{Allowed, Refused, Rendered};

/// Why a configuration cannot be deployed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {message}")]
pub struct Refusal {
    /// Path of the offending field: dotted, with `[n]` for array items and `["key"]` for keys
    /// that are not plain names (model refs such as `openai/gpt-5.5`).
    pub field: String,
    pub message: String,
}

impl Refusal {
    /// The API's code for every refusal of this module (HTTP 400); the path tells them apart.
    pub const CODE: Code = Code::ConfigurationRefused;
}

fn refuse(field: &str, message: impl Into<String>) -> Refusal {
    Refusal {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// What clawfleet does with one top-level section of the native configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Passed through as written, after the checks its reason names.
    Allowed,
    /// Set by clawfleet; what the operator wrote is checked and merged.
    Rendered,
    /// Refused before any host work.
    Refused,
}

impl Decision {
    /// The word the README table uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Allowed => "allowed",
            Rendered => "rendered",
            Refused => "refused",
        }
    }
}

/// One top-level section and its decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub key: &'static str,
    pub decision: Decision,
    /// Why; for a refused section, the refusal's message.
    pub reason: &'static str,
}

const fn row(key: &'static str, decision: Decision, reason: &'static str) -> Section {
    Section {
        key,
        decision,
        reason,
    }
}

/// The gateway release whose root schema [`SECTIONS`] follows.
pub const OPENCLAW_REFERENCE: &str = "openclaw@2026.9.6";

/// The embedded OpenClaw harness's runtime id in the gateway (`OPENCLAW_AGENT_RUNTIME_ID`).
pub const EMBEDDED_RUNTIME_ID: &str = "openclaw";

/// The reserved top-level key of the test gateway's behaviour switches.
pub const TEST_SWITCHES_KEY: &str = "x-clawfleet-test";

/// The decision for every top-level section, in the reference schema's order, then the
/// reserved test key. Any other top-level key is refused.
pub const SECTIONS: &[Section] = &[
    row("$schema", Allowed, "an editor hint; the gateway ignores it"),
    row(
        "meta",
        Allowed,
        "bookkeeping the gateway writes (last touched version, applied migrations)",
    ),
    row(
        "env",
        Refused,
        "the gateway's environment belongs to hostd's unit (it sets the OPENCLAW_* variables) and \
         operator credentials live in the Agent's env file on the host: env.vars would carry \
         values in every revision and env.shellEnv runs a login shell; remove env",
    ),
    row(
        "wizard",
        Allowed,
        "onboarding bookkeeping; no effect on a running gateway",
    ),
    row(
        "diagnostics",
        Allowed,
        "diagnostic flags and OpenTelemetry export",
    ),
    row(
        "logging",
        Allowed,
        "levels, style and redaction; a logging.file must be under the Agent's state or home \
         directory, the only places its unit may write",
    ),
    row(
        "update",
        Allowed,
        "update checks (checkOnStart: false avoids the lookup on air-gapped sites); the gateway \
         itself is upgraded through the host's packages",
    ),
    row("telemetry", Allowed, "usage telemetry consent"),
    row(
        "browser",
        Allowed,
        "the browser tool, run under the Agent's own account",
    ),
    row("ui", Allowed, "Control UI preferences"),
    row(
        "secrets",
        Allowed,
        "secrets.defaults and secrets.egressProxy pass through; secrets.providers is refused \
         (clawfleet renders the providers of the secrets a configuration refers to; exec \
         providers would run a command on the host), and so are file and exec secret \
         references other than {\"source\": \"file\", \"provider\": \"clawfleet\", \"id\": \"<secret>\"}",
    ),
    row(
        "auth",
        Allowed,
        "model auth profiles and their order; the credentials stay in the Agent's state on the host",
    ),
    row("accessGroups", Allowed, "channel audience groups"),
    row(
        "acp",
        Refused,
        "the ACP control plane runs external harnesses (Codex, Claude and others) through acpx; \
         only the embedded OpenClaw harness is supported; remove acp",
    ),
    row(
        "models",
        Allowed,
        "model providers and catalogs; an agentRuntime.id or pickerRuntimes entry other than \
         \"openclaw\" is refused (another harness)",
    ),
    row(
        "nodeHost",
        Refused,
        "settings of `openclaw node` hosts (paired execution nodes), which clawfleet does not \
         run: dedicated execution is out of scope; remove nodeHost",
    ),
    row(
        "agents",
        Allowed,
        "the native main Agent's defaults and entry; refused inside: agents.list, entries other \
         than main, another harness (agentRuntime.id or pickerRuntimes other than \"openclaw\", \
         runtime.type other than \"embedded\"), a sandbox (agents.defaults.sandbox, \
         agents.entries.main.sandbox) and codex.approvalPolicy \"untrusted\"",
    ),
    row(
        "worktreeRoot",
        Allowed,
        "where git worktrees go; it must be writable by the Agent's account",
    ),
    row(
        "worktreeAcceleration",
        Allowed,
        "a worktree performance switch",
    ),
    row(
        "tools",
        Allowed,
        "tool policy; tools run in the embedded harness under the Agent's account",
    ),
    row(
        "security",
        Allowed,
        "security audit suppressions and the skill/plugin install policy",
    ),
    row(
        "bindings",
        Allowed,
        "routes from channels to the Agent; an ACP binding (type \"acp\") is refused (another harness)",
    ),
    row("broadcast", Allowed, "broadcast groups"),
    row("attachments", Allowed, "attachment retention"),
    row("messages", Allowed, "message handling"),
    row("tts", Allowed, "text to speech"),
    row("commands", Allowed, "chat commands"),
    row(
        "approvals",
        Allowed,
        "forwarding of exec and plugin approval prompts",
    ),
    row("session", Allowed, "session policy"),
    row("cron", Allowed, "scheduled jobs, run by the gateway"),
    row("transcripts", Allowed, "meeting transcripts"),
    row(
        "hooks",
        Allowed,
        "webhook ingress and internal hooks, on the gateway's loopback listener",
    ),
    row(
        "channels",
        Allowed,
        "messaging channels; their credentials are clawfleet secrets referred to by name (the Agent's env file on the host is the legacy way)",
    ),
    row(
        "discovery",
        Refused,
        "hosted gateways listen on loopback only and hostd turns mDNS off \
         (OPENCLAW_DISABLE_BONJOUR=1): advertising them on the LAN or in wide-area DNS-SD would \
         publish an address nobody can reach; remove discovery",
    ),
    row("talk", Allowed, "voice conversations"),
    row(
        "gateway",
        Rendered,
        "clawfleet sets mode \"local\", bind \"loopback\" and password auth through the managed \
         OPENCLAW_GATEWAY_PASSWORD (or keeps trusted-proxy), and controlUi.basePath to the \
         coordinator's .../agents/{agent}/ui path; refused: gateway.port (the host assigns \
         it), other modes and binds, auth fields other than mode, password, allowTailscale, \
         identityScopes, rateLimit and trustedProxy, literal passwords, \
         gateway.controlUi.basePath, and gateway.tls.enabled",
    ),
    row(
        "cloudWorkers",
        Refused,
        "runs the Agent's work on remote cloud workers: dedicated and remote execution are out \
         of scope; remove cloudWorkers",
    ),
    row(
        "desktop",
        Refused,
        "desktop observation drives a VNC server on the host or a paired node, neither of which \
         is provisioned for a hosted Agent; remove desktop",
    ),
    row("memory", Allowed, "memory search and citations"),
    row("mcp", Allowed, "MCP servers, run under the Agent's account"),
    row("skills", Allowed, "skills"),
    row(
        "plugins",
        Refused,
        "plugin drivers are out of scope (the bundled plugins load as shipped); remove plugins",
    ),
    row("surfaces", Allowed, "per-surface reply policy"),
    row(
        "proxy",
        Allowed,
        "the outbound HTTP proxy, for sites that reach model providers through one",
    ),
    row(
        TEST_SWITCHES_KEY,
        Allowed,
        "reserved: the test gateway's behaviour switches",
    ),
];

/// The decision for a top-level key, or `None` for a key that is not a section.
pub fn section(key: &str) -> Option<&'static Section> {
    SECTIONS.iter().find(|s| s.key == key)
}

/// `parent.key`, or `parent["key"]` when the key is not a plain name.
fn child(parent: &str, key: &str) -> String {
    let plain = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '$'));
    match (plain, parent.is_empty()) {
        (true, true) => key.to_owned(),
        (true, false) => format!("{parent}.{key}"),
        (false, _) => format!("{parent}[{}]", Value::from(key)),
    }
}

fn item(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

/// A value quoted for a message, shortened.
fn quoted(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() <= 64 {
        text
    } else {
        format!("{}…", text.chars().take(63).collect::<String>())
    }
}

const AUTH_KEYS: &[&str] = &[
    "mode",
    "password",
    "allowTailscale",
    "identityScopes",
    "rateLimit",
    "trustedProxy",
];

fn password_ref() -> Value {
    json!({"source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD"})
}

fn object<'a>(v: &'a mut Value, field: &str) -> Result<&'a mut Map<String, Value>, Refusal> {
    v.as_object_mut()
        .ok_or_else(|| refuse(field, "must be an object"))
}

/// Renders a native configuration document for deployment, or refuses it.
pub fn render(document: &Value) -> Result<Value, Refusal> {
    let mut doc = document.clone();
    let root = object(&mut doc, "configuration")?;
    for (key, value) in root.iter() {
        let path = child("", key);
        let Some(known) = section(key) else {
            return Err(refuse(
                &path,
                format!(
                    "is not a section of the OpenClaw configuration ({OPENCLAW_REFERENCE}); the \
                     gateway would refuse to start with it; remove {path}"
                ),
            ));
        };
        if known.decision == Refused {
            // Name the first field inside the section when there is one.
            let field = match value.as_object().and_then(|m| m.keys().next()) {
                Some(first) => child(&path, first),
                None => path,
            };
            return Err(refuse(&field, known.reason));
        }
    }
    if let Some(agents) = root.get("agents") {
        check_agents(agents)?;
        check_runtimes(agents, "agents")?;
    }
    if let Some(models) = root.get("models") {
        check_runtimes(models, "models")?;
    }
    if let Some(Value::Array(bindings)) = root.get("bindings") {
        check_bindings(bindings)?;
    }
    if let Some(secrets) = root.get("secrets") {
        check_secrets(secrets)?;
    }
    for (key, value) in root.iter() {
        if key != TEST_SWITCHES_KEY {
            check_secret_refs(value, &child("", key))?;
            check_literal_secrets(value, &child("", key))?;
        }
    }
    render_gateway(root)?;
    Ok(doc)
}

fn check_agents(agents: &Value) -> Result<(), Refusal> {
    let Some(agents) = agents.as_object() else {
        return Err(refuse("agents", "must be an object"));
    };
    if agents.contains_key("list") {
        return Err(refuse(
            "agents.list",
            "only the native main Agent is supported; remove agents.list",
        ));
    }
    let mut scopes = Vec::new();
    if let Some(defaults) = agents.get("defaults") {
        scopes.push(("agents.defaults", defaults));
    }
    if let Some(entries) = agents.get("entries").and_then(Value::as_object) {
        if let Some(other) = entries.keys().find(|k| k.as_str() != "main") {
            return Err(refuse(
                &child("agents.entries", other),
                "only the native main Agent is supported",
            ));
        }
        if let Some(main) = entries.get("main") {
            scopes.push(("agents.entries.main", main));
        }
    }
    for (scope, agent) in scopes {
        if agent.get("sandbox").is_some() {
            return Err(refuse(
                &child(scope, "sandbox"),
                "sandboxes are not supported: Sandbox drivers are out of scope, and a hosted \
                 Agent runs in its own account under a hardened unit; remove the sandbox",
            ));
        }
        match agent.get("runtime") {
            None => {}
            Some(runtime) if runtime.get("type").and_then(Value::as_str) == Some("embedded") => {}
            Some(runtime) => {
                let field = child(scope, "runtime");
                let (field, shown) = match runtime.get("type") {
                    Some(t) => (child(&field, "type"), quoted(t)),
                    None => (field, quoted(runtime)),
                };
                return Err(refuse(
                    &field,
                    format!(
                        "{shown} selects another harness; only the embedded OpenClaw runtime \
                         (type \"embedded\") is supported"
                    ),
                ));
            }
        }
    }
    if let Some(policy) = agents
        .get("defaults")
        .and_then(|d| d.get("codex"))
        .and_then(|c| c.get("approvalPolicy"))
        && policy == "untrusted"
    {
        return Err(refuse(
            "agents.defaults.codex.approvalPolicy",
            "\"untrusted\" is not supported on SSH hosts",
        ));
    }
    Ok(())
}

/// Whether a runtime id names the embedded OpenClaw harness, as the gateway normalises it
/// (trimmed, lower-case; `pi` is its legacy alias).
fn is_embedded_runtime(id: &str) -> bool {
    let id = id.trim().to_ascii_lowercase();
    id == EMBEDDED_RUNTIME_ID || id == "pi"
}

fn another_harness(field: &str, id: &Value) -> Refusal {
    refuse(
        field,
        format!(
            "{} selects another harness; only the embedded OpenClaw harness \
             ({EMBEDDED_RUNTIME_ID:?}) is supported",
            quoted(id)
        ),
    )
}

/// Refuses every `agentRuntime.id` and `pickerRuntimes` entry that is not the embedded
/// harness, wherever it is (Agent defaults and entries, their model maps, providers and their
/// models).
fn check_runtimes(value: &Value, path: &str) -> Result<(), Refusal> {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                let field = child(path, key);
                match key.as_str() {
                    "agentRuntime" => match v {
                        Value::Object(runtime) => match runtime.get("id") {
                            None => {}
                            Some(Value::String(id)) if is_embedded_runtime(id) => {}
                            Some(id) => return Err(another_harness(&child(&field, "id"), id)),
                        },
                        _ => return Err(refuse(&field, "must be an object")),
                    },
                    "pickerRuntimes" => {
                        let Value::Array(ids) = v else {
                            return Err(refuse(&field, "must be an array"));
                        };
                        for (i, id) in ids.iter().enumerate() {
                            if !id.as_str().is_some_and(is_embedded_runtime) {
                                return Err(another_harness(&item(&field, i), id));
                            }
                        }
                    }
                    _ => check_runtimes(v, &field)?,
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                check_runtimes(v, &item(path, i))?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_bindings(bindings: &[Value]) -> Result<(), Refusal> {
    for (i, binding) in bindings.iter().enumerate() {
        if binding.get("type").and_then(Value::as_str) == Some("acp") {
            return Err(refuse(
                &child(&item("bindings", i), "type"),
                "an ACP binding routes to an external harness through acpx; only the embedded \
                 OpenClaw harness is supported",
            ));
        }
    }
    Ok(())
}

fn check_secrets(secrets: &Value) -> Result<(), Refusal> {
    let Some(providers) = secrets.get("providers") else {
        return Ok(());
    };
    let unsupported = "secret providers are rendered by clawfleet, not written: store the \
                       credential with `occ secret set NS NAME --from-file FILE` and refer to \
                       it as {\"source\": \"file\", \"provider\": \"clawfleet\", \"id\": \"NAME\"}";
    match providers.as_object().and_then(|p| p.iter().next()) {
        None => Err(refuse("secrets.providers", unsupported)),
        Some((alias, provider)) => {
            let field = child("secrets.providers", alias);
            if provider.get("source").and_then(Value::as_str) == Some("exec") {
                Err(refuse(
                    &field,
                    format!(
                        "is an exec provider, which would run a command on the host; {unsupported}"
                    ),
                ))
            } else {
                Err(refuse(&field, unsupported))
            }
        }
    }
}

/// Refuses, on a pool whose hosts other Namespaces share, the authentication a sibling could
/// forge: a trusted proxy's identity headers and Tailscale identity both come from local
/// requests any Agent on the host can make.
pub fn check_tenancy(document: &Value, shared_pool: bool) -> Result<(), Refusal> {
    if !shared_pool {
        return Ok(());
    }
    let auth = &document["gateway"]["auth"];
    let why = "on a shared host pool any other Agent can send the requests this trusts; \
               create the Namespace with singleTenant (occ namespace create --single-tenant) \
               if its hosts run this Namespace's Agents only";
    if auth["mode"] == "trusted-proxy" {
        return Err(refuse(
            "gateway.auth.mode",
            format!("\"trusted-proxy\" is refused: {why}"),
        ));
    }
    if auth["allowTailscale"] == true {
        return Err(refuse(
            "gateway.auth.allowTailscale",
            format!("is refused: {why}"),
        ));
    }
    Ok(())
}

/// Whether a key names a credential (`apiKey`, `botToken`, `clientSecret`, `password`, ...).
fn is_secret_key(key: &str) -> bool {
    let k: String = key
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    [
        "apikey",
        "token",
        "secret",
        "password",
        "passphrase",
        "privatekey",
    ]
    .iter()
    .any(|s| k.ends_with(s))
}

/// `${NAME}`: OpenClaw substitutes it from the environment when it loads the file.
fn is_env_placeholder(s: &str) -> bool {
    s.strip_prefix("${")
        .and_then(|r| r.strip_suffix('}'))
        .is_some_and(|name| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
}

/// Refuses literal credentials: a configuration is stored, versioned and copied into every
/// revision on every host, so a key such as `apiKey` must hold an environment reference whose
/// value lives in the Agent's `env` file on the host.
fn check_literal_secrets(value: &Value, path: &str) -> Result<(), Refusal> {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                let at = child(path, key);
                if is_secret_key(key)
                    && let Value::String(text) = v
                    && !text.is_empty()
                    && !is_env_placeholder(text)
                {
                    return Err(refuse(
                        &at,
                        "holds a literal secret, and configurations are stored and copied into \
                         every revision; put the value in the Agent's env file on its host \
                         (NAME=value, read by the Agent's unit) and write \"${NAME}\" here",
                    ));
                }
                check_literal_secrets(v, &at)?;
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                check_literal_secrets(v, &item(path, i))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Refuses secret references (`{source, provider, id}`) to file and exec providers other than
/// clawfleet's own (whose id must be a secret's name): they resolve only through
/// `secrets.providers`, which clawfleet renders.
fn check_secret_refs(value: &Value, path: &str) -> Result<(), Refusal> {
    match value {
        Value::Object(map) => {
            let is_ref = map.len() == 3
                && map.contains_key("provider")
                && map.contains_key("id")
                && matches!(
                    map.get("source").and_then(Value::as_str),
                    Some("file" | "exec")
                );
            if is_ref && is_clawfleet_ref(map) {
                secret_name(map, path)?;
                return Ok(());
            }
            if is_ref {
                return Err(refuse(
                    &child(path, "source"),
                    "file and exec secret references need a secret provider, which clawfleet \
                     renders for its own secrets only: store the credential with `occ secret \
                     set NS NAME --from-file FILE` and refer to it as {\"source\": \"file\", \
                     \"provider\": \"clawfleet\", \"id\": \"NAME\"}",
                ));
            }
            for (key, v) in map {
                check_secret_refs(v, &child(path, key))?;
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                check_secret_refs(v, &item(path, i))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `{"source": "file", "provider": "clawfleet", "id": …}`: a reference to a clawfleet secret.
fn is_clawfleet_ref(map: &Map<String, Value>) -> bool {
    map.len() == 3
        && map.get("source").and_then(Value::as_str) == Some(secret::REFERENCE_SOURCE)
        && map.get("provider").and_then(Value::as_str) == Some(secret::REFERENCE_PROVIDER)
        && map.contains_key("id")
}

/// The secret a clawfleet reference at `path` names, or the refusal naming `path.id`.
fn secret_name(map: &Map<String, Value>, path: &str) -> Result<SecretName, Refusal> {
    let id = map.get("id").unwrap_or(&Value::Null);
    id.as_str()
        .and_then(|s| SecretName::new(s).ok())
        .ok_or_else(|| {
            refuse(
                &child(path, "id"),
                format!(
                    "{} is not a secret's name (1 to {} characters of lowercase letters, digits \
                     and '-', starting with a letter and ending with a letter or digit)",
                    quoted(id),
                    secret::NAME_MAX
                ),
            )
        })
}

/// Every clawfleet secret reference in a document, with its path, in document order (a
/// secret referred to twice appears twice).
pub fn secret_references(document: &Value) -> Result<Vec<(String, SecretName)>, Refusal> {
    fn walk(v: &Value, path: &str, out: &mut Vec<(String, SecretName)>) -> Result<(), Refusal> {
        match v {
            Value::Object(map) if is_clawfleet_ref(map) => {
                out.push((path.to_owned(), secret_name(map, path)?));
            }
            Value::Object(map) => {
                for (key, v) in map {
                    walk(v, &child(path, key), out)?;
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &item(path, i), out)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    let mut out = Vec::new();
    if let Some(root) = document.as_object() {
        for (key, v) in root {
            if key != TEST_SWITCHES_KEY {
                walk(v, &child("", key), &mut out)?;
            }
        }
    }
    Ok(out)
}

/// Rewrites every clawfleet secret reference of a rendered document for the gateway,
/// `{"source": "file", "provider": "clawfleet-<name>", "id": "value"}`, and adds, per secret,
/// the provider that reads it: `secrets.providers["clawfleet-<name>"] = {"source": "file",
/// "path": "/run/clawfleet/secrets/<name>", "mode": "singleValue"}`. OpenClaw's single-value
/// file provider takes exactly the id `value` and refuses a symlink, a file others may read or
/// write, and a file the gateway's uid does not own, which is how the targets write it.
pub fn bind_secrets(document: &mut Value) -> Result<(), Refusal> {
    fn walk(v: &mut Value, path: &str, names: &mut Vec<SecretName>) -> Result<(), Refusal> {
        match v {
            Value::Object(map) if is_clawfleet_ref(map) => {
                let name = secret_name(map, path)?;
                *v = json!({
                    "source": secret::REFERENCE_SOURCE,
                    "provider": secret::provider_name(&name),
                    "id": secret::SINGLE_VALUE_ID,
                });
                names.push(name);
            }
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    let at = child(path, key);
                    walk(v, &at, names)?;
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter_mut().enumerate() {
                    walk(v, &item(path, i), names)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    let root = object(document, "configuration")?;
    let mut names = Vec::new();
    for (key, v) in root.iter_mut() {
        if key != TEST_SWITCHES_KEY {
            walk(v, &child("", key), &mut names)?;
        }
    }
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    names.dedup();
    let secrets = root
        .entry("secrets")
        .or_insert_with(|| Value::Object(Map::new()));
    let secrets = object(secrets, "secrets")?;
    let providers = secrets
        .entry("providers")
        .or_insert_with(|| Value::Object(Map::new()));
    let providers = object(providers, "secrets.providers")?;
    for name in &names {
        providers.insert(
            secret::provider_name(name),
            json!({"source": "file", "path": secret::path(name), "mode": "singleValue"}),
        );
    }
    Ok(())
}

fn render_gateway(root: &mut Map<String, Value>) -> Result<(), Refusal> {
    let gateway = root
        .entry("gateway")
        .or_insert_with(|| Value::Object(Map::new()));
    let gw = object(gateway, "gateway")?;
    match gw.get("mode").and_then(Value::as_str) {
        None | Some("local") => {}
        Some(other) => {
            return Err(refuse(
                "gateway.mode",
                format!("{other:?} is not supported; hosted gateways run in local mode"),
            ));
        }
    }
    if gw.get("mode").is_some_and(|m| !m.is_string()) {
        return Err(refuse("gateway.mode", "must be a string"));
    }
    match gw.get("bind") {
        None => {}
        Some(Value::String(b)) if b == "loopback" => {}
        Some(_) => {
            return Err(refuse(
                "gateway.bind",
                "hosted gateways listen on loopback only",
            ));
        }
    }
    if gw.contains_key("port") {
        return Err(refuse(
            "gateway.port",
            "the port is assigned by the host; remove gateway.port",
        ));
    }
    if gw
        .get("tls")
        .and_then(|t| t.get("enabled"))
        .and_then(Value::as_bool)
        == Some(true)
    {
        return Err(refuse(
            "gateway.tls.enabled",
            "native TLS on the gateway listener is not supported",
        ));
    }
    if let Some(ui) = gw.get("controlUi") {
        let ui = ui
            .as_object()
            .ok_or_else(|| refuse("gateway.controlUi", "must be an object"))?;
        if ui.contains_key("basePath") {
            return Err(refuse(
                "gateway.controlUi.basePath",
                "the coordinator serves the Control UI at .../agents/{agent}/ui/ and sets its \
                 path; remove gateway.controlUi.basePath",
            ));
        }
    }
    gw.insert("mode".to_owned(), json!("local"));
    gw.insert("bind".to_owned(), json!("loopback"));
    let auth = gw
        .entry("auth")
        .or_insert_with(|| Value::Object(Map::new()));
    let auth = object(auth, "gateway.auth")?;
    if let Some(key) = auth.keys().find(|k| !AUTH_KEYS.contains(&k.as_str())) {
        return Err(refuse(
            &child("gateway.auth", key),
            "is not a supported authentication field",
        ));
    }
    if let Some(p) = auth.get("password") {
        let ok = p == "${OPENCLAW_GATEWAY_PASSWORD}" || *p == password_ref();
        if !ok {
            return Err(refuse(
                "gateway.auth.password",
                "must reference the managed OPENCLAW_GATEWAY_PASSWORD; literal passwords never travel",
            ));
        }
    }
    match auth.get("mode").map(|m| m.as_str()) {
        None | Some(Some("password")) => {
            auth.insert("mode".to_owned(), json!("password"));
            auth.insert("password".to_owned(), password_ref());
        }
        Some(Some("trusted-proxy")) => {}
        Some(_) => {
            return Err(refuse(
                "gateway.auth.mode",
                "must be \"password\" or \"trusted-proxy\"",
            ));
        }
    }
    Ok(())
}

/// Tells a rendered document's gateway where the coordinator serves its Control UI
/// ([`clawfleet_api::routes::control_ui_path`]): the gateway writes that path into the
/// page's links, which then resolve through the coordinator. Part of the revision (its
/// hash), as every path the gateway is given; [`render`] refuses one in the document.
pub fn serve_control_ui_at(rendered: &mut Value, path: &str) -> Result<(), Refusal> {
    let root = object(rendered, "configuration")?;
    let gateway = root
        .entry("gateway")
        .or_insert_with(|| Value::Object(Map::new()));
    let ui = object(gateway, "gateway")?
        .entry("controlUi")
        .or_insert_with(|| Value::Object(Map::new()));
    object(ui, "gateway.controlUi")?.insert("basePath".to_owned(), json!(path));
    Ok(())
}

/// The harness version revisions are deployed with.
pub const HARNESS_VERSION: &str = "2026.9.6";

/// A stored revision as operations name it; the error says which stored field is not valid
/// (`INVALID_STORED_ID`).
pub fn revision_ref(rev: &crate::model::Revision) -> Result<RevisionRef, String> {
    Ok(RevisionRef {
        id: rev.id.clone(),
        number: RevisionNumber::new(rev.number)?,
        configuration_hash: rev.configuration_hash.clone(),
    })
}

/// The revision as prepare (and plan) send it: its rendered document and the embedded
/// harness. The error is the code and message of a document or harness that cannot be sent.
pub fn revision_spec(
    reference: &RevisionRef,
    rendered: &Value,
) -> Result<clawfleet_protocol::operation::RevisionSpec, (Code, String)> {
    use clawfleet_protocol::operation::{Harness, HarnessId, HarnessMode, HarnessVersion};
    let configuration = clawfleet_protocol::Configuration::new(rendered.clone())
        .map_err(|e| (Code::ConfigurationRefused, e.to_string()))?;
    Ok(clawfleet_protocol::operation::RevisionSpec {
        id: reference.id.clone(),
        number: reference.number,
        harness: Harness {
            id: HarnessId::Openclaw,
            version: HarnessVersion::new(HARNESS_VERSION)
                .map_err(|e| (Code::InvalidHarness, e.to_string()))?,
            mode: HarnessMode::Embedded,
        },
        configuration_hash: configuration.hash(),
        configuration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The top-level keys of the real gateway's root schema, `OpenClawSchemaShape` in
    /// openclaw@2026.9.6 (`dist/zod-schema-*.mjs`), in its order.
    const REFERENCE_SECTIONS: &[&str] = &[
        "$schema",
        "meta",
        "env",
        "wizard",
        "diagnostics",
        "logging",
        "update",
        "telemetry",
        "browser",
        "ui",
        "secrets",
        "auth",
        "accessGroups",
        "acp",
        "models",
        "nodeHost",
        "agents",
        "worktreeRoot",
        "worktreeAcceleration",
        "tools",
        "security",
        "bindings",
        "broadcast",
        "attachments",
        "messages",
        "tts",
        "commands",
        "approvals",
        "session",
        "cron",
        "transcripts",
        "hooks",
        "channels",
        "discovery",
        "talk",
        "gateway",
        "cloudWorkers",
        "desktop",
        "memory",
        "mcp",
        "skills",
        "plugins",
        "surfaces",
        "proxy",
    ];

    fn refusal(doc: &Value) -> Refusal {
        match render(doc) {
            Err(r) => r,
            Ok(out) => panic!("{doc} was rendered as {out}"),
        }
    }

    #[test]
    fn renders_password_auth_on_loopback() {
        let out = render(&json!({"logging": {"level": "info"}})).unwrap();
        assert_eq!(out["gateway"]["mode"], "local");
        assert_eq!(out["gateway"]["bind"], "loopback");
        assert_eq!(out["gateway"]["auth"]["mode"], "password");
        assert_eq!(out["gateway"]["auth"]["password"], password_ref());
        assert_eq!(out["logging"]["level"], "info");
        let tp = render(&json!({"gateway": {"auth": {"mode": "trusted-proxy", "trustedProxy": {"header": "x"}}}})).unwrap();
        assert_eq!(tp["gateway"]["auth"]["mode"], "trusted-proxy");
        assert!(tp["gateway"]["auth"].get("password").is_none());
        let passthrough = render(&json!({"x-clawfleet-test": {"neverReady": true}})).unwrap();
        assert_eq!(passthrough["x-clawfleet-test"]["neverReady"], true);
    }

    #[test]
    fn refuses_out_of_scope_configurations_naming_the_field() {
        let cases = [
            (json!([]), "configuration"),
            (json!({"gateway": 1}), "gateway"),
            (json!({"gateway": {"mode": "remote"}}), "gateway.mode"),
            (json!({"gateway": {"bind": "lan"}}), "gateway.bind"),
            (json!({"gateway": {"port": 1234}}), "gateway.port"),
            (
                json!({"gateway": {"tls": {"enabled": true}}}),
                "gateway.tls.enabled",
            ),
            (
                json!({"gateway": {"auth": {"token": "x"}}}),
                "gateway.auth.token",
            ),
            (
                json!({"gateway": {"auth": {"mode": "none"}}}),
                "gateway.auth.mode",
            ),
            (
                json!({"gateway": {"auth": {"password": "hunter2"}}}),
                "gateway.auth.password",
            ),
            (
                json!({"gateway": {"controlUi": {"basePath": "/x"}}}),
                "gateway.controlUi.basePath",
            ),
            (json!({"gateway": {"controlUi": true}}), "gateway.controlUi"),
            (json!({"agents": {"list": []}}), "agents.list"),
            (
                json!({"agents": {"entries": {"other": {}}}}),
                "agents.entries.other",
            ),
            (
                json!({"agents": {"defaults": {"codex": {"approvalPolicy": "untrusted"}}}}),
                "agents.defaults.codex.approvalPolicy",
            ),
        ];
        for (doc, field) in cases {
            let err = refusal(&doc);
            assert_eq!(err.field, field, "{doc}");
            assert!(!err.message.contains("hunter2"));
        }
    }

    /// Literal credentials are refused naming the key; environment references pass.
    /// A reference to a clawfleet secret passes (a bad name is refused at its id), and binding
    /// rewrites every reference to the secret's own single-value provider and renders that
    /// provider, the only `secrets.providers` entries of the document.
    #[test]
    fn clawfleet_secret_references_are_rendered_as_managed_providers() {
        let doc = json!({
            "channels": {"slack": {
                "botToken": {"source": "file", "provider": "clawfleet", "id": "slack-bot"},
                "accounts": [{"appToken": {"source": "file", "provider": "clawfleet", "id": "slack-app"}}],
            }},
            "models": {"providers": {"openai": {"apiKey": {"source": "file", "provider": "clawfleet", "id": "slack-bot"}}}},
        });
        let rendered = render(&doc).unwrap();
        let refs: Vec<(String, String)> = secret_references(&rendered)
            .unwrap()
            .into_iter()
            .map(|(p, n)| (p, n.to_string()))
            .collect();
        assert_eq!(
            refs,
            vec![
                (
                    "channels.slack.accounts[0].appToken".to_owned(),
                    "slack-app".to_owned()
                ),
                ("channels.slack.botToken".to_owned(), "slack-bot".to_owned()),
                (
                    "models.providers.openai.apiKey".to_owned(),
                    "slack-bot".to_owned()
                ),
            ]
        );
        let mut bound = rendered.clone();
        bind_secrets(&mut bound).unwrap();
        assert_eq!(
            bound["channels"]["slack"]["botToken"],
            json!({"source": "file", "provider": "clawfleet-slack-bot", "id": "value"})
        );
        assert_eq!(
            bound["channels"]["slack"]["accounts"][0]["appToken"],
            json!({"source": "file", "provider": "clawfleet-slack-app", "id": "value"})
        );
        assert_eq!(
            bound["secrets"]["providers"],
            json!({
                "clawfleet-slack-app": {"source": "file", "path": "/run/clawfleet/secrets/slack-app", "mode": "singleValue"},
                "clawfleet-slack-bot": {"source": "file", "path": "/run/clawfleet/secrets/slack-bot", "mode": "singleValue"},
            })
        );
        assert!(secret_references(&bound).unwrap().is_empty());
        // No reference, nothing added.
        let mut plain = render(&json!({})).unwrap();
        bind_secrets(&mut plain).unwrap();
        assert!(plain.get("secrets").is_none());
        // A bad name, at its id; an operator's own provider, even one named like ours.
        for (doc, field) in [
            (
                json!({"channels": {"slack": {"botToken": {"source": "file", "provider": "clawfleet", "id": "Slack_Bot"}}}}),
                "channels.slack.botToken.id",
            ),
            (
                json!({"channels": {"slack": {"botToken": {"source": "file", "provider": "clawfleet", "id": 5}}}}),
                "channels.slack.botToken.id",
            ),
            (
                json!({"secrets": {"providers": {"clawfleet-x": {"source": "file", "path": "/run/clawfleet/secrets/x", "mode": "singleValue"}}}}),
                "secrets.providers.clawfleet-x",
            ),
            (
                json!({"channels": {"slack": {"botToken": {"source": "exec", "provider": "clawfleet", "id": "x"}}}}),
                "channels.slack.botToken.source",
            ),
        ] {
            let e = refusal(&doc);
            assert_eq!(e.field, field, "{doc}: {e}");
        }
        // Literal credentials stay refused.
        let e = refusal(&json!({"channels": {"slack": {"botToken": "xoxb-123"}}}));
        assert_eq!(e.field, "channels.slack.botToken");
    }

    #[test]
    fn literal_secrets_are_refused_and_env_references_pass() {
        for (doc, field) in [
            (
                json!({"models": {"providers": {"openai": {"apiKey": "sk-live-123"}}}}),
                "models.providers.openai.apiKey",
            ),
            (
                json!({"channels": {"telegram": {"botToken": "123:abc"}}}),
                "channels.telegram.botToken",
            ),
            (
                json!({"channels": {"slack": {"accounts": [{"client_secret": "s"}]}}}),
                "channels.slack.accounts[0].client_secret",
            ),
            (
                json!({"models": {"providers": {"x": {"apiKey": "${lower}"}}}}),
                "models.providers.x.apiKey",
            ),
        ] {
            let err = refusal(&doc);
            assert_eq!(err.field, field, "{doc}");
            assert!(err.message.contains("env file"), "{}", err.message);
            assert!(!err.message.contains("sk-live"), "{}", err.message);
        }
        for doc in [
            json!({"models": {"providers": {"openai": {"apiKey": "${OPENAI_API_KEY}"}}}}),
            json!({"models": {"providers": {"openai": {"apiKey": ""}}}}),
            json!({"agents": {"defaults": {"maxTokens": 5}}}),
        ] {
            if let Err(e) = render(&doc) {
                assert!(!e.message.contains("literal secret"), "{doc}: {e}");
            }
        }
    }

    /// Another harness, a sandbox, plugins, secret providers and the other refused sections,
    /// each with the path its refusal names.
    #[test]
    fn refuses_another_harness_a_sandbox_plugins_and_secret_providers_naming_the_path() {
        let cases = [
            // Another harness.
            (
                json!({"agents": {"defaults": {"agentRuntime": {"id": "codex"}}}}),
                "agents.defaults.agentRuntime.id",
            ),
            (
                json!({"agents": {"defaults": {"agentRuntime": {"id": "auto"}}}}),
                "agents.defaults.agentRuntime.id",
            ),
            (
                json!({"agents": {"defaults": {"agentRuntime": {"id": 7}}}}),
                "agents.defaults.agentRuntime.id",
            ),
            (
                json!({"agents": {"defaults": {"agentRuntime": "codex"}}}),
                "agents.defaults.agentRuntime",
            ),
            (
                json!({"agents": {"entries": {"main": {"agentRuntime": {"id": "codex-app-server"}}}}}),
                "agents.entries.main.agentRuntime.id",
            ),
            (
                json!({"agents": {"defaults": {"models": {"openai/gpt-5.5": {"agentRuntime": {"id": "codex"}}}}}}),
                "agents.defaults.models[\"openai/gpt-5.5\"].agentRuntime.id",
            ),
            (
                json!({"agents": {"entries": {"main": {"models": {"anthropic/claude-opus-5": {"agentRuntime": {"id": "claude-cli"}}}}}}}),
                "agents.entries.main.models[\"anthropic/claude-opus-5\"].agentRuntime.id",
            ),
            (
                json!({"agents": {"defaults": {"models": {"openai/gpt-5.5": {"pickerRuntimes": ["openclaw", "codex"]}}}}}),
                "agents.defaults.models[\"openai/gpt-5.5\"].pickerRuntimes[1]",
            ),
            (
                json!({"models": {"providers": {"openai": {"agentRuntime": {"id": "codex"}}}}}),
                "models.providers.openai.agentRuntime.id",
            ),
            (
                json!({"models": {"providers": {"openai": {"models": [{"id": "gpt-5.5"}, {"id": "gpt-6", "agentRuntime": {"id": "codex"}}]}}}}),
                "models.providers.openai.models[1].agentRuntime.id",
            ),
            (
                json!({"agents": {"entries": {"main": {"runtime": {"type": "acp", "acp": {"agent": "codex"}}}}}}),
                "agents.entries.main.runtime.type",
            ),
            (
                json!({"bindings": [{"agentId": "main", "match": {"channel": "slack"}}, {"type": "acp", "agentId": "main", "match": {"channel": "slack", "peer": {"id": "c1"}}}]}),
                "bindings[1].type",
            ),
            (json!({"acp": {"enabled": true}}), "acp.enabled"),
            // A sandbox.
            (
                json!({"agents": {"defaults": {"sandbox": {"mode": "all"}}}}),
                "agents.defaults.sandbox",
            ),
            (
                json!({"agents": {"entries": {"main": {"sandbox": {"mode": "non-main"}}}}}),
                "agents.entries.main.sandbox",
            ),
            // Plugins.
            (
                json!({"plugins": {"entries": {"codex": {"enabled": true}}}}),
                "plugins.entries",
            ),
            (
                json!({"plugins": {"load": {"paths": ["/opt/plugins"]}}}),
                "plugins.load",
            ),
            (json!({"plugins": {}}), "plugins"),
            // Secret providers, and the references that need one.
            (
                json!({"secrets": {"providers": {"vault": {"source": "exec", "command": "/usr/bin/vault-read", "args": ["x"]}}}}),
                "secrets.providers.vault",
            ),
            (
                json!({"secrets": {"providers": {"keys": {"source": "file", "path": "/etc/keys.json"}}}}),
                "secrets.providers.keys",
            ),
            (
                json!({"secrets": {"providers": {"default": {"source": "env"}}}}),
                "secrets.providers.default",
            ),
            (json!({"secrets": {"providers": {}}}), "secrets.providers"),
            (
                json!({"models": {"providers": {"openai": {"apiKey": {"source": "exec", "provider": "vault", "id": "openai"}}}}}),
                "models.providers.openai.apiKey.source",
            ),
            (
                json!({"channels": {"slack": {"botToken": {"source": "file", "provider": "keys", "id": "/slack"}}}}),
                "channels.slack.botToken.source",
            ),
            // The other refused sections.
            (
                json!({"env": {"vars": {"OPENAI_API_KEY": "sk-1"}}}),
                "env.vars",
            ),
            (
                json!({"nodeHost": {"autoUpdate": {}}}),
                "nodeHost.autoUpdate",
            ),
            (
                json!({"cloudWorkers": {"profiles": {}}}),
                "cloudWorkers.profiles",
            ),
            (json!({"desktop": {"enabled": true}}), "desktop.enabled"),
            (
                json!({"discovery": {"mdns": {"mode": "full"}}}),
                "discovery.mdns",
            ),
            // Unknown top-level sections.
            (json!({"surprise": {}}), "surprise"),
            (json!({"odd key": 1}), "[\"odd key\"]"),
        ];
        for (doc, field) in cases {
            let err = refusal(&doc);
            assert_eq!(err.field, field, "{doc}");
            assert!(
                err.to_string().starts_with(&format!("{field}: ")),
                "{doc}: {err}"
            );
            assert!(!err.to_string().contains("sk-1"), "{err}");
        }
        assert_eq!(Refusal::CODE, Code::ConfigurationRefused);
        let exec = refusal(
            &json!({"secrets": {"providers": {"vault": {"source": "exec", "command": "/bin/x"}}}}),
        );
        assert!(exec.message.contains("run a command"), "{exec}");
        let unknown = refusal(&json!({"surprise": {}}));
        assert!(
            unknown.message.contains("not a section") && unknown.message.contains("2026.9.6"),
            "{unknown}"
        );
    }

    #[test]
    fn accepts_the_embedded_harness_and_the_allowed_sections() {
        let docs = [
            json!({"agents": {"defaults": {"agentRuntime": {"id": "openclaw"}}}}),
            json!({"agents": {"defaults": {"agentRuntime": {"id": " OpenClaw "}}}}),
            json!({"agents": {"defaults": {"agentRuntime": {"id": "pi"}}}}),
            json!({"agents": {"defaults": {"agentRuntime": {}, "model": "openai/gpt-5.5",
                "models": {"openai/gpt-5.5": {"agentRuntime": {"id": "openclaw"}, "pickerRuntimes": ["openclaw"]}}}}}),
            json!({"agents": {"entries": {"main": {"runtime": {"type": "embedded"}}}}}),
            json!({"models": {"mode": "merge", "catalogRefresh": {"enabled": false},
                "providers": {"openai": {"agentRuntime": {"id": "openclaw"},
                    "apiKey": {"source": "env", "provider": "default", "id": "OPENAI_API_KEY"},
                    "models": [{"id": "gpt-5.5", "agentRuntime": {"id": "openclaw"}}]}}}}),
            json!({"secrets": {"defaults": {"env": "default"}, "egressProxy": {"enabled": false}}}),
            json!({"channels": {"slack": {"botToken": {"source": "store", "provider": "default", "id": "SLACK"}}}}),
            json!({"bindings": [{"agentId": "main", "match": {"channel": "slack"}}]}),
            json!({"tools": {"sandbox": {"tools": {}}}}),
            // What the gateway notes recommend (the port and logging file aside).
            json!({"gateway": {"mode": "local", "bind": "loopback", "auth": {"mode": "password"}},
                "update": {"checkOnStart": false}, "models": {"catalogRefresh": {"enabled": false}},
                "logging": {"level": "info"}}),
        ];
        for doc in docs {
            let out = render(&doc).unwrap_or_else(|e| panic!("{doc}: {e}"));
            for (key, value) in doc.as_object().unwrap() {
                if key != "gateway" {
                    assert_eq!(&out[key], value, "{key} was not passed through");
                }
            }
        }
    }

    #[test]
    fn every_section_of_the_reference_schema_has_one_decision() {
        let keys: Vec<&str> = SECTIONS.iter().map(|s| s.key).collect();
        let mut expected = REFERENCE_SECTIONS.to_vec();
        expected.push(TEST_SWITCHES_KEY);
        assert_eq!(keys, expected);
        for s in SECTIONS {
            assert!(!s.reason.is_empty() && !s.reason.contains('|'), "{s:?}");
        }
        assert_eq!(
            SECTIONS
                .iter()
                .filter(|s| s.decision == Rendered)
                .map(|s| s.key)
                .collect::<Vec<_>>(),
            ["gateway"]
        );
    }

    /// The table is what render applies: every refused section is refused with its reason,
    /// naming the section (or its first field), and every other one passes.
    #[test]
    fn render_applies_the_table() {
        for s in SECTIONS {
            let empty = json!({ s.key: {} });
            let with_field = json!({ s.key: {"probe": true} });
            match s.decision {
                Refused => {
                    let err = refusal(&empty);
                    assert_eq!(
                        (err.field.as_str(), err.message.as_str()),
                        (s.key, s.reason)
                    );
                    assert_eq!(refusal(&with_field).field, format!("{}.probe", s.key));
                }
                Allowed | Rendered => {
                    let out = render(&empty).unwrap_or_else(|e| panic!("{}: {e}", s.key));
                    assert!(out.get(s.key).is_some(), "{}", s.key);
                }
            }
        }
    }

    /// The coordinator README's "Configuration sections" table lists exactly these decisions.
    #[test]
    fn the_readme_lists_every_decision() {
        let readme = include_str!("../README.md");
        let expected: Vec<String> = SECTIONS
            .iter()
            .map(|s| format!("| `{}` | {} | {} |", s.key, s.decision.as_str(), s.reason))
            .collect();
        let missing: Vec<&String> = expected
            .iter()
            .filter(|row| !readme.lines().any(|l| l == row.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "coordinator/README.md lacks these rows of the configuration sections table:\n{}",
            missing
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
