//! The typed client, built from the route table like the server's router: [`Api`] has one
//! method per route (named after its handler, the OpenAPI operationId), taking the route's
//! path parameters in path order, its request type, and answering its response type. It does
//! no I/O: it builds a [`Call`] (method, path with its parameters percent-encoded, query,
//! JSON body) and hands it to a [`Transport`] (the coordinator's blocking HTTP client is one),
//! then decodes the [`Reply`]. A route cannot be added without its client method, nor a
//! client method call a path the server does not serve.
//!
//! ```text
//! client.get_agent(["ns1", "a1"])?                  // GET /namespaces/ns1/agents/a1 -> Agent
//! client.list_agents(["ns1"], &PageQuery::default())?  // -> Page<Agent>
//! client.create_token([], &NewToken { .. })?        // POST /tokens -> CreatedToken
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::routes::{Method, ROUTES, Route};
use crate::types::PageQuery;

/// One request as the client built it: what a [`Transport`] sends.
#[derive(Debug, Clone)]
pub struct Call {
    /// The route it calls (its row in [`ROUTES`]).
    pub route: &'static Route,
    pub method: Method,
    /// The path with its parameters filled in (percent-encoded) and the query, if any.
    pub path: String,
    /// The JSON body of a route that takes one.
    pub body: Option<Value>,
}

/// A successful (2xx) answer as a [`Transport`] received it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    /// The body as text (empty for 204).
    pub body: String,
    /// The next page's cursor ([`crate::routes::NEXT_CURSOR_HEADER`]), when more follow.
    pub next_cursor: Option<String>,
}

/// Why a request could not be built or its answer not be read (the transport's own failures,
/// and refusals by the API, are the transport's error type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The request body or query could not be encoded.
    Encode {
        operation: &'static str,
        reason: String,
    },
    /// The 2xx answer is not the route's response type.
    Decode {
        operation: &'static str,
        reason: String,
    },
    /// A list answered the same next cursor twice (following it would never end).
    CursorRepeated { operation: &'static str },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Encode { operation, reason } => {
                write!(f, "cannot encode the request of {operation}: {reason}")
            }
            CallError::Decode { operation, reason } => {
                write!(
                    f,
                    "the answer of {operation} is not what the API promises: {reason}"
                )
            }
            CallError::CursorRepeated { operation } => {
                write!(f, "{operation} answered the same next cursor twice")
            }
        }
    }
}

impl std::error::Error for CallError {}

/// What carries a [`Call`] to the API and brings back its 2xx [`Reply`]; anything else (no
/// connection, a refusal) is its `Error`.
pub trait Transport {
    type Error: From<CallError>;
    fn call(&self, call: Call) -> Result<Reply, Self::Error>;
}

/// One page of a list route's items, and the cursor of the next page when more follow.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The list route's operation.
    pub operation: &'static str,
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// How many `{param}` segments a path has: the length of a client method's parameter array.
pub const fn path_params(path: &str) -> usize {
    let bytes = path.as_bytes();
    let mut i = 0;
    let mut n = 0;
    while i < bytes.len() {
        if bytes[i] == b'{' {
            n += 1;
        }
        i += 1;
    }
    n
}

/// Percent-encoding of a path parameter or query value: everything but the unreserved
/// characters (a log cursor holds `;` and `=`; a name could hold `/`).
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `template` with each `{param}` replaced by the next of `params`, percent-encoded.
pub fn fill_path(template: &str, params: &[&str]) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut params = params.iter();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let close = after.find('}').map_or(after.len(), |c| c + 1);
        out.push_str(&params.next().map(|p| percent_encode(p)).unwrap_or_default());
        rest = &after[close..];
    }
    out.push_str(rest);
    out
}

/// A query type as a query string (`a=1&b=x`): every field that is not null, by name, each
/// value percent-encoded.
pub fn query_string<Q: Serialize>(operation: &'static str, query: &Q) -> Result<String, CallError> {
    let encode = |reason: String| CallError::Encode { operation, reason };
    let Value::Object(fields) = serde_json::to_value(query).map_err(|e| encode(e.to_string()))?
    else {
        return Err(encode("a query is an object of fields".to_owned()));
    };
    let mut parts = Vec::new();
    for (k, v) in fields {
        let text = match v {
            Value::Null => continue,
            Value::String(s) => s,
            Value::Bool(_) | Value::Number(_) => v.to_string(),
            Value::Array(_) | Value::Object(_) => {
                return Err(encode(format!("the field {k} is not a scalar")));
            }
        };
        parts.push(format!("{}={}", percent_encode(&k), percent_encode(&text)));
    }
    Ok(parts.join("&"))
}

/// The row of [`ROUTES`] whose handler is `operation`.
pub fn route(operation: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|r| r.operation == operation)
}

/// The [`Call`] of `operation` with its path parameters, query and body.
pub fn call(
    operation: &'static str,
    params: &[&str],
    query: Option<String>,
    body: Option<Value>,
) -> Call {
    // Every operation names a row: the client methods and ROUTES come from one table.
    let route = route(operation).unwrap_or(&ROUTES[0]);
    let mut path = fill_path(route.path, params);
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        path.push('?');
        path.push_str(&q);
    }
    Call {
        route,
        method: route.method,
        path,
        body,
    }
}

/// A request body as JSON.
pub fn body<B: Serialize>(operation: &'static str, body: &B) -> Result<Value, CallError> {
    serde_json::to_value(body).map_err(|e| CallError::Encode {
        operation,
        reason: e.to_string(),
    })
}

/// A JSON answer as its type.
pub fn decode<T: DeserializeOwned>(operation: &'static str, reply: &Reply) -> Result<T, CallError> {
    serde_json::from_str(&reply.body).map_err(|e| CallError::Decode {
        operation,
        reason: e.to_string(),
    })
}

/// Every item of a list route, page after page, each page asked for with `page` (the
/// generated `list_…` method with its path parameters).
pub fn all_pages<T, E: From<CallError>>(
    limit: Option<u32>,
    mut page: impl FnMut(&PageQuery) -> Result<Page<T>, E>,
) -> Result<Vec<T>, E> {
    let mut items = Vec::new();
    let mut query = PageQuery {
        cursor: None,
        limit,
    };
    loop {
        let mut p = page(&query)?;
        items.append(&mut p.items);
        match p.next_cursor {
            // A cursor that does not move on would loop forever.
            Some(next) if query.cursor.as_deref() == Some(next.as_str()) => {
                return Err(CallError::CursorRepeated {
                    operation: p.operation,
                }
                .into());
            }
            Some(next) => query.cursor = Some(next),
            None => return Ok(items),
        }
    }
}

/// The Rust type a row's answer decodes to.
#[macro_export]
#[doc(hidden)]
macro_rules! client_answer_type {
    (Json < $t:ident >) => { $crate::types::$t };
    (List < $t:ident >) => { ::std::vec::Vec<$crate::types::$t> };
    (Page < $t:ident >) => { $crate::client::Page<$crate::types::$t> };
    (Text) => { ::std::string::String };
    (NoContent) => { () };
    (Upgrade) => { $crate::client::Call };
    (Proxy) => { $crate::client::Call };
}

/// Decodes a [`Reply`] as a row's answer.
#[macro_export]
#[doc(hidden)]
macro_rules! client_decode {
    ($op:expr, $reply:expr, Json < $t:ident >) => {
        $crate::client::decode::<$crate::types::$t>($op, &$reply)
    };
    ($op:expr, $reply:expr, List < $t:ident >) => {
        $crate::client::decode::<::std::vec::Vec<$crate::types::$t>>($op, &$reply)
    };
    ($op:expr, $reply:expr, Page < $t:ident >) => {
        $crate::client::decode::<::std::vec::Vec<$crate::types::$t>>($op, &$reply).map(|items| {
            $crate::client::Page {
                operation: $op,
                items,
                next_cursor: $reply.next_cursor,
            }
        })
    };
    ($op:expr, $reply:expr, Text) => {
        ::std::result::Result::<_, $crate::client::CallError>::Ok($reply.body)
    };
    ($op:expr, $reply:expr, NoContent) => {{
        let _no_body: $crate::client::Reply = $reply;
        ::std::result::Result::<(), $crate::client::CallError>::Ok(())
    }};
}

/// One client method per row, by its request kind. An `Upgrade` row's method does no I/O:
/// it answers the [`Call`] (its path), which the caller sends as an HTTP upgrade itself.
#[macro_export]
#[doc(hidden)]
macro_rules! client_method {
    ($path:literal, Upgrade, Upgrade, $handler:ident, $summary:literal) => {
        #[doc = $summary]
        #[doc = ""]
        #[doc = concat!("`", $path, "`")]
        fn $handler(
            &self,
            params: [&str; $crate::client::path_params($path)],
        ) -> ::std::result::Result<$crate::client::Call, Self::Error> {
            Ok($crate::client::call(stringify!($handler), &params, None, None))
        }
    };
    ($path:literal, Proxy, Proxy, $handler:ident, $summary:literal) => {
        #[doc = $summary]
        #[doc = ""]
        #[doc = concat!("`", $path, "`")]
        fn $handler(
            &self,
            params: [&str; $crate::client::path_params($path)],
        ) -> ::std::result::Result<$crate::client::Call, Self::Error> {
            Ok($crate::client::call(stringify!($handler), &params, None, None))
        }
    };
    ($path:literal, Empty, $resp:ident $(< $respty:ident >)?, $handler:ident, $summary:literal) => {
        #[doc = $summary]
        #[doc = ""]
        #[doc = concat!("`", $path, "`")]
        fn $handler(
            &self,
            params: [&str; $crate::client::path_params($path)],
        ) -> ::std::result::Result<$crate::client_answer_type!($resp $(< $respty >)?), Self::Error> {
            let op = stringify!($handler);
            let reply = self.call($crate::client::call(op, &params, None, None))?;
            Ok($crate::client_decode!(op, reply, $resp $(< $respty >)?)?)
        }
    };
    ($path:literal, Json < $reqty:ident >, $resp:ident $(< $respty:ident >)?, $handler:ident, $summary:literal) => {
        #[doc = $summary]
        #[doc = ""]
        #[doc = concat!("`", $path, "`")]
        fn $handler(
            &self,
            params: [&str; $crate::client::path_params($path)],
            body: &$crate::types::$reqty,
        ) -> ::std::result::Result<$crate::client_answer_type!($resp $(< $respty >)?), Self::Error> {
            let op = stringify!($handler);
            let body = $crate::client::body(op, body)?;
            let reply = self.call($crate::client::call(op, &params, None, Some(body)))?;
            Ok($crate::client_decode!(op, reply, $resp $(< $respty >)?)?)
        }
    };
    ($path:literal, Query < $reqty:ident >, $resp:ident $(< $respty:ident >)?, $handler:ident, $summary:literal) => {
        #[doc = $summary]
        #[doc = ""]
        #[doc = concat!("`", $path, "`")]
        fn $handler(
            &self,
            params: [&str; $crate::client::path_params($path)],
            query: &$crate::types::$reqty,
        ) -> ::std::result::Result<$crate::client_answer_type!($resp $(< $respty >)?), Self::Error> {
            let op = stringify!($handler);
            let query = $crate::client::query_string(op, query)?;
            let reply = self.call($crate::client::call(op, &params, Some(query), None))?;
            Ok($crate::client_decode!(op, reply, $resp $(< $respty >)?)?)
        }
    };
}

macro_rules! client_methods {
    ($( $method:ident $path:literal, $access:ident $(($role:ident))?,
        $req:ident $(< $reqty:ident >)? -> $success:literal $resp:ident $(< $respty:ident >)?
        => $module:ident :: $handler:ident, $summary:literal; )*) => {
        /// The API, one method per route of the table (see the module's documentation); every
        /// [`Transport`] has it.
        pub trait Api: Transport {
            $( $crate::client_method!($path, $req $(< $reqty >)?, $resp $(< $respty >)?, $handler, $summary); )*
        }

        /// The operation of every client method, in table order (what the test below checks
        /// against [`ROUTES`]).
        pub const METHODS: &[&str] = &[$(stringify!($handler)),*];
    };
}

crate::route_table!(client_methods);

impl<T: Transport + ?Sized> Api for T {}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::types::{AuditQuery, LogsQuery, NewToken};

    /// Records each call and answers the JSON it was given.
    struct Recorder {
        calls: RefCell<Vec<Call>>,
        answers: RefCell<Vec<Reply>>,
    }

    impl Recorder {
        fn answering(answers: &[(&str, Option<&str>)]) -> Self {
            Recorder {
                calls: RefCell::new(Vec::new()),
                answers: RefCell::new(
                    answers
                        .iter()
                        .rev()
                        .map(|(b, c)| Reply {
                            body: (*b).to_owned(),
                            next_cursor: c.map(str::to_owned),
                        })
                        .collect(),
                ),
            }
        }
    }

    impl Transport for Recorder {
        type Error = CallError;
        fn call(&self, call: Call) -> Result<Reply, CallError> {
            self.calls.borrow_mut().push(call);
            Ok(self.answers.borrow_mut().pop().unwrap_or_default())
        }
    }

    /// Every route of the table has its client method, and no method is left without a route.
    #[test]
    fn every_route_has_a_client_method() {
        let methods: std::collections::BTreeSet<&str> = METHODS.iter().copied().collect();
        assert_eq!(methods.len(), METHODS.len(), "a client method twice");
        for r in ROUTES {
            assert!(
                methods.contains(r.operation),
                "{} {} has no client method {}",
                r.method.as_str(),
                r.path,
                r.operation
            );
            assert!(
                route(r.operation)
                    .is_some_and(|found| (found.method, found.path) == (r.method, r.path))
            );
        }
        assert_eq!(METHODS.len(), ROUTES.len());
    }

    #[test]
    fn a_call_fills_the_path_in_order_encodes_the_query_and_decodes_the_answer() {
        let t = Recorder::answering(&[
            (
                r#"{"id":"tok-1","name":"ci","token":"secret","grants":[],"expiresAt":null}"#,
                None,
            ),
            ("[]", None),
            ("", None),
            ("# HELP x\n", None),
        ]);
        let created = t
            .create_token(
                [],
                &NewToken {
                    name: "ci".into(),
                    grants: vec![],
                    expires_at: None,
                },
            )
            .unwrap();
        assert_eq!(created.id, "tok-1");
        assert!(
            t.audit(
                [],
                &AuditQuery {
                    limit: Some(5),
                    action: Some("agent.logs.read".into())
                }
            )
            .unwrap()
            .is_empty()
        );
        t.delete_secret(["ns1", "a/b c"]).unwrap();
        assert_eq!(t.metrics([]).unwrap(), "# HELP x\n");
        let calls = t.calls.borrow();
        assert_eq!(calls[0].method, Method::Post);
        assert_eq!(calls[0].path, "/tokens");
        assert_eq!(calls[0].body.as_ref().unwrap()["name"], "ci");
        assert_eq!(calls[1].path, "/audit?action=agent.logs.read&limit=5");
        assert_eq!(calls[2].method, Method::Delete);
        assert_eq!(calls[2].path, "/namespaces/ns1/secrets/a%2Fb%20c");
        assert_eq!(calls[3].route.operation, "metrics");
    }

    #[test]
    fn a_query_skips_absent_fields_and_encodes_values() {
        let q = LogsQuery {
            cursor: Some("s=1;i=2".into()),
            follow: Some(true),
            ..LogsQuery::default()
        };
        assert_eq!(
            query_string("logs", &q).unwrap(),
            "cursor=s%3D1%3Bi%3D2&follow=true"
        );
        assert_eq!(query_string("logs", &LogsQuery::default()).unwrap(), "");
    }

    #[test]
    fn pages_are_followed_to_the_end_and_a_repeated_cursor_is_refused() {
        let t = Recorder::answering(&[
            (
                r#"[{"name":"c1","server":"https://a","settings":{},"createdAt":1}]"#,
                Some("n1"),
            ),
            ("[]", None),
        ]);
        let r = all_pages(Some(1), |q| t.list_clusters([], q));
        assert_eq!(r.map(|v| v.len()).map_err(|e| e.to_string()), Ok(1));
        assert_eq!(t.calls.borrow()[1].path, "/clusters?cursor=n1&limit=1");
        let t = Recorder::answering(&[("[]", Some("n1")), ("[]", Some("n1"))]);
        let r = all_pages(None, |q| t.list_hosts([], q));
        assert_eq!(
            r.map_err(|e| e.to_string()),
            Err("list_hosts answered the same next cursor twice".to_owned())
        );
    }

    #[test]
    fn an_answer_that_is_not_the_routes_type_is_an_error() {
        let t = Recorder::answering(&[(r#"{"nope":1}"#, None)]);
        assert!(matches!(
            t.get_host(["h1"]),
            Err(CallError::Decode {
                operation: "get_host",
                ..
            })
        ));
    }
}
