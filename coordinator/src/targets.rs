//! Where an Agent's operations go, resolved from the store in one place for the worker and the
//! service layer: its Namespace's cluster (with credentials), or the enrolled host it is placed
//! on. `None` while a pool Agent was never placed.

use thiserror::Error;

use crate::backend::{ClusterTarget, HostTarget, Target};
use crate::codes::Code;
use crate::model::{Agent, Host, Namespace};
use crate::store::StoreError;
use crate::store::prelude::*;

/// Why no target could be resolved.
#[derive(Debug, Error)]
pub enum TargetError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored state names a cluster or host that is not registered: `INVALID_STATE`.
    #[error("{message}")]
    Inconsistent { code: Code, message: String },
}

/// The target of an enrolled host.
pub fn host(host: &Host) -> Target {
    Target::Host(HostTarget::of(host))
}

/// The cluster of a cluster Namespace, with its credentials; `None` for a host pool.
pub async fn cluster(store: &dyn Store, ns: &Namespace) -> Result<Option<Target>, TargetError> {
    let Some(name) = &ns.cluster else {
        return Ok(None);
    };
    let record = store
        .cluster(name)
        .await?
        .ok_or_else(|| TargetError::Inconsistent {
            code: Code::InvalidState,
            message: format!(
                "Namespace {} names cluster {name}, which is not registered",
                ns.id
            ),
        })?;
    Ok(Some(Target::Cluster(ClusterTarget {
        name: name.clone(),
        record,
    })))
}

/// Where an Agent's operations go.
pub async fn agent(
    store: &dyn Store,
    ns: &Namespace,
    agent: &Agent,
) -> Result<Option<Target>, TargetError> {
    if let Some(t) = cluster(store, ns).await? {
        return Ok(Some(t));
    }
    let Some(name) = &agent.host else {
        return Ok(None);
    };
    let h = store
        .host(name)
        .await?
        .ok_or_else(|| TargetError::Inconsistent {
            code: Code::InvalidState,
            message: format!("the Agent's host {name} is not enrolled"),
        })?;
    Ok(Some(host(&h)))
}

/// The ready pool host with room and the fewest Agents: where placement puts an Agent that
/// has no host yet (the worker's placement, [`crate::store::AgentStore::place_agent`], applies
/// the same rule in its write; a plan asks that host).
pub async fn least_loaded(store: &dyn Store, ns: &Namespace) -> Result<Option<Host>, StoreError> {
    Ok(least_loaded_of(store.host_loads(&ns.ready_hosts).await?))
}

/// The placement rule (the store's, which places inside its transaction).
pub use crate::store::least_loaded_of;
