//! Fences (protocol version 2): every Agent-scoped change a coordinator sends carries a fence
//! that its store bumps on every claim of the Agent. Under the Agent lock, before anything of
//! the operation changes, hostd compares it with the highest fence it saw for that Agent and
//! refuses a lower one with `FENCE_STALE`, so a coordinator that paused or was partitioned
//! past its claim can never overwrite what the coordinator that took over did.
//!
//! The record is `fences/<32 hex>.json`, outside the Agent directory: it survives the Agent's
//! revisions and its deletion, so a stale coordinator cannot re-create an Agent a newer one
//! removed (a re-created Agent gets higher fences from the coordinator's global counter). It is
//! written only when the fence grows, so repeating an operation under the same claim writes
//! nothing. The record is padded to [`RECORD_LEN`] bytes: a raise overwrites it in place with
//! one `fdatasync` (the worker raises the fence at every claim of an Agent, so the first call
//! of every deploy pays it), and only the first record, or one an older hostd wrote, goes
//! through write-then-rename with its two syncs.
//!
//! `delete-namespace` removes every Agent of the Namespace left on the host, so its fence (the
//! coordinator's current one) is checked against each of them, with the same rules: without
//! one it removes only Agents that never had a fence, and a stale coordinator (or one that
//! predates fencing) cannot remove a fenced Agent through its Namespace.

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureCode};

use super::{Ctx, Engine, fs_failure, marker_failure, ownership};
use crate::fsutil;
use crate::layout::AgentPaths;
use crate::markers::{self, FenceMarker, SCHEMA};

/// A fence record's size on disk: its JSON, then spaces, then a newline. Within one sector.
pub(crate) const RECORD_LEN: usize = 512;

/// The record's bytes, padded to [`RECORD_LEN`] (a record that would not fit is left as it
/// is, and written by rename).
fn record_bytes(record: &FenceMarker) -> Vec<u8> {
    let mut bytes = markers::to_bytes(record);
    if bytes.len() < RECORD_LEN {
        bytes.pop();
        bytes.resize(RECORD_LEN - 1, b' ');
        bytes.push(b'\n');
    }
    bytes
}

impl Engine<'_> {
    /// Checks the operation's fence (`ctx.fence`) against the Agent's record and raises the
    /// record when the fence is higher. Must be called with the Agent lock held.
    ///
    /// - a lower fence is refused;
    /// - an operation without a fence is refused once the Agent has a record (a coordinator
    ///   that predates fencing must not overwrite a fenced coordinator's work), and accepted
    ///   on an Agent that never had one (version 1 coordinators keep working);
    /// - a record that cannot be read is an error naming its file, and is left as it is.
    pub(crate) fn check_fence(
        &self,
        ctx: &Ctx<'_>,
        namespace: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<(), Failure> {
        match self.fence_verdict(ctx, namespace, agent, paths)? {
            None => Ok(()),
            Some(raise) => self.raise_fence(ctx, namespace, agent, paths, raise),
        }
    }

    /// The read-only half of [`Engine::check_fence`]: refuses as it would, and says which
    /// fence it would record (`None`: the record stays as it is). The no-op fast path uses it
    /// to know, before anything is written, that the fence needs no write.
    pub(crate) fn fence_verdict(
        &self,
        ctx: &Ctx<'_>,
        namespace: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<Option<u64>, Failure> {
        let stored = self.stored_fence(namespace, agent, paths)?;
        match (ctx.fence, stored) {
            (None, None) => Ok(None),
            (None, Some(stored)) => Err(stale(format!(
                "this operation carries no fence, but this host already saw fence {stored} for Agent {agent}: a coordinator without fencing must not change an Agent a fenced coordinator manages"
            ))),
            (Some(fence), Some(stored)) if fence < stored => Err(stale(format!(
                "fence {fence} is lower than fence {stored}, which this host already saw for Agent {agent}: a later claim of the Agent supersedes this one"
            ))),
            (Some(fence), Some(stored)) if fence == stored => Ok(None),
            (Some(fence), _) => Ok(Some(fence)),
        }
    }

    /// The highest fence recorded for the Agent (`None`: no record). A record that cannot be
    /// read, or that names another Agent, is an error naming its file (every change of the
    /// Agent is refused then, and `status` reports it).
    pub(crate) fn stored_fence(
        &self,
        namespace: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<Option<u64>, Failure> {
        let stored =
            markers::read_optional::<FenceMarker>(&paths.fence, "fence").map_err(marker_failure)?;
        if let Some(m) = &stored
            && (&m.namespace_id != namespace || &m.agent_id != agent)
        {
            return Err(ownership(format!(
                "{} records the fence of Agent {} in Namespace {}, not of Agent {agent} in Namespace {namespace}; it is left as it is",
                paths.fence.display(),
                m.agent_id,
                m.namespace_id
            )));
        }
        Ok(stored.map(|m| m.fence))
    }

    /// Records `fence` as the highest seen for the Agent, durably: in place over a record of
    /// [`RECORD_LEN`] bytes, else by write-then-rename.
    pub(crate) fn raise_fence(
        &self,
        ctx: &Ctx<'_>,
        namespace: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
        fence: u64,
    ) -> Result<(), Failure> {
        fsutil::ensure_dir(&self.layout.fences_dir(), 0o700).map_err(fs_failure)?;
        let record = FenceMarker {
            schema: SCHEMA,
            namespace_id: namespace.clone(),
            agent_id: agent.clone(),
            fence,
        };
        let bytes = record_bytes(&record);
        if !fsutil::overwrite_record(&paths.fence, &bytes).map_err(fs_failure)? {
            fsutil::write_atomic(&paths.fence, &bytes, 0o600, |_| Ok(())).map_err(fs_failure)?;
        }
        tracing::info!(operation_id = %ctx.operation_id, %agent, fence, "fence raised");
        Ok(())
    }
}

/// The session logs the refusal with the operation id; nothing to add here.
fn stale(message: String) -> Failure {
    Failure::new(FailureCode::FenceStale, message)
}
