//! `/openapi.json`, generated from the route table: every route with its path parameters,
//! body, success status and answer (its JSON Schema), error responses and access rule.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::access::Access;
use crate::requests::{HOST_NAME_PATTERN, IDENT_PATTERN};
use crate::routes::{Answer, Body, ROUTES};

/// One code an error answer may carry, as `x-clawfleet-codes` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CodeDoc {
    pub code: String,
    /// `coordinator` (its own codes) or `target` (hostd's and the Kubernetes backend's).
    pub from: String,
    /// What a coordinator's code means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meaning: Option<String>,
    /// Whether a target's failure of this code may succeed when retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

/// The OpenAPI 3.1 document (`GET /openapi.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpenApiDocument {
    /// `3.1.0`.
    pub openapi: String,
    #[schemars(with = "Map<String, Value>")]
    pub info: Value,
    #[schemars(with = "Map<String, Value>")]
    pub components: Value,
    /// Every route by path, then method.
    pub paths: Map<String, Value>,
    /// Every code an error answer may carry.
    #[serde(rename = "x-clawfleet-codes")]
    pub codes: Vec<CodeDoc>,
}

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
        "path" => (
            "The rest of the path on the Agent's gateway (slashes included; empty for its root)",
            json!({"type": "string"}),
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

/// Every code an error answer may carry ([`crate::codes::AnyCode`]): the coordinator's own
/// (`coordinator`), in its table's order, then the protocol's that are not among them
/// (`target`, with whether a retry may succeed), each with its meaning.
pub fn codes() -> Vec<CodeDoc> {
    use crate::codes::AnyCode;
    AnyCode::all()
        .map(|c| CodeDoc {
            code: c.as_str().to_owned(),
            from: match c {
                AnyCode::Coordinator(_) => "coordinator",
                AnyCode::Target(_) => "target",
            }
            .to_owned(),
            meaning: Some(c.describe().to_owned()),
            retryable: match c {
                AnyCode::Coordinator(_) => None,
                AnyCode::Target(f) => {
                    Some(f.default_class() == clawfleet_protocol::failure::FailureClass::Retryable)
                }
            },
        })
        .collect()
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

/// The success response of a route: its answer's schema and content type.
fn success_response(answer: Answer) -> Value {
    if matches!(answer, Answer::Proxy) {
        return json!({"description": "The Agent's gateway's own answer, its status, headers and body unchanged; or 101 Switching Protocols when the gateway accepts a WebSocket upgrade (the WebSocket is then closed with 1012 when the gateway goes away for a restart or a new revision)"});
    }
    if matches!(answer, Answer::Upgrade) {
        return json!({"description": format!(
            "Switching Protocols (send `Connection: Upgrade` and `Upgrade: {}`): from then on \
             the connection carries the stream's bytes both ways, no HTTP",
            crate::routes::UPGRADE_PROTOCOL
        )});
    }
    let schema = answer.schema();
    let description = schema
        .as_ref()
        .and_then(|s| s.get("description"))
        .and_then(Value::as_str)
        .unwrap_or("The answer")
        .to_owned();
    match (answer, schema, answer.content_type()) {
        (Answer::Page(_), Some(schema), Some(ct)) => json!({
            "description": "One page of the list, a JSON array in the list's order",
            "headers": {"X-Next-Cursor": {
                "description": "The cursor of the next page (pass it as `cursor`); absent on the last page",
                "schema": {"type": "string"}}},
            "content": {ct: {"schema": schema}},
        }),
        (Answer::Text(_), Some(schema), Some(ct)) => {
            // The media type without its parameters (`version=0.0.4`).
            let essence = ct.split(';').next().unwrap_or(ct).trim();
            json!({"description": "Text", "content": {essence: {"schema": schema}}})
        }
        (_, Some(schema), Some(ct)) => json!({
            "description": description,
            "content": {ct: {"schema": schema}},
        }),
        _ => json!({"description": "Done; no body"}),
    }
}

/// The whole document, with every code (see [`codes`]).
pub fn document() -> OpenApiDocument {
    let codes = codes();
    let code_names: Vec<&str> = codes.iter().map(|c| c.code.as_str()).collect();
    let mut paths = Map::new();
    for r in ROUTES {
        let mut responses = Map::new();
        responses.insert(r.success.to_string(), success_response(r.answer));
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
    OpenApiDocument {
        openapi: "3.1.0".to_owned(),
        info: json!({
            "title": "clawfleet coordinator",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Timestamps (createdAt, at, expiresAt) are whole seconds since the epoch, UTC. Request bodies are strict JSON: unknown fields are refused with 400 INVALID_BODY naming the field.",
        }),
        components: json!({
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
        }),
        paths,
        codes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_and_path_parameter_is_documented() {
        let doc = serde_json::to_value(document()).unwrap_or_default();
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

    /// Every success response with a body shows a schema that is not empty (`{}` or `true`
    /// would let any answer pass schemathesis' response checks); only 204 has none.
    #[test]
    fn every_success_response_has_a_non_empty_schema() {
        let doc = serde_json::to_value(document()).unwrap_or_default();
        for r in ROUTES {
            let route = format!("{} {}", r.method.as_str(), r.path);
            let ok = &doc["paths"][r.path][r.method.as_str()]["responses"][r.success.to_string()];
            let content = ok["content"].as_object();
            if r.success == 204 || r.success == 101 || matches!(r.answer, Answer::Proxy) {
                assert!(
                    content.is_none(),
                    "{route}: {} with a body: {ok}",
                    r.success
                );
                continue;
            }
            let content = content.unwrap_or_else(|| panic!("{route}: no content: {ok}"));
            assert_eq!(content.len(), 1, "{route}: {ok}");
            for (media, body) in content {
                let schema = &body["schema"];
                assert!(
                    schema.as_object().is_some_and(|o| !o.is_empty()),
                    "{route} ({media}): empty schema {schema}"
                );
                assert!(
                    schema["type"].is_string(),
                    "{route}: untyped schema {schema}"
                );
            }
        }
    }

    #[test]
    fn codes_list_the_coordinators_then_the_protocols_once() {
        let all = codes();
        assert_eq!(all[0].code, crate::codes::Code::ALL[0].as_str());
        assert!(all.iter().all(|c| c.meaning.is_some()));
        let shared = all
            .iter()
            .filter(|c| c.code == "NAMESPACE_NOT_EMPTY")
            .count();
        assert_eq!(shared, 1);
        assert!(all.iter().any(|c| c.from == "target"));
    }
}
