//! Ownership markers written on the host. Each carries a `schema` version and is read exactly:
//! an unknown schema, an unknown key or a value that differs from what the operation expects is
//! refused, and nothing is repaired.

use std::path::Path;

use clawfleet_protocol::Ident;
use clawfleet_protocol::operation::{Harness, RevisionNumber};
use clawfleet_protocol::{OperationId, Sha256Hex};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::fsutil::{self, FsError};

/// The marker schema this hostd writes and reads.
pub const SCHEMA: u32 = 1;
/// Largest marker file read.
const MAX_MARKER: u64 = 64 * 1024;

/// Why a marker could not be used.
#[derive(Debug, Error)]
pub enum MarkerError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{path} has schema {found}; this hostd reads schema {SCHEMA} only")]
    Schema { path: String, found: String },
    #[error("{path} is not a valid {what} marker: {message}")]
    Invalid {
        path: String,
        what: &'static str,
        message: String,
    },
}

#[derive(Deserialize)]
struct SchemaOnly {
    schema: Option<serde_json::Value>,
}

/// Reads a marker strictly.
pub fn read<T: DeserializeOwned>(path: &Path, what: &'static str) -> Result<T, MarkerError> {
    let bytes = fsutil::read_small(path, MAX_MARKER)?;
    let shown = || path.display().to_string();
    let probe: SchemaOnly = serde_json::from_slice(&bytes).map_err(|e| MarkerError::Invalid {
        path: shown(),
        what,
        message: e.to_string(),
    })?;
    match probe.schema {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(u64::from(SCHEMA)) => {}
        Some(other) => {
            return Err(MarkerError::Schema {
                path: shown(),
                found: other.to_string(),
            });
        }
        None => {
            return Err(MarkerError::Schema {
                path: shown(),
                found: "none".to_owned(),
            });
        }
    }
    serde_json::from_slice(&bytes).map_err(|e| MarkerError::Invalid {
        path: shown(),
        what,
        message: e.to_string(),
    })
}

/// Reads a marker if the file exists.
pub fn read_optional<T: DeserializeOwned>(
    path: &Path,
    what: &'static str,
) -> Result<Option<T>, MarkerError> {
    if fsutil::kind(path)? == fsutil::Kind::Missing {
        return Ok(None);
    }
    read(path, what).map(Some)
}

/// Serializes a marker (pretty, for operators reading the host).
pub fn to_bytes<T: Serialize>(marker: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(marker).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// `namespaces/<h>/namespace.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceMarker {
    pub schema: u32,
    pub namespace_id: Ident,
    pub namespace_name: Ident,
}

/// `workspace-request.json` in an Agent directory: the initial workspace files asked for
/// (names, sizes, digests; never content). Its presence arms the unit's start guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceRequestMarker {
    pub schema: u32,
    pub files: Vec<clawfleet_protocol::workspace::WorkspaceFileMeta>,
}

/// `workspace-applied.json` in an Agent directory: the completion marker of the setup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceAppliedMarker {
    pub schema: u32,
    /// Unix seconds.
    pub applied_at: u64,
    pub files: Vec<clawfleet_protocol::workspace::WorkspaceFileMeta>,
}

/// `namespaces/<h>/agents/<h>/agent.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentMarker {
    pub schema: u32,
    pub namespace_id: Ident,
    pub agent_id: Ident,
    pub service_principal_id: Ident,
    pub account: String,
    pub port: u16,
}

/// `accounts/<account>.json`: binds a system account to exactly one Agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccountMarker {
    pub schema: u32,
    pub namespace_id: Ident,
    pub agent_id: Ident,
    pub service_principal_id: Ident,
    pub account: String,
    pub uid: u32,
    pub gid: u32,
}

/// `accounts/<account>.intent`: written (durably) before the account tools create an
/// account and removed once its [`AccountMarker`] is, so that what a killed run created is
/// adopted (or cleaned up) by the next one instead of refused as foreign forever.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccountIntent {
    pub schema: u32,
    pub namespace_id: Ident,
    pub agent_id: Ident,
    pub service_principal_id: Ident,
    pub account: String,
}

/// `ports/<port>.json`: the reservation of one gateway port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortMarker {
    pub schema: u32,
    pub namespace_id: Ident,
    pub agent_id: Ident,
}

/// `revisions/<h>/revision.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevisionMarker {
    pub schema: u32,
    pub namespace_id: Ident,
    pub agent_id: Ident,
    pub revision_id: Ident,
    pub number: RevisionNumber,
    pub configuration_hash: Sha256Hex,
    pub harness: Harness,
    /// Whether the configuration asks for the managed gateway password.
    pub needs_password: bool,
    /// The Agent's own egress settings the revision was prepared with (protocol/src/egress.rs):
    /// its network units are rendered with them when it is activated. Absent: the pool's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<clawfleet_protocol::egress::Egress>,
}

/// `served.json`: the revision last confirmed ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServedMarker {
    pub schema: u32,
    pub revision_id: Ident,
    /// Unix seconds.
    pub served_at: u64,
    pub operation_id: OperationId,
}

/// `started.json`: the revision whose `current` the unit was (re)started on. Written after
/// the restart job succeeded and removed before `current` moves, so while it names the revision
/// `current` points at, the unit's process reads that revision's configuration: a retried
/// activation waits for readiness again instead of restarting the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartedMarker {
    pub schema: u32,
    pub revision_id: Ident,
    /// Unix seconds.
    pub started_at: u64,
    pub operation_id: OperationId,
}

/// `fences/<32 hex>.json`: the highest fence a coordinator sent for one Agent (protocol
/// version 2). Names the Agent so a record is never read for another one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FenceMarker {
    pub schema: u32,
    pub namespace_id: Ident,
    pub agent_id: Ident,
    pub fence: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> NamespaceMarker {
        NamespaceMarker {
            schema: SCHEMA,
            namespace_id: Ident::new("ns").unwrap(),
            namespace_name: Ident::new("team").unwrap(),
        }
    }

    #[test]
    fn markers_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("namespace.json");
        std::fs::write(&p, to_bytes(&ns())).unwrap();
        let back: NamespaceMarker = read(&p, "namespace").unwrap();
        assert_eq!(back, ns());
    }

    #[test]
    fn extra_keys_foreign_schemas_and_garbage_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.json");
        let mut v = serde_json::to_value(ns()).unwrap();
        v["extra"] = serde_json::json!(1);
        std::fs::write(&p, v.to_string()).unwrap();
        assert!(matches!(
            read::<NamespaceMarker>(&p, "namespace"),
            Err(MarkerError::Invalid { .. })
        ));
        let mut v = serde_json::to_value(ns()).unwrap();
        v["schema"] = serde_json::json!(2);
        std::fs::write(&p, v.to_string()).unwrap();
        assert!(matches!(
            read::<NamespaceMarker>(&p, "namespace"),
            Err(MarkerError::Schema { .. })
        ));
        std::fs::write(&p, "{\"namespaceId\":\"ns\"}").unwrap();
        assert!(matches!(
            read::<NamespaceMarker>(&p, "namespace"),
            Err(MarkerError::Schema { .. })
        ));
        std::fs::write(&p, "not json").unwrap();
        assert!(read::<NamespaceMarker>(&p, "namespace").is_err());
        std::fs::write(&p, vec![b' '; 70_000]).unwrap();
        assert!(matches!(
            read::<NamespaceMarker>(&p, "namespace"),
            Err(MarkerError::Fs(FsError::TooLarge { .. }))
        ));
    }
}
