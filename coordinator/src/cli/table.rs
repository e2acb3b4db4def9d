//! Output of client commands: `--output json` prints the API's answer as it came; the
//! default table prints the named columns, or for a single object without columns one
//! `field  value` line per field, never raw JSON.

use serde_json::Value;

use super::out::{sanitise, say};
use super::{Cli, Output};

pub(crate) const CLUSTER_COLUMNS: &[(&str, &str)] = &[("CLUSTER", "name"), ("SERVER", "server")];

pub(crate) const AGENT_COLUMNS: &[(&str, &str)] = &[
    ("AGENT", "id"),
    ("DESIRED", "desiredState"),
    ("HOST", "host"),
    ("PORT", "port"),
    ("ACTIVE", "activeRevisionId"),
    ("SERVED", "servedRevisionId"),
    ("RESTORE", "restore"),
];

/// One field of an answer as a table cell, sanitised (see `out.rs`).
fn cell(v: &Value) -> String {
    sanitise(&raw_cell(v)).into_owned()
}

fn raw_cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| x.to_string())
            })
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

/// `path  value` lines for every scalar (or list of scalars) in a value, fields by name.
pub(crate) fn fields(value: &Value, path: &str, out: &mut Vec<(String, String)>) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    match value {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                fields(v, &join(k), out);
            }
        }
        Value::Array(items) if items.iter().any(|i| i.is_object() || i.is_array()) => {
            for (i, v) in items.iter().enumerate() {
                fields(v, &format!("{path}[{i}]"), out);
            }
        }
        other => out.push((
            if path.is_empty() {
                "value".to_owned()
            } else {
                path.to_owned()
            },
            cell(other),
        )),
    }
}

/// Prints an answer: JSON with `--output json`, else a table of `columns`, else field lines.
pub(crate) fn print(cli: &Cli, value: &Value, columns: &[(&str, &str)]) {
    if cli.output == Output::Json {
        super::out::json(value);
        return;
    }
    if columns.is_empty() {
        let mut out = Vec::new();
        fields(value, "", &mut out);
        let out: Vec<(String, String)> = out
            .into_iter()
            .map(|(k, v)| (sanitise(&k).into_owned(), v))
            .collect();
        let width = out.iter().map(|(k, _)| width_of(k)).max().unwrap_or(0);
        for (k, v) in out {
            say(format!("{}  {v}", pad(&k, width)).trim_end());
        }
        return;
    }
    let rows: Vec<&Value> = match value {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|(_, k)| cell(&r[*k])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (h, _))| {
            table
                .iter()
                .map(|r| width_of(&r[i]))
                .max()
                .unwrap_or(0)
                .max(h.len())
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| pad(c, widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    say(&line(columns.iter().map(|(h, _)| h.to_string()).collect()));
    for r in table {
        say(&line(r));
    }
}

/// Columns a cell takes (characters, not bytes: names may be in any script).
fn width_of(text: &str) -> usize {
    text.chars().count()
}

fn pad(text: &str, width: usize) -> String {
    format!("{text}{}", " ".repeat(width.saturating_sub(width_of(text))))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::fields;

    #[test]
    fn an_object_without_columns_becomes_one_line_per_field() {
        let mut out = Vec::new();
        fields(
            &json!({"name": "h1", "missingTools": ["a", "b"], "probe": {"ok": true, "units": [{"n": 1}]}, "none": null}),
            "",
            &mut out,
        );
        let lines: Vec<String> = out.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            lines,
            [
                "missingTools=a,b",
                "name=h1",
                "none=-",
                "probe.ok=true",
                "probe.units[0].n=1"
            ]
        );
    }
}
