//! Initial workspace files at Agent creation: checked here (names, limits, encoding) before
//! anything is stored, kept privately by the store (`store/src/sqlite/workspace.rs`, `store/src/postgres/workspace.rs`), carried to the
//! target by the worker's prepare, and shown only as names, sizes, digests and setup state.

use base64ct::{Base64, Encoding};
use clawfleet_protocol::workspace::{self as proto, WorkspaceFile, WorkspaceName};

use super::{Result, Service, ServiceError};
use crate::codes::Code;
use crate::model::WorkspaceSetupInfo;

pub use clawfleet_api::requests::NewWorkspaceFile;

fn invalid(message: impl Into<String>) -> ServiceError {
    ServiceError::invalid(Code::InvalidWorkspaceFile, message)
}

/// Checks `workspaceFiles` for a new Agent in `ns`; the files to store.
pub(super) fn validate(files: &[NewWorkspaceFile]) -> Result<Vec<WorkspaceFile>> {
    if files.is_empty() {
        return Ok(Vec::new());
    }
    if files.len() > proto::WORKSPACE_MAX_FILES {
        return Err(invalid(format!(
            "workspaceFiles: {} files given; at most {} are allowed",
            files.len(),
            proto::WORKSPACE_MAX_FILES
        )));
    }
    let mut out = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let name = WorkspaceName::new(f.name.clone())
            .map_err(|e| invalid(format!("workspaceFiles[{i}].name: {e}")))?;
        let content = match (&f.content, &f.content_base64) {
            (Some(text), None) => text.as_bytes().to_vec(),
            (None, Some(b64)) => {
                if b64.len() > (proto::WORKSPACE_MAX_FILE_BYTES / 3 + 1) * 4 {
                    return Err(invalid(format!(
                        "workspaceFiles[{i}] ({name}): larger than {} bytes",
                        proto::WORKSPACE_MAX_FILE_BYTES
                    )));
                }
                Base64::decode_vec(b64).map_err(|_| {
                    invalid(format!(
                        "workspaceFiles[{i}].contentBase64 ({name}): not valid base64"
                    ))
                })?
            }
            _ => {
                return Err(invalid(format!(
                    "workspaceFiles[{i}] ({name}): give exactly one of content and contentBase64"
                )));
            }
        };
        out.push(WorkspaceFile { name, content });
    }
    proto::check_set(out.iter().map(|f| (&f.name, f.content.len())))
        .map_err(|e| invalid(format!("workspaceFiles: {e}")))?;
    Ok(out)
}

impl Service {
    /// An Agent's initial workspace files (names, sizes, digests) and their setup state.
    pub async fn workspace(&self, ns: &str, agent: &str) -> Result<WorkspaceSetupInfo> {
        self.agent(ns, agent).await?;
        self.store
            .workspace_setup(ns, agent)
            .await?
            .ok_or_else(|| ServiceError::not_found("initial workspace files of Agent", agent))
    }
}
