//! Request bodies as handlers state them in their signatures: [`StrictJson`] decodes a JSON
//! object refusing unknown fields (naming the failing path), [`NoBody`] refuses any body on
//! bodyless routes. Sizes are bounded before either runs (see `router` in `api/mod.rs`).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::{ApiError, MAX_BODY};
use crate::codes::Code;

/// The body, within the request's body deadline (set by admission) when it has one.
async fn bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let deadline = req.extensions().get::<super::BodyDeadline>().copied();
    let read = Bytes::from_request(req, state);
    let read = match deadline {
        Some(d) => match tokio::time::timeout_at(d.at, read).await {
            Ok(r) => r,
            Err(_) => {
                return Err(ApiError::new(
                    Code::RequestTimeout,
                    format!(
                        "the request body did not arrive within {} s (api.body_timeout_seconds)",
                        d.seconds
                    ),
                ));
            }
        },
        None => read.await,
    };
    read.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                Code::BodyTooLarge,
                format!("request bodies are limited to {} KiB", MAX_BODY / 1024),
            )
        } else {
            ApiError::new(
                Code::InvalidBody,
                format!("the request body could not be read: {e}"),
            )
        }
    })
}

/// A JSON body decoded strictly into `T`.
#[derive(Debug)]
pub struct StrictJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for StrictJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let b = bytes(req, state).await?;
        clawfleet_protocol::envelope::decode_json("request body", &b)
            .map(StrictJson)
            .map_err(|e| ApiError::new(Code::InvalidBody, e.to_string()))
    }
}

/// A route that takes no body: empty or whitespace only.
#[derive(Debug)]
pub struct NoBody;

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let b = bytes(req, state).await?;
        if b.iter().any(|c| !c.is_ascii_whitespace()) {
            return Err(ApiError::new(
                Code::UnexpectedBody,
                "this route takes no body",
            ));
        }
        Ok(NoBody)
    }
}

/// Query parameters decoded strictly into `T` (unknown parameters refused, naming them).
#[derive(Debug)]
pub struct StrictQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for StrictQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(query)
            .map(StrictQuery)
            .map_err(|e| {
                ApiError::new(
                    Code::InvalidQuery,
                    format!("the query parameters are invalid: {e}"),
                )
            })
    }
}
