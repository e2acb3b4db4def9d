//! Probing an enrolled host through the backend, recording the answer.

use serde_json::Value;

use super::{Service, ServiceError};
use crate::backend::{Backend, CallError, CallOptions, HostTarget};

/// Why a probe gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Call(#[from] CallError),
}

impl Service {
    /// Probes an enrolled host and stores the answer as its last probe.
    pub async fn probe_host<B: Backend>(
        &self,
        backend: &B,
        name: &str,
    ) -> Result<Value, ProbeError> {
        let host = self.host(name).await?;
        let target = HostTarget::of(&host);
        let op = clawfleet_protocol::Operation::Probe(clawfleet_protocol::operation::ProbeArgs {});
        let result = backend.call(&target, op, CallOptions::default()).await?;
        let value = serde_json::to_value(&result).unwrap_or(Value::Null);
        self.store
            .set_host_probe(name, &value)
            .await
            .map_err(ServiceError::from)?;
        Ok(value)
    }
}
