//! Rendering unit tests: names, labels, selectors, securityContext, probes.
#![allow(clippy::unwrap_used, clippy::expect_used)]
