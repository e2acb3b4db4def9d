//! What the console calls an Agent's or a target's state: always what the last drift sweep
//! observed, never inferred from what was asked for. An Agent no sweep has seen, or seen too
//! long ago, is `unknown`; only an observation that the target runs what the coordinator
//! expects is shown green.

use std::collections::HashMap;

use super::page::Tone;
use crate::model::{Agent, DesiredState, DriftRow, DriftState};

/// An Agent's observed state (the one list the filters and counts use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Seen {
    /// Observed running what the coordinator expects.
    Running,
    /// Observed stopped, as asked.
    Stopped,
    /// Work for it is open: being changed.
    Converging,
    /// Being deleted.
    Deleting,
    /// Observed different from what is expected.
    Drift,
    /// Its target could not be asked.
    Unreachable,
    /// No observation, or none recent enough.
    Unknown,
}

impl Seen {
    pub const ALL: &'static [Seen] = &[
        Seen::Running,
        Seen::Stopped,
        Seen::Converging,
        Seen::Deleting,
        Seen::Drift,
        Seen::Unreachable,
        Seen::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Seen::Running => "running",
            Seen::Stopped => "stopped",
            Seen::Converging => "converging",
            Seen::Deleting => "deleting",
            Seen::Drift => "drift",
            Seen::Unreachable => "unreachable",
            Seen::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Seen> {
        Self::ALL.iter().copied().find(|v| v.as_str() == s)
    }

    pub fn tone(self) -> Tone {
        match self {
            Seen::Running => Tone::Ok,
            Seen::Converging | Seen::Deleting => Tone::Wait,
            Seen::Drift | Seen::Unreachable => Tone::Bad,
            Seen::Stopped | Seen::Unknown => Tone::Unknown,
        }
    }
}

/// An Agent's observed state from its drift finding (`None`: never observed), judged at
/// `now`: a finding older than `stale_after` seconds is no longer an observation.
pub(crate) fn seen(agent: &Agent, row: Option<&DriftRow>, now: i64, stale_after: i64) -> Seen {
    if agent.desired_state == DesiredState::Deleted {
        return Seen::Deleting;
    }
    let Some(row) = row else {
        return Seen::Unknown;
    };
    match row.state {
        DriftState::Unreachable => Seen::Unreachable,
        DriftState::Converging => Seen::Converging,
        DriftState::Drift => Seen::Drift,
        DriftState::Synced if now - row.checked_at > stale_after => Seen::Unknown,
        DriftState::Synced => match agent.desired_state {
            DesiredState::Running => Seen::Running,
            DesiredState::Stopped => Seen::Stopped,
            DesiredState::Deleted => Seen::Deleting,
        },
    }
}

/// The drift findings of Agents, by (Namespace, Agent).
pub(crate) fn by_agent(rows: &[DriftRow]) -> HashMap<(&str, &str), &DriftRow> {
    rows.iter()
        .filter(|r| !r.namespace_id.is_empty())
        .map(|r| ((r.namespace_id.as_str(), r.agent_id.as_str()), r))
        .collect()
}

/// Whether a target answered the last sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// The last sweep asked it and got an answer (at this time).
    Reachable(i64),
    /// The last sweep could not ask it (at this time).
    Unreachable(i64),
    /// No sweep has asked it (it holds no Agent, or none ran yet), or too long ago.
    Unknown,
}

impl Reach {
    pub fn tone(self) -> Tone {
        match self {
            Reach::Reachable(_) => Tone::Ok,
            Reach::Unreachable(_) => Tone::Bad,
            Reach::Unknown => Tone::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reach::Reachable(_) => "reachable",
            Reach::Unreachable(_) => "unreachable",
            Reach::Unknown => "unknown",
        }
    }
}

/// Each target's reachability from the drift findings.
pub(crate) fn reach(rows: &[DriftRow], now: i64, stale_after: i64) -> HashMap<&str, Reach> {
    let mut out: HashMap<&str, Reach> = HashMap::new();
    for r in rows {
        let this = if now - r.checked_at > stale_after {
            Reach::Unknown
        } else if r.state == DriftState::Unreachable {
            Reach::Unreachable(r.checked_at)
        } else {
            Reach::Reachable(r.checked_at)
        };
        let e = out.entry(r.target.as_str()).or_insert(this);
        // One unreachable finding makes the target unreachable; unknown yields to any
        // observation.
        *e = match (*e, this) {
            (Reach::Unreachable(a), _) | (_, Reach::Unreachable(a)) => Reach::Unreachable(a),
            (Reach::Reachable(a), Reach::Reachable(b)) => Reach::Reachable(a.max(b)),
            (Reach::Reachable(a), Reach::Unknown) | (Reach::Unknown, Reach::Reachable(a)) => {
                Reach::Reachable(a)
            }
            (Reach::Unknown, Reach::Unknown) => Reach::Unknown,
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(desired: DesiredState) -> Agent {
        serde_json::from_value(serde_json::json!({
            "namespaceId": "ns", "id": "a", "servicePrincipalId": "sp",
            "configurationId": "c", "desiredState": desired.as_str(), "restore": "none",
            "createdAt": 0
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn row(state: DriftState, at: i64) -> DriftRow {
        DriftRow {
            target: "h1".into(),
            namespace_id: "ns".into(),
            agent_id: "a".into(),
            state,
            reason: None,
            message: String::new(),
            checked_at: at,
        }
    }

    /// Green only for a fresh observation of a running Agent; nothing observed, or
    /// observed too long ago, is unknown; unreachable is never green.
    #[test]
    fn only_a_fresh_observation_is_green() {
        let run = agent(DesiredState::Running);
        assert_eq!(seen(&run, None, 100, 60), Seen::Unknown);
        assert_eq!(
            seen(&run, Some(&row(DriftState::Synced, 90)), 100, 60),
            Seen::Running
        );
        assert_eq!(
            seen(&run, Some(&row(DriftState::Synced, 10)), 100, 60),
            Seen::Unknown
        );
        assert_eq!(
            seen(&run, Some(&row(DriftState::Unreachable, 90)), 100, 60),
            Seen::Unreachable
        );
        assert_eq!(
            seen(&run, Some(&row(DriftState::Converging, 90)), 100, 60),
            Seen::Converging
        );
        for s in Seen::ALL {
            assert_eq!(Seen::parse(s.as_str()), Some(*s));
            assert_eq!(s.tone() == Tone::Ok, *s == Seen::Running);
        }
    }

    #[test]
    fn one_unreachable_finding_makes_its_target_unreachable() {
        let rows = [
            row(DriftState::Synced, 90),
            row(DriftState::Unreachable, 95),
        ];
        assert_eq!(reach(&rows, 100, 60)["h1"], Reach::Unreachable(95));
        let rows = [row(DriftState::Synced, 10)];
        assert_eq!(reach(&rows, 100, 60)["h1"], Reach::Unknown);
    }
}
