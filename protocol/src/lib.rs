//! The clawfleet operation protocol.
pub const SUPPORTED_VERSIONS: &[u32] = &[1];
