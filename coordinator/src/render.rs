//! Rendering of the native `openclaw.json` for an SSH-hosted embedded gateway, before any host
//! work, and clear refusals of everything out of scope (peer study §C.6).
//!
//! The rendered document always has `gateway.mode: "local"`, `gateway.bind: "loopback"` and
//! password auth through the managed `OPENCLAW_GATEWAY_PASSWORD` (unless the operator chose
//! trusted-proxy). The port is assigned by the host and given to the gateway in its unit's
//! environment (`OPENCLAW_GATEWAY_PORT`), so a configuration may not set one.

use serde_json::{Map, Value, json};
use thiserror::Error;

/// Why a configuration cannot be deployed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {message}")]
pub struct Refusal {
    /// Dotted path of the offending field.
    pub field: String,
    pub message: String,
}

fn refuse(field: &str, message: impl Into<String>) -> Refusal {
    Refusal {
        field: field.to_owned(),
        message: message.into(),
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
    if let Some(agents) = root.get("agents") {
        if agents.get("list").is_some() {
            return Err(refuse(
                "agents.list",
                "only the native main Agent is supported; remove agents.list",
            ));
        }
        if let Some(entries) = agents.get("entries").and_then(Value::as_object)
            && entries.keys().any(|k| k != "main")
        {
            return Err(refuse(
                "agents.entries",
                "only the native main Agent is supported",
            ));
        }
    }
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
    gw.insert("mode".to_owned(), json!("local"));
    gw.insert("bind".to_owned(), json!("loopback"));
    let auth = gw
        .entry("auth")
        .or_insert_with(|| Value::Object(Map::new()));
    let auth = object(auth, "gateway.auth")?;
    if let Some(key) = auth.keys().find(|k| !AUTH_KEYS.contains(&k.as_str())) {
        return Err(refuse(
            &format!("gateway.auth.{key}"),
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
    if let Some(policy) = root
        .get("agents")
        .and_then(|a| a.get("defaults"))
        .and_then(|d| d.get("codex"))
        .and_then(|c| c.get("approvalPolicy"))
        && policy == "untrusted"
    {
        return Err(refuse(
            "agents.defaults.codex.approvalPolicy",
            "\"untrusted\" is not supported on SSH hosts",
        ));
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            (json!({"agents": {"list": []}}), "agents.list"),
            (
                json!({"agents": {"entries": {"other": {}}}}),
                "agents.entries",
            ),
            (
                json!({"agents": {"defaults": {"codex": {"approvalPolicy": "untrusted"}}}}),
                "agents.defaults.codex.approvalPolicy",
            ),
        ];
        for (doc, field) in cases {
            let err = render(&doc).unwrap_err();
            assert_eq!(err.field, field, "{doc}");
            assert!(!err.message.contains("hunter2"));
        }
    }
}
