//! Minting operation ids and signing envelopes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clawfleet_protocol::envelope::MAX_DEADLINE_SECONDS;
use clawfleet_protocol::ident::IdentError;
use clawfleet_protocol::signing::SignError;
use clawfleet_protocol::ssh_key::PrivateKey;
use clawfleet_protocol::{
    Envelope, FENCED_VERSION, Fingerprint, HostName, Operation, OperationId, Principal,
    SignedEnvelope, Target,
};

/// Signs envelopes as one issuer and mints their operation ids.
#[derive(Debug)]
pub(crate) struct EnvelopeSigner {
    key: PrivateKey,
    issuer: Principal,
    lifetime: Duration,
    counter: AtomicU64,
}

/// The current Unix time in milliseconds (0 if the clock is before 1970).
pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Why no operation id could be minted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MintError {
    #[error(transparent)]
    Random(#[from] clawfleet_protocol::random::RandomError),
    #[error("the minted id is invalid: {0}")]
    Ident(#[from] IdentError),
}

/// The envelope deadline for a requested duration: whole seconds, rounded up, within the
/// protocol's bounds.
pub(crate) fn deadline_seconds(deadline: Duration) -> u32 {
    let secs = deadline.as_secs() + u64::from(deadline.subsec_nanos() > 0);
    u32::try_from(secs)
        .unwrap_or(MAX_DEADLINE_SECONDS)
        .clamp(1, MAX_DEADLINE_SECONDS)
}

impl EnvelopeSigner {
    pub(crate) fn new(key: PrivateKey, issuer: Principal, lifetime: Duration) -> Self {
        Self {
            key,
            issuer,
            lifetime,
            counter: AtomicU64::new(0),
        }
    }

    /// A fresh, unique operation id: `occ-<unix ms>-<counter>-<8 random hex>`. Fails only
    /// if the system's random source fails (the id's shape is always valid).
    pub(crate) fn mint_id(&self) -> Result<OperationId, MintError> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let suffix = clawfleet_protocol::random::hex(4)?;
        Ok(OperationId::new(format!(
            "occ-{}-{n}-{suffix}",
            now_unix_ms()
        ))?)
    }

    /// Builds and signs the envelope for one operation, in protocol `version` (with the
    /// fence only from [`FENCED_VERSION`] on, and only for operations that take one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sign(
        &self,
        id: &OperationId,
        host: &HostName,
        host_key: &Fingerprint,
        deadline: Duration,
        (version, fence): (u32, Option<u64>),
        operation: Operation,
    ) -> Result<SignedEnvelope, SignError> {
        let issued_at = now_unix_ms() / 1000;
        let fence = fence.filter(|_| version >= FENCED_VERSION && operation.kind().is_fenced());
        let envelope = Envelope {
            version,
            operation_id: id.clone(),
            target: Target {
                host: host.clone(),
                host_key: host_key.clone(),
            },
            issuer: self.issuer.clone(),
            issued_at,
            expires_at: issued_at + self.lifetime.as_secs().max(1),
            deadline_seconds: deadline_seconds(deadline),
            fence,
            operation,
        };
        SignedEnvelope::sign(&envelope, &self.key)
    }
}

impl EnvelopeSigner {
    /// Signs the open of one gateway stream to `namespace/agent` on `host` for `caller`,
    /// valid for a minute (hostd accepts at most
    /// [`clawfleet_protocol::relay::MAX_OPEN_LIFETIME_SECONDS`]).
    pub(crate) fn sign_relay_open(
        &self,
        host: &HostName,
        host_key: &Fingerprint,
        namespace: &clawfleet_protocol::Ident,
        agent: &clawfleet_protocol::Ident,
        caller: &str,
        gateway_auth: bool,
    ) -> Result<SignedEnvelope, clawfleet_protocol::relay::OpenSignError> {
        let issued_at = now_unix_ms() / 1000;
        clawfleet_protocol::relay::RelayOpen {
            version: clawfleet_protocol::relay::RELAY_VERSION,
            target: Target {
                host: host.clone(),
                host_key: host_key.clone(),
            },
            issuer: self.issuer.clone(),
            issued_at,
            expires_at: issued_at + 60,
            namespace: namespace.clone(),
            agent: agent.clone(),
            caller: caller.to_owned(),
            gateway_auth,
        }
        .sign(&self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_up_and_clamp() {
        assert_eq!(deadline_seconds(Duration::from_millis(1)), 1);
        assert_eq!(deadline_seconds(Duration::ZERO), 1);
        assert_eq!(deadline_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(deadline_seconds(Duration::from_secs(190)), 190);
        assert_eq!(
            deadline_seconds(Duration::from_secs(1 << 40)),
            MAX_DEADLINE_SECONDS
        );
    }

    #[test]
    fn ids_are_unique_and_valid() {
        use clawfleet_protocol::ssh_key::{Algorithm, getrandom::SysRng, rand_core::UnwrapErr};
        let Ok(key) = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519) else {
            panic!("no key");
        };
        let Ok(issuer) = Principal::new("occ@test") else {
            panic!("principal");
        };
        let s = EnvelopeSigner::new(key, issuer, Duration::from_secs(600));
        let ids: std::collections::HashSet<_> =
            (0..1000).filter_map(|_| s.mint_id().ok()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|i| i.as_str().starts_with("occ-")));
    }
}
