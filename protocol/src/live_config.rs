//! Which configuration changes the OpenClaw gateway applies live, without a restart (issue 28).
//!
//! The gateway watches its configuration file and, in its default `hybrid` reload mode,
//! applies each changed path by the longest matching prefix of a table: hot (a subsystem
//! reloads), none (the next read sees it), or a restart of the gateway. The table below is
//! the subset documented as applied without a restart *and* without ending clients'
//! connections, in OpenClaw 2026.9.6's documentation of config hot reload; a path
//! no entry covers (channels, whose behaviour depends on the loaded plugin, the gateway's
//! server, credentials and access policy, discovery, browser infrastructure) is treated as
//! needing a restart, as the gateway itself does for unknown paths. Both backends decide
//! from this one table.

use serde_json::Value;

/// `(prefix, live)`: the longest prefix of a changed path that is in the table decides.
const TABLE: &[(&str, bool)] = &[
    ("agents", true),
    ("models", true),
    ("auth.order", true),
    ("auth.profiles", true),
    ("broadcast", true),
    ("worktreeRoot", true),
    ("worktreeAcceleration", true),
    ("hooks", true),
    ("cron", true),
    ("session", true),
    ("messages", true),
    ("tools", true),
    ("skills", true),
    ("mcp", true),
    // MCP Apps listener settings restart the gateway; its sandbox origin does not.
    ("mcp.apps", false),
    ("mcp.apps.sandboxOrigin", true),
    ("audio", true),
    ("talk", true),
    ("tts", true),
    ("memory.citations", true),
    ("attachments.ttlHours", true),
    ("plugins.entries", true),
    ("plugins.allow", true),
    ("plugins.deny", true),
    ("plugins.enabled", true),
    ("plugins.slots", true),
    ("plugins.load", true),
    ("ui", true),
    ("logging", true),
    ("identity", true),
    ("bindings", true),
    ("surfaces", true),
    ("approvals.exec", true),
    ("approvals.plugin", true),
    ("diagnostics.flags", true),
    ("diagnostics.cacheTrace.enabled", true),
    ("acp", true),
    ("update.checkOnStart", true),
    ("update.channel", true),
    ("update.auto.enabled", true),
    ("telemetry.enabled", true),
    ("gateway.http.endpoints", true),
    ("gateway.tools", true),
    ("gateway.nodes.browser", true),
    ("gateway.nodes.pairing", true),
    ("gateway.nodes.commands", true),
    ("gateway.push.apns.relay", true),
    ("gateway.terminal", true),
    ("transcripts.enabled", true),
    ("transcripts.autoStart", true),
];

/// Whether a change at `path` (dotted, e.g. `agents.defaults.model`) applies live.
pub fn applies_live(path: &str) -> bool {
    TABLE
        .iter()
        .filter(|(prefix, _)| {
            path == *prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
        .max_by_key(|(prefix, _)| prefix.len())
        .is_some_and(|(_, live)| *live)
}

/// The dotted paths at which two configurations differ: the deepest object keys whose values
/// differ (an array, or a value that changes type, counts as one path). Sorted.
pub fn changed_paths(old: &Value, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(old, new, &mut String::new(), &mut out);
    out.sort();
    out
}

fn walk(old: &Value, new: &Value, path: &mut String, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                walk(
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                    path,
                    out,
                );
                path.truncate(len);
            }
        }
        (a, b) if a == b => {}
        _ => out.push(if path.is_empty() {
            "(the whole configuration)".to_owned()
        } else {
            path.clone()
        }),
    }
}

/// Whether going from `old` to `new` is a live change: `Ok(paths)` when something changed and
/// every changed path applies live; `Err(the first path that needs a restart)` otherwise (or
/// `Err` naming that nothing changed).
pub fn live_change(old: &Value, new: &Value) -> Result<Vec<String>, String> {
    let paths = changed_paths(old, new);
    if paths.is_empty() {
        return Err("the configuration is unchanged".to_owned());
    }
    match paths.iter().find(|p| !applies_live(p)) {
        Some(p) => Err(format!("{p} is applied by a gateway restart only")),
        None => Ok(paths),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_longest_prefix_decides_and_unknown_paths_restart() {
        assert!(applies_live("agents"));
        assert!(applies_live("agents.defaults.model.primary"));
        assert!(applies_live("mcp.servers.x"));
        assert!(!applies_live("mcp.apps.port"));
        assert!(applies_live("mcp.apps.sandboxOrigin"));
        assert!(!applies_live("gateway.port"));
        assert!(!applies_live("gateway.auth.password"));
        assert!(applies_live("gateway.tools.allow"));
        assert!(!applies_live("channels.slack.botToken"));
        assert!(
            !applies_live("agentsX"),
            "a prefix matches whole segments only"
        );
        assert!(!applies_live("something.new"));
    }

    #[test]
    fn changed_paths_are_the_deepest_differing_keys() {
        let old =
            json!({"gateway": {"port": 1}, "agents": {"a": {"m": "x"}, "b": 1}, "tools": [1]});
        let new =
            json!({"gateway": {"port": 1}, "agents": {"a": {"m": "y"}, "c": 2}, "tools": [1, 2]});
        assert_eq!(
            changed_paths(&old, &new),
            vec!["agents.a.m", "agents.b", "agents.c", "tools"]
        );
        assert_eq!(changed_paths(&old, &old), Vec::<String>::new());
        assert_eq!(
            changed_paths(&json!(1), &json!(2)),
            vec!["(the whole configuration)"]
        );
    }

    #[test]
    fn a_live_change_needs_every_path_live() {
        let base = json!({"gateway": {"port": 1}, "logging": {"level": "info"}});
        let log = json!({"gateway": {"port": 1}, "logging": {"level": "debug"}});
        let port = json!({"gateway": {"port": 2}, "logging": {"level": "debug"}});
        assert_eq!(
            live_change(&base, &log),
            Ok(vec!["logging.level".to_owned()])
        );
        assert_eq!(
            live_change(&base, &port),
            Err("gateway.port is applied by a gateway restart only".to_owned())
        );
        assert!(live_change(&base, &base).is_err());
    }
}
