//! Probing an enrolled host through the backend, recording the answer.

use clawfleet_api::responses::HostProbe;
use serde_json::Value;

use super::{NewHost, Service, ServiceError};
use crate::backend::{Backend, CallError, CallOptions, HostTarget};
use crate::codes::Code;
use crate::model::Host;

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
    ) -> Result<HostProbe, ProbeError> {
        let host = self.host(name).await?;
        let target = HostTarget::of(&host);
        let op = clawfleet_protocol::Operation::Probe(clawfleet_protocol::operation::ProbeArgs {});
        let result = backend.call(&target, op, CallOptions::default()).await?;
        let value = serde_json::to_value(&result).unwrap_or(Value::Null);
        self.store
            .set_host_probe(name, &value)
            .await
            .map_err(ServiceError::from)?;
        self.warn_if_shared_without(name, &value).await?;
        Ok(HostProbe(result))
    }

    /// Enrols a host (`replace`: re-pins an enrolled one) once hostd there, asked with a probe
    /// addressed to the new record, answers to its name. hostd refuses every envelope for
    /// another host name (`WRONG_HOST`), so a host enrolled under a name hostd does not
    /// answer to could never run anything: that is refused here, naming both names, and
    /// nothing is stored. A host that cannot be reached yet (hostd not enrolled there, down)
    /// is enrolled as before; `occ host probe` tells later. A probe that answered is stored
    /// as the host's last probe.
    pub async fn enrol_host_probed<B: Backend>(
        &self,
        backend: &B,
        actor: &str,
        h: NewHost,
        replace: bool,
    ) -> Result<Host, ProbeError> {
        let candidate = Self::validate_host(h.clone())?;
        // The cheap refusals first, without asking the host.
        let known = self
            .store
            .host(candidate.name.as_str())
            .await
            .map_err(ServiceError::from)?;
        if replace && known.is_none() {
            return Err(ServiceError::not_found("host", candidate.name.as_str()).into());
        }
        if !replace && known.is_some() {
            // `enrol_host` words the refusal.
            return Ok(self.enrol_host(actor, h).await?);
        }
        let target = HostTarget::of(&candidate);
        let op = clawfleet_protocol::Operation::Probe(clawfleet_protocol::operation::ProbeArgs {});
        let probe = match backend.call(&target, op, CallOptions::default()).await {
            Ok(result) => Some(serde_json::to_value(&result).unwrap_or(Value::Null)),
            Err(CallError::Failed(f)) if f.code == clawfleet_protocol::FailureCode::WrongHost => {
                return Err(match hostd_name(&f.message) {
                    Some(theirs) if theirs != candidate.name.as_str() => {
                        ServiceError::conflict(
                            Code::HostNameMismatch,
                            format!(
                                "hostd at {} answers to the host name {theirs}, not {}: enrol it as {theirs} \
                                 (occ host enrol {theirs} ...), or set host_name = \"{}\" in /etc/clawfleet/hostd.toml there; \
                                 nothing was stored",
                                candidate.address, candidate.name, candidate.name
                            ),
                        )
                        .into()
                    }
                    _ => CallError::Failed(f).into(),
                });
            }
            Err(e) => {
                tracing::info!(host = %candidate.name, "enrolling a host that did not answer the probe: {e}");
                None
            }
        };
        let host = if replace {
            self.update_host(actor, h).await?
        } else {
            self.enrol_host(actor, h).await?
        };
        if let Some(p) = probe {
            self.store
                .set_host_probe(host.name.as_str(), &p)
                .await
                .map_err(ServiceError::from)?;
        }
        Ok(host)
    }
}

impl Service {
    /// A probe that says a host lacks what sharing it needs
    /// ([`clawfleet_api::model::SHARED_HOST_NEEDS`]) while several Namespaces already use it
    /// (it lost it after they were placed: quotas turned off, a kernel without namespaces) is
    /// logged as a warning naming them: new Namespaces are refused there, but the ones already
    /// placed keep running, and `occ host probe` / `occ host get` say the same.
    async fn warn_if_shared_without(&self, name: &str, probe: &Value) -> Result<(), ServiceError> {
        let gaps = clawfleet_api::model::shared_host_gaps(probe);
        if gaps.is_empty() {
            return Ok(());
        }
        let sharing: Vec<String> = self
            .store
            .namespaces()
            .await?
            .into_iter()
            .filter(|n| n.hosts.iter().any(|h| h == name))
            .map(|n| n.id.to_string())
            .collect();
        if sharing.len() > 1 {
            for (need, why) in gaps {
                tracing::warn!(
                    host = name,
                    code = need.code.as_str(),
                    namespaces = %sharing.join(","),
                    "host {name} {} ({why}), yet Namespaces {} share it",
                    need.cannot,
                    sharing.join(", ")
                );
            }
        }
        Ok(())
    }
}

/// The host name hostd gave in its `WRONG_HOST` refusal ("… this is NAME with key …").
fn hostd_name(message: &str) -> Option<&str> {
    let rest = message.split_once(", this is ")?.1;
    let name = rest.split_once(' ').map_or(rest, |(n, _)| n);
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::hostd_name;

    #[test]
    fn hostd_names_itself_in_its_wrong_host_refusal() {
        assert_eq!(
            hostd_name(
                "the envelope is for host web-1 with key SHA256:a, this is web-1.example with key SHA256:a"
            ),
            Some("web-1.example")
        );
        assert_eq!(hostd_name("something else"), None);
    }
}
