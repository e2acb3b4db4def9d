//! `plan-revision`: what a deploy of one revision would change on the target, answered from
//! the target's real state without changing anything (no write, no lock held across a wait).
//! The coordinator compares the answer with what the deploy then does.

use serde::{Deserialize, Serialize};

use crate::failure::Failure;
use crate::ident::Ident;
use crate::operation::{AgentRef, NamespaceRef, RevisionRef, RevisionSpec};
use crate::result::AgentObservation;

/// Arguments of `plan-revision`: the revision a deploy would prepare and activate, and the
/// revision its activation would restore on failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanArgs {
    pub namespace: NamespaceRef,
    pub agent: AgentRef,
    pub revision: RevisionSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RevisionRef>,
    /// The Agent's own egress settings, as the prepare would carry them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::Egress>,
}

/// What happens to one thing the deploy needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    /// It is there as needed and stays.
    Keep,
    /// It is missing and would be created.
    Create,
    /// It is there and would be rewritten.
    Replace,
    /// This deploy does not need it.
    None,
}

impl Change {
    /// Whether the deploy would write it.
    pub fn writes(self) -> bool {
        matches!(self, Change::Create | Change::Replace)
    }
}

/// The answer to `plan-revision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanResult {
    /// The Agent's account (user and group).
    pub account: Change,
    /// The Agent's directory, marker and port reservation.
    pub agent_directory: Change,
    /// The port the Agent has on the host (absent while it has none; one is chosen then).
    pub port: Option<u16>,
    /// The revision's immutable snapshot.
    pub snapshot: Change,
    /// The managed gateway password file (`none` when the configuration does not use one).
    pub password_file: Change,
    /// The unit file (its text depends on the host's settings and the Agent's port, not on
    /// the revision).
    pub unit_file: Change,
    /// Whether activation would run `daemon-reload` (the unit file is written).
    pub daemon_reload: bool,
    /// Whether activation would enable the unit.
    pub enable: bool,
    /// Whether activation would restart the gateway (false only when it already serves this
    /// revision, or already runs it and is waiting for readiness).
    pub restart: bool,
    /// Present when activation would apply the revision's configuration live instead of
    /// restarting (`restart` is false then): the changed paths. The gateway must confirm it
    /// applied them; if it does not, activation restarts it after all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_live: Option<Vec<String>>,
    /// The revision a failed activation would put back, when one was asked for and its
    /// snapshot is there and intact.
    pub restore_available: Option<Ident>,
    /// What prepare or activate would refuse with, if they would (nothing above happens then).
    pub refusal: Option<Failure>,
    pub observation: AgentObservation,
}
