//! `/openapi.json`, generated from the route table: every route with its path parameters,
//! body, success status, error responses and access rule.

use serde_json::{Map, Value, json};

use super::access::Access;
use super::routes::{Body, ROUTES};
use crate::service::{HOST_NAME_PATTERN, IDENT_PATTERN};

/// What each path parameter names, and its schema.
fn parameter(name: &str) -> (&'static str, Value) {
    let ident = json!({"type": "string", "pattern": IDENT_PATTERN});
    match name {
        "ns" => ("Namespace id", ident),
        "cfg" => ("Configuration id", ident),
        "agent" => ("Agent id", ident),
        "rev" => ("Revision id (rev-N)", ident),
        "host" => (
            "Host name",
            json!({"type": "string", "pattern": HOST_NAME_PATTERN}),
        ),
        "cluster" => ("Cluster name", ident),
        "work" => (
            "Work item number",
            json!({"type": "string", "pattern": "^[0-9]{1,18}$"}),
        ),
        "rollout" => (
            "Rollout number",
            json!({"type": "string", "pattern": "^[1-9][0-9]{0,17}$"}),
        ),
        "id" => (
            "Token id",
            json!({"type": "string", "pattern": "^[0-9a-f]{1,32}$"}),
        ),
        _ => ("Identifier", json!({"type": "string"})),
    }
}

/// The `{name}` segments of a path, in order.
pub fn path_parameters(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
        .collect()
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    })
}

/// Every code an error answer may carry: the coordinator's own, then the protocol's (hostd and
/// the Kubernetes backend), each with what it means.
fn codes() -> (Vec<&'static str>, Vec<Value>) {
    let mut names = Vec::new();
    let mut described = Vec::new();
    for c in crate::codes::Code::ALL {
        names.push(c.as_str());
        described.push(json!({"code": c.as_str(), "from": "coordinator", "meaning": c.describe()}));
    }
    for c in clawfleet_protocol::failure::FailureCode::ALL {
        if names.contains(&c.as_str()) {
            continue;
        }
        names.push(c.as_str());
        described.push(json!({"code": c.as_str(), "from": "target", "retryable": c.default_class() == clawfleet_protocol::failure::FailureClass::Retryable}));
    }
    (names, described)
}

/// The query parameters of a query type's schema: one optional parameter per property.
fn query_parameters(schema: &Value) -> Vec<Value> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, prop)| {
            let mut prop = prop.clone();
            let description = prop
                .as_object_mut()
                .and_then(|o| o.remove("description"))
                .unwrap_or(Value::Null);
            // `Option<T>` is `type: [T, "null"]`; a query parameter is absent instead.
            if let Some(types) = prop.get("type").and_then(Value::as_array) {
                let concrete: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if concrete.len() == 1 {
                    prop["type"] = concrete[0].clone();
                }
            }
            json!({
                "name": name,
                "in": "query",
                "required": false,
                "description": description,
                "schema": prop,
            })
        })
        .collect()
}

/// The whole document.
pub fn document() -> Value {
    let (code_names, code_list) = codes();
    let mut paths = Map::new();
    for r in ROUTES {
        let mut responses = Map::new();
        // A list route's query is the page query, and nothing else.
        let paged = matches!(r.body, Body::Query(schema)
            if schema() == super::routes::schema_of::<crate::service::page::PageQuery>());
        let ok = if r.success == 204 {
            json!({"description": "Done; no body"})
        } else if paged {
            json!({"description": "One page of the list, a JSON array in the list's order",
                   "headers": {"X-Next-Cursor": {
                       "description": "The cursor of the next page (pass it as `cursor`); absent on the last page",
                       "schema": {"type": "string"}}},
                   "content": {"application/json": {"schema": {"type": "array"}}}})
        } else if r.path == "/metrics" {
            json!({"description": "Prometheus text format",
                   "content": {"text/plain": {"schema": {"type": "string"}}}})
        } else {
            json!({"description": "JSON", "content": {"application/json": {"schema": {}}}})
        };
        responses.insert(r.success.to_string(), ok);
        if r.access != Access::Public {
            responses.insert(
                "401".into(),
                error_response("No, an unknown, a revoked or an expired token"),
            );
        }
        if r.access.role().is_some() {
            responses.insert("403".into(), error_response("The token lacks the role"));
        }
        responses.insert(
            "default".into(),
            error_response("Any other error, with a stable code"),
        );
        let mut parameters: Vec<Value> = path_parameters(r.path)
            .into_iter()
            .map(|p| {
                let (description, schema) = parameter(p);
                json!({
                    "name": p,
                    "in": "path",
                    "required": true,
                    "description": description,
                    "schema": schema,
                })
            })
            .collect();
        if let Body::Query(schema) = r.body {
            parameters.extend(query_parameters(&schema()));
        }
        let mut op = json!({
            "operationId": r.operation,
            "summary": r.summary,
            "x-clawfleet-access": r.access.describe(),
            "security": if r.access == Access::Public { json!([]) } else { json!([{"bearer": []}]) },
            "responses": responses,
        });
        if !parameters.is_empty() {
            op["parameters"] = Value::Array(parameters);
        }
        if let Body::Json(schema) = r.body {
            op["requestBody"] = json!({
                "required": true,
                "content": {"application/json": {"schema": schema()}},
            });
        }
        let entry = paths.entry(r.path.to_owned()).or_insert_with(|| json!({}));
        entry[r.method.as_str()] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "clawfleet coordinator",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Timestamps (createdAt, at, expiresAt) are whole seconds since the epoch, UTC. Request bodies are strict JSON: unknown fields are refused with 400 INVALID_BODY naming the field.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {
                        "code": {"type": "string", "enum": code_names},
                        "message": {"type": "string"},
                    },
                }},
            }},
        },
        "paths": paths,
        "x-clawfleet-codes": code_list,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_and_path_parameter_is_documented() {
        let doc = document();
        for r in ROUTES {
            let op = &doc["paths"][r.path][r.method.as_str()];
            assert!(op.is_object(), "{} {} missing", r.method.as_str(), r.path);
            let documented = |place: &str| -> Vec<String> {
                op["parameters"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter(|p| p["in"] == place)
                            .filter_map(|p| p["name"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            assert_eq!(documented("path"), path_parameters(r.path), "{}", r.path);
            if let Body::Query(schema) = r.body {
                let mut expected: Vec<String> = schema()["properties"]
                    .as_object()
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default();
                expected.sort();
                let mut query = documented("query");
                query.sort();
                assert_eq!(query, expected, "{}", r.path);
                assert!(!query.is_empty(), "{}", r.path);
            }
            assert!(
                op["responses"][r.success.to_string()].is_object(),
                "{}",
                r.path
            );
        }
    }
}
