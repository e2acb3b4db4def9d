//! The console's stylesheet and script, embedded in `occ` (`include_bytes!`): no CDN, no
//! external font, works on an air-gapped site. Both are first-party files in
//! `console/assets/`; each is served with its SHA-256 as the `ETag` and its URL carries the
//! same hash, so a browser may keep it for a year and still never runs a stale one.

use std::sync::{Arc, LazyLock};

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::Console;
use crate::backend::Backend;

/// One embedded file.
#[derive(Debug)]
pub(crate) struct Asset {
    pub name: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

pub(crate) static STYLE: &Asset = &Asset {
    name: "console.css",
    content_type: "text/css; charset=utf-8",
    bytes: include_bytes!("assets/console.css"),
};

pub(crate) static SCRIPT: &Asset = &Asset {
    name: "console.js",
    content_type: "text/javascript; charset=utf-8",
    bytes: include_bytes!("assets/console.js"),
};

/// Every embedded file (the one list the route serves from).
pub(crate) static ASSETS: &[&Asset] = &[STYLE, SCRIPT];

/// Each file's SHA-256 (hex), in [`ASSETS`]' order.
static HASHES: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            Sha256::digest(a.bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .collect()
});

fn hash_of(asset: &Asset) -> &'static str {
    ASSETS
        .iter()
        .position(|a| a.name == asset.name)
        .and_then(|i| HASHES.get(i))
        .map_or("", |h| &h[..16])
}

/// The URL of an embedded file, with its hash.
pub(crate) fn href(asset: &Asset) -> String {
    format!("/console/assets/{}?v={}", asset.name, hash_of(asset))
}

/// `GET /console/assets/{name}` (the state only ties the handler to its router).
pub(crate) async fn asset<B: Backend>(
    _: State<Arc<Console<B>>>,
    Path(name): Path<String>,
) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, "no such asset").into_response();
    };
    let mut r = a.bytes.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a.content_type),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", hash_of(a))) {
        h.insert(header::ETAG, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script is first-party and small (issue 32: at most 60 KB gzipped; it is far
    /// below even uncompressed), and neither file reaches for another origin.
    #[test]
    fn assets_are_small_and_self_contained() {
        assert!(SCRIPT.bytes.len() < 60 * 1024);
        for a in ASSETS {
            let text = String::from_utf8_lossy(a.bytes);
            for banned in [
                "http://",
                "https://",
                "@import",
                "url(",
                "eval(",
                "innerHTML = e",
            ] {
                assert!(!text.contains(banned), "{} holds {banned}", a.name);
            }
        }
        assert!(href(SCRIPT).starts_with("/console/assets/console.js?v="));
    }
}
