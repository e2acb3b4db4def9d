//! Reading the launch contract (environment + configuration file) into a [`Settings`].
//!
//! Everything here is pure (the environment and the file bytes are passed in), so the rules that
//! decide between "start" and "exit 78" are unit-tested without a process.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The reserved top-level configuration key that carries the behaviour switches.
pub const SWITCHES_KEY: &str = "x-clawfleet-test";

/// Behaviour switches from `x-clawfleet-test`; all optional, defaults mean "a healthy gateway".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Switches {
    /// Answer 503 on `/readyz` for this long after start, then 200.
    pub ready_after_ms: u64,
    /// Never answer 200 on `/readyz` (readiness timeouts).
    pub never_ready: bool,
    /// Exit 1 right after the configuration was accepted (a crash loop).
    pub crash_at_start: bool,
    /// Exit 1 this long after start (a crash after readiness).
    pub crash_after_ms: Option<u64>,
    /// Free text reported by `/info`, normally the revision id, so tests can ask what is served.
    pub label: Option<String>,
    /// Isolation probes run once at start, as the gateway's own user inside its unit; their
    /// results are reported by `/info` under `probe`.
    pub probe: Probe,
    /// Lines written to stderr (the journal) at start, before anything else; `${PASSWORD}` in
    /// a line becomes the gateway's own password and `${ENV:NAME}` the value of its
    /// environment variable `NAME` (for the redaction tests).
    pub log_lines: Vec<String>,
    /// This many bytes of numbered filler lines written to stderr at start (log volume tests).
    pub log_bytes: u64,
    /// How often the configuration file is looked at (milliseconds, 1 to 10000; unset: the
    /// watch's default). A short period makes the gateway see a replaced file at once, as a
    /// file-system watch does.
    pub config_poll_ms: Option<u64>,
    /// Lines written to stderr after the secrets resolve, at start and after every successful
    /// `secrets.reload`; `${SECRET:<source>:<provider>:<id>}` becomes the value the gateway now
    /// holds for that ref (for the redaction tests: a gateway that prints its secrets).
    pub secret_log_lines: Vec<String>,
}

/// `x-clawfleet-test.probe`: what a compromised gateway would try, run once at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// Named `/bin/sh -c` commands; `/info` reports each one's exit status and output.
    pub commands: Vec<(String, String)>,
    /// TCP ports to try to bind on 127.0.0.1; `/info` reports "ok" or the error with its errno.
    pub bind_ports: Vec<u16>,
}

/// Everything the gateway needs to run, already validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub port: u16,
    /// `gateway.bind`: `"loopback"` (the default) listens on 127.0.0.1, `"lan"` on 0.0.0.0 (the
    /// cluster rendering: in a Pod the kubelet's probe and the Service reach the Pod address).
    pub listen: Ipv4Addr,
    /// `realpath` of `OPENCLAW_CONFIG_PATH`: shows which revision directory `current` resolved to.
    pub config_path: PathBuf,
    /// Lower-case hex sha256 of the exact configuration bytes.
    pub config_sha256: String,
    pub password_sha256: Option<String>,
    pub state_dir: Option<String>,
    pub home: Option<String>,
    pub switches: Switches,
    /// `secrets.providers` and the file SecretRefs in the configuration.
    pub secrets: crate::secrets::Spec,
    /// `gateway.auth.mode` is `"none"`: the WebSocket `connect` needs no password.
    pub auth_none: bool,
}

/// A configuration error: the gateway exits with status 78 and prints this sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// Lower-case hex of sha256 (sha2 0.11 has no `LowerHex` on its output).
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `text` with every `${ENV:NAME}` replaced by `lookup(NAME)` (empty when unset).
pub fn expand_env(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${ENV:") {
        let after = &rest[at + "${ENV:".len()..];
        let Some(end) = after.find('}') else {
            break;
        };
        out.push_str(&rest[..at]);
        out.push_str(&lookup(&after[..end]).unwrap_or_default());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Parses `OPENCLAW_GATEWAY_PORT`: a decimal port 1..=65535.
pub fn parse_port(value: Option<&str>) -> Result<u16, ConfigError> {
    let raw = value.ok_or_else(|| err("OPENCLAW_GATEWAY_PORT is not set"))?;
    match raw.trim().parse::<u16>() {
        Ok(0) | Err(_) => Err(err(format!(
            "OPENCLAW_GATEWAY_PORT={raw:?} is not a port number between 1 and 65535"
        ))),
        Ok(port) => Ok(port),
    }
}

/// Parses the configuration file bytes and the switches; `password_set` says whether
/// `OPENCLAW_GATEWAY_PASSWORD` is present and non-empty.
pub fn parse_config(bytes: &[u8], password_set: bool) -> Result<Switches, ConfigError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| err(format!("the configuration is not valid JSON: {e}")))?;
    let Value::Object(root) = value else {
        return Err(err("the configuration is not a JSON object"));
    };
    let auth_mode = root
        .get("gateway")
        .and_then(|g| g.get("auth"))
        .and_then(|a| a.get("mode"));
    if let Some(mode) = auth_mode {
        let Some(mode) = mode.as_str() else {
            return Err(err("gateway.auth.mode is not a string"));
        };
        // A SecretRef in gateway.auth.password is resolved with the other secrets.
        let password_ref = root
            .get("gateway")
            .and_then(|g| g.get("auth"))
            .and_then(|a| a.get("password"))
            .is_some_and(Value::is_object);
        if mode == "password" && !password_set && !password_ref {
            return Err(err(
                "gateway auth is set to password, but OPENCLAW_GATEWAY_PASSWORD is not set",
            ));
        }
    }
    match root.get(SWITCHES_KEY) {
        None => Ok(Switches::default()),
        Some(Value::Object(map)) => parse_switches(map),
        Some(_) => Err(err(format!("{SWITCHES_KEY} is not a JSON object"))),
    }
}

fn parse_switches(map: &Map<String, Value>) -> Result<Switches, ConfigError> {
    let mut s = Switches::default();
    for (key, value) in map {
        let bad = |what: &str| err(format!("{SWITCHES_KEY}.{key} must be {what}"));
        match key.as_str() {
            "readyAfterMs" => {
                s.ready_after_ms = value
                    .as_u64()
                    .ok_or_else(|| bad("a non-negative integer"))?
            }
            "neverReady" => s.never_ready = value.as_bool().ok_or_else(|| bad("a boolean"))?,
            "crashAtStart" => s.crash_at_start = value.as_bool().ok_or_else(|| bad("a boolean"))?,
            "crashAfterMs" => {
                s.crash_after_ms = Some(
                    value
                        .as_u64()
                        .ok_or_else(|| bad("a non-negative integer"))?,
                )
            }
            "label" => s.label = Some(value.as_str().ok_or_else(|| bad("a string"))?.to_owned()),
            "configPollMs" => {
                s.config_poll_ms = Some(
                    value
                        .as_u64()
                        .filter(|ms| (1..=10_000).contains(ms))
                        .ok_or_else(|| bad("an integer between 1 and 10000"))?,
                )
            }
            "probe" => s.probe = parse_probe(value)?,
            "logLines" => {
                s.log_lines = value
                    .as_array()
                    .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_owned)).collect())
                    .ok_or_else(|| bad("an array of strings"))?
            }
            "secretLogLines" => {
                s.secret_log_lines = value
                    .as_array()
                    .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_owned)).collect())
                    .ok_or_else(|| bad("an array of strings"))?
            }
            "logBytes" => {
                s.log_bytes = value
                    .as_u64()
                    .ok_or_else(|| bad("a non-negative integer"))?
            }
            other => {
                return Err(err(format!(
                    "unknown switch {SWITCHES_KEY}.{other} (known: readyAfterMs, neverReady, \
                     crashAtStart, crashAfterMs, label, configPollMs, probe, logLines, \
                     logBytes, secretLogLines)"
                )));
            }
        }
    }
    Ok(s)
}

fn parse_probe(value: &Value) -> Result<Probe, ConfigError> {
    let Value::Object(map) = value else {
        return Err(err(format!("{SWITCHES_KEY}.probe must be a JSON object")));
    };
    let mut probe = Probe::default();
    for (key, value) in map {
        match key.as_str() {
            "commands" => {
                let Value::Object(commands) = value else {
                    return Err(err(format!(
                        "{SWITCHES_KEY}.probe.commands must be an object of name to shell command"
                    )));
                };
                for (name, cmd) in commands {
                    let cmd = cmd.as_str().ok_or_else(|| {
                        err(format!(
                            "{SWITCHES_KEY}.probe.commands.{name} must be a string"
                        ))
                    })?;
                    probe.commands.push((name.clone(), cmd.to_owned()));
                }
            }
            "bindPorts" => {
                let ports = value.as_array().ok_or_else(|| {
                    err(format!("{SWITCHES_KEY}.probe.bindPorts must be an array"))
                })?;
                for p in ports {
                    let port = p
                        .as_u64()
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|n| *n > 0)
                        .ok_or_else(|| {
                            err(format!(
                                "{SWITCHES_KEY}.probe.bindPorts must hold ports between 1 and 65535"
                            ))
                        })?;
                    probe.bind_ports.push(port);
                }
            }
            other => {
                return Err(err(format!(
                    "unknown switch {SWITCHES_KEY}.probe.{other} (known: commands, bindPorts)"
                )));
            }
        }
    }
    Ok(probe)
}

/// The address `gateway.bind` asks for, as OpenClaw names its modes: absent or `"loopback"`
/// is 127.0.0.1, `"lan"` is 0.0.0.0; the other modes (`tailnet`, `auto`, `custom`) need
/// interfaces this stand-in does not look for, so they are configuration errors.
pub fn parse_bind(bytes: &[u8]) -> Result<Ipv4Addr, ConfigError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| err(format!("the configuration is not valid JSON: {e}")))?;
    match value.get("gateway").and_then(|g| g.get("bind")) {
        None => Ok(Ipv4Addr::LOCALHOST),
        Some(Value::String(mode)) if mode == "loopback" => Ok(Ipv4Addr::LOCALHOST),
        Some(Value::String(mode)) if mode == "lan" => Ok(Ipv4Addr::UNSPECIFIED),
        Some(other) => Err(err(format!(
            "gateway.bind {other} is not supported by the test gateway (known: \"loopback\", \"lan\")"
        ))),
    }
}

/// Reads the whole launch contract from an environment lookup function.
pub fn load(env: impl Fn(&str) -> Option<String>) -> Result<Settings, ConfigError> {
    let port = parse_port(env("OPENCLAW_GATEWAY_PORT").as_deref())?;
    let path = env("OPENCLAW_CONFIG_PATH")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| err("OPENCLAW_CONFIG_PATH is not set"))?;
    let config_path = std::fs::canonicalize(&path)
        .map_err(|e| err(format!("the configuration {path} cannot be resolved: {e}")))?;
    let bytes = std::fs::read(&config_path).map_err(|e| {
        err(format!(
            "the configuration {} cannot be read: {e}",
            config_path.display()
        ))
    })?;
    let password = env("OPENCLAW_GATEWAY_PASSWORD").filter(|p| !p.is_empty());
    let switches = parse_config(&bytes, password.is_some())?;
    let home = env("HOME");
    let (secrets, auth_none) = parse_secrets(&bytes, home.as_deref())?;
    Ok(Settings {
        port,
        listen: parse_bind(&bytes)?,
        config_path,
        config_sha256: sha256_hex(&bytes),
        password_sha256: password.map(|p| sha256_hex(p.as_bytes())),
        state_dir: env("OPENCLAW_STATE_DIR"),
        home,
        switches,
        secrets,
        auth_none,
    })
}

/// The secrets part of the configuration (after [`parse_config`] accepted the bytes) and whether
/// `gateway.auth.mode` is `"none"`.
pub fn parse_secrets(
    bytes: &[u8],
    home: Option<&str>,
) -> Result<(crate::secrets::Spec, bool), ConfigError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| err(format!("the configuration is not valid JSON: {e}")))?;
    let Value::Object(root) = value else {
        return Err(err("the configuration is not a JSON object"));
    };
    let auth_none = root
        .get("gateway")
        .and_then(|g| g.get("auth"))
        .and_then(|a| a.get("mode"))
        .and_then(Value::as_str)
        == Some("none");
    let spec = crate::secrets::parse_spec(&root, home).map_err(err)?;
    Ok((spec, auth_none))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_modes_pick_the_listen_address() {
        assert_eq!(parse_bind(b"{}"), Ok(Ipv4Addr::LOCALHOST));
        assert_eq!(
            parse_bind(br#"{"gateway":{"bind":"loopback"}}"#),
            Ok(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(
            parse_bind(br#"{"gateway":{"bind":"lan"}}"#),
            Ok(Ipv4Addr::UNSPECIFIED)
        );
        let e = parse_bind(br#"{"gateway":{"bind":"tailnet"}}"#).unwrap_err();
        assert!(e.0.contains("gateway.bind"), "{e}");
    }

    #[test]
    fn port_must_be_a_nonzero_u16() {
        assert_eq!(parse_port(Some("18700")), Ok(18700));
        assert!(parse_port(None).is_err());
        assert!(parse_port(Some("0")).is_err());
        assert!(parse_port(Some("70000")).is_err());
        assert!(parse_port(Some("abc")).is_err());
        assert!(parse_port(Some("")).is_err());
    }

    #[test]
    fn minimal_config_gives_defaults() {
        assert_eq!(parse_config(b"{}", false), Ok(Switches::default()));
        let rendered = br#"{"gateway":{"mode":"local","bind":"loopback","port":18700}}"#;
        assert_eq!(parse_config(rendered, false), Ok(Switches::default()));
    }

    #[test]
    fn invalid_json_or_non_object_is_a_config_error() {
        assert!(parse_config(b"{", false).is_err());
        assert!(parse_config(b"[]", false).is_err());
        assert!(parse_config(b"", false).is_err());
    }

    #[test]
    fn password_auth_needs_the_env_password() {
        let cfg = br#"{"gateway":{"auth":{"mode":"password"}}}"#;
        let e = parse_config(cfg, false).unwrap_err();
        assert!(e.0.contains("OPENCLAW_GATEWAY_PASSWORD"), "{e}");
        assert!(parse_config(cfg, true).is_ok());
        let other = br#"{"gateway":{"auth":{"mode":"trusted-proxy"}}}"#;
        assert!(parse_config(other, false).is_ok());
        assert!(parse_config(br#"{"gateway":{"auth":{"mode":1}}}"#, true).is_err());
    }

    #[test]
    fn switches_are_parsed() {
        let cfg = br#"{"x-clawfleet-test":{"readyAfterMs":250,"neverReady":true,
            "crashAtStart":false,"crashAfterMs":900,"label":"rev-7","configPollMs":1,"logLines":["a","b"],
            "logBytes":10,"secretLogLines":["s ${SECRET:file:p:value}"]}}"#;
        let s = parse_config(cfg, false).unwrap();
        assert_eq!(
            s,
            Switches {
                ready_after_ms: 250,
                never_ready: true,
                crash_at_start: false,
                crash_after_ms: Some(900),
                label: Some("rev-7".into()),
                config_poll_ms: Some(1),
                probe: Probe::default(),
                log_lines: vec!["a".into(), "b".into()],
                log_bytes: 10,
                secret_log_lines: vec!["s ${SECRET:file:p:value}".into()],
            }
        );
    }

    #[test]
    fn probe_switch_is_parsed_and_checked() {
        let cfg =
            br#"{"x-clawfleet-test":{"probe":{"commands":{"id":"id -u"},"bindPorts":[18700]}}}"#;
        let s = parse_config(cfg, false).unwrap();
        assert_eq!(
            s.probe.commands,
            vec![("id".to_owned(), "id -u".to_owned())]
        );
        assert_eq!(s.probe.bind_ports, vec![18700]);
        for bad in [
            br#"{"x-clawfleet-test":{"probe":[]}}"#.as_slice(),
            br#"{"x-clawfleet-test":{"probe":{"commands":{"id":1}}}}"#,
            br#"{"x-clawfleet-test":{"probe":{"bindPorts":[0]}}}"#,
            br#"{"x-clawfleet-test":{"probe":{"bindPorts":[70000]}}}"#,
            br#"{"x-clawfleet-test":{"probe":{"other":1}}}"#,
        ] {
            assert!(parse_config(bad, false).is_err());
        }
    }

    #[test]
    fn unknown_or_mistyped_switches_are_config_errors() {
        let unknown = br#"{"x-clawfleet-test":{"readyAfter":1}}"#;
        assert!(
            parse_config(unknown, false)
                .unwrap_err()
                .0
                .contains("readyAfter")
        );
        assert!(parse_config(br#"{"x-clawfleet-test":{"readyAfterMs":-1}}"#, false).is_err());
        assert!(parse_config(br#"{"x-clawfleet-test":{"neverReady":"yes"}}"#, false).is_err());
        assert!(parse_config(br#"{"x-clawfleet-test":{"label":5}}"#, false).is_err());
        for poll in ["0", "10001", "1.5", "\"1\""] {
            let cfg = format!(r#"{{"x-clawfleet-test":{{"configPollMs":{poll}}}}}"#);
            let e = parse_config(cfg.as_bytes(), false).unwrap_err();
            assert!(e.0.contains("configPollMs"), "{poll}: {e}");
        }
        assert!(parse_config(br#"{"x-clawfleet-test":[]}"#, false).is_err());
    }

    #[test]
    fn load_resolves_the_path_and_hashes_the_bytes() {
        let dir = std::env::temp_dir().join(format!("cftg-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("openclaw.json");
        std::fs::write(&real, br#"{"x-clawfleet-test":{"label":"r1"}}"#).unwrap();
        let link = dir.join("current.json");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let link_s = link.to_string_lossy().into_owned();
        let s = load(|k| match k {
            "OPENCLAW_GATEWAY_PORT" => Some("18701".into()),
            "OPENCLAW_CONFIG_PATH" => Some(link_s.clone()),
            _ => None,
        })
        .unwrap();
        assert_eq!(s.port, 18701);
        assert_eq!(s.config_path, std::fs::canonicalize(&real).unwrap());
        assert_eq!(
            s.config_sha256,
            sha256_hex(br#"{"x-clawfleet-test":{"label":"r1"}}"#)
        );
        assert_eq!(s.switches.label.as_deref(), Some("r1"));
        assert!(s.password_sha256.is_none());
        let missing = load(|k| match k {
            "OPENCLAW_GATEWAY_PORT" => Some("18701".into()),
            "OPENCLAW_CONFIG_PATH" => Some(dir.join("nope.json").to_string_lossy().into()),
            _ => None,
        });
        assert!(missing.is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sha256_hex_matches_a_known_vector() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn env_references_in_log_lines_are_expanded() {
        let lookup = |name: &str| (name == "A").then(|| "va".to_owned());
        assert_eq!(expand_env("x ${ENV:A} y ${ENV:B} z", lookup), "x va y  z");
        assert_eq!(expand_env("open ${ENV:A", lookup), "open ${ENV:A");
    }
}
