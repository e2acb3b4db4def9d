//! Output of client commands: `--output json` prints the API's typed answer as JSON; the
//! default table prints typed columns ([`Column`]), or for a single object without columns
//! one `field  value` line per field, never raw JSON.

use coordinator::model::{Agent, Cluster};
use serde::Serialize;
use serde_json::Value;

use super::out::{sanitise, say};
use super::{Cli, Output};

/// A column of a table of `T`: its head, and how a row shows in it (the answer's typed
/// fields, never JSON looked up by name).
pub(crate) struct Column<T> {
    pub(crate) head: &'static str,
    pub(crate) cell: fn(&T) -> String,
}

/// A column of a table of `T`.
pub(crate) const fn col<T>(head: &'static str, cell: fn(&T) -> String) -> Column<T> {
    Column { head, cell }
}

/// An optional value as a cell: `-` when absent.
pub(crate) fn opt<D: std::fmt::Display>(value: &Option<D>) -> String {
    value.as_ref().map_or_else(|| "-".to_owned(), D::to_string)
}

/// A list as a cell: its items joined by commas.
pub(crate) fn list<D: std::fmt::Display>(items: &[D]) -> String {
    items.iter().map(D::to_string).collect::<Vec<_>>().join(",")
}

/// A value that serializes as text (an enum of the protocol) as a cell: its text.
pub(crate) fn text<T: Serialize>(value: &T) -> String {
    match to_json(value) {
        Value::String(s) => s,
        other => raw_cell(&other),
    }
}

pub(crate) const CLUSTER_COLUMNS: &[Column<Cluster>] = &[
    col("CLUSTER", |c| c.name.clone()),
    col("SERVER", |c| c.server.clone()),
];

pub(crate) const AGENT_COLUMNS: &[Column<Agent>] = &[
    col("AGENT", |a| a.id.to_string()),
    col("DESIRED", |a| a.desired_state.as_str().to_owned()),
    col("HOST", |a| opt(&a.host)),
    col("PORT", |a| opt(&a.port)),
    col("ACTIVE", |a| opt(&a.active_revision_id)),
    col("SERVED", |a| opt(&a.served_revision_id)),
    col("RESTORE", |a| a.restore.as_str().to_owned()),
    col("EGRESS", |a| super::agent::egress_cell(a.egress.as_ref())),
];

/// One field of an answer as a table cell, sanitised (see `out.rs`).
fn cell(v: &Value) -> String {
    sanitise(&raw_cell(v)).into_owned()
}

/// A JSON field of an answer (a free-form detail) as a cell: `-` for null, a string as it
/// is, a list joined by commas, anything else as JSON.
pub(crate) fn raw_cell(v: &Value) -> String {
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

/// An answer as JSON (what `--output json` prints).
pub(crate) fn to_json<T: Serialize>(value: &T) -> Value {
    // The API's types serialize to JSON without fail (string keys, no non-finite floats).
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Prints an answer: JSON with `--output json`, else one `field  value` line per field.
pub(crate) fn print_fields<T: Serialize>(cli: &Cli, value: &T) {
    let value = to_json(value);
    if cli.output == Output::Json {
        super::out::json(&value);
        return;
    }
    let mut out = Vec::new();
    fields(&value, "", &mut out);
    let out: Vec<(String, String)> = out
        .into_iter()
        .map(|(k, v)| (sanitise(&k).into_owned(), v))
        .collect();
    let width = out.iter().map(|(k, _)| width_of(k)).max().unwrap_or(0);
    for (k, v) in out {
        say(format!("{}  {v}", pad(&k, width)).trim_end());
    }
}

/// Prints one answer: JSON with `--output json`, else a table of `columns` with one row.
pub(crate) fn print_one<T: Serialize>(cli: &Cli, row: &T, columns: &[Column<T>]) {
    if cli.output == Output::Json {
        super::out::json(&to_json(row));
        return;
    }
    table(std::slice::from_ref(row), columns);
}

/// Prints a list answer: JSON with `--output json`, else a table of `columns`.
pub(crate) fn print_rows<T: Serialize>(cli: &Cli, rows: &[T], columns: &[Column<T>]) {
    if cli.output == Output::Json {
        super::out::json(&to_json(&rows));
        return;
    }
    table(rows, columns);
}

/// A table of `columns`, one line per row, every cell sanitised.
pub(crate) fn table<T>(rows: &[T], columns: &[Column<T>]) {
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .map(|c| sanitise(&(c.cell)(r)).into_owned())
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            table
                .iter()
                .map(|r| width_of(&r[i]))
                .max()
                .unwrap_or(0)
                .max(c.head.len())
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
    say(&line(columns.iter().map(|c| c.head.to_string()).collect()));
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
