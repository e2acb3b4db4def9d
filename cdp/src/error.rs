//! What can go wrong between a test and its browser.

use std::path::PathBuf;

/// Every failure of [`crate::Browser`] and [`crate::Page`], as a sentence naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum CdpError {
    /// No chromium executable where it was looked for.
    #[error(
        "no chromium at {path} (install Debian's `chromium` package or set CLAWFLEET_CHROMIUM)"
    )]
    NotFound { path: PathBuf },
    /// The browser process could not be started.
    #[error("could not start chromium {path}: {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The profile directory or a file the caller asked for could not be written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The browser exited or closed its DevTools pipe.
    #[error("chromium closed its DevTools pipe ({reason}); its log ends with: {log_tail}")]
    Closed { reason: String, log_tail: String },
    /// The browser answered a DevTools command with an error.
    #[error("DevTools command {method} failed: {message}")]
    Protocol { method: String, message: String },
    /// A script evaluated in the page threw.
    #[error("the page's script `{expression}` threw: {message}")]
    Script { expression: String, message: String },
    /// A selector matched no element.
    #[error("no element in the page matches the selector {selector:?}")]
    NoElement { selector: String },
    /// Something the caller waited for did not happen in time.
    #[error("timed out after {millis} ms waiting for {what}")]
    Timeout { what: String, millis: u128 },
    /// The browser sent something that is not the DevTools protocol's JSON.
    #[error("chromium sent a DevTools message that is not valid: {detail}")]
    BadMessage { detail: String },
}
