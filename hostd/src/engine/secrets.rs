//! `put-secrets`: replaces an Agent's secrets (see `crate::secrets` for where they live).

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::result::Step;
use clawfleet_protocol::sealed::{
    HostSecretKey, OpenError, PutSecretsArgs, PutSecretsResult, SecretVersion,
};
use zeroize::Zeroizing;

use super::{Ctx, Engine, fs_failure, system_failure};
use crate::fsutil::{self, Kind};
use crate::secrets::{self as at_rest, SecretsError};

/// Largest private host key file read.
const HOST_KEY_MAX: u64 = 16 * 1024;

pub(crate) fn secrets_failure(e: SecretsError) -> Failure {
    match e {
        SecretsError::Fs(f) => fs_failure(f),
        SecretsError::CredsMissing => Failure::new(FailureCode::MissingTool, e.to_string()),
        SecretsError::Manifest { .. } | SecretsError::Fingerprint { .. } => {
            Failure::new(FailureCode::OwnershipMismatch, e.to_string())
        }
        SecretsError::Creds { .. } | SecretsError::Write { .. } | SecretsError::Account { .. } => {
            Failure::new(FailureCode::IoFailed, e.to_string())
        }
    }
}

fn open_failure(e: OpenError) -> Failure {
    Failure::new(FailureCode::SecretUndecryptable, e.to_string())
}

impl Engine<'_> {
    /// The host's X25519 key for secrets, from its ssh-ed25519 private key.
    fn host_secret_key(&self) -> Result<HostSecretKey, Failure> {
        let public = &self.config.host_key;
        let path = at_rest::private_host_key_path(public).ok_or_else(|| {
            Failure::new(
                FailureCode::HostConfigInvalid,
                format!(
                    "host_key {} does not end in .pub, so hostd cannot find the private host key that opens secrets",
                    public.display()
                ),
            )
        })?;
        let bytes = fsutil::read_small(&path, HOST_KEY_MAX).map_err(fs_failure)?;
        let text = Zeroizing::new(String::from_utf8_lossy(&bytes).into_owned());
        drop(Zeroizing::new(bytes));
        HostSecretKey::from_openssh(&text).map_err(|e| {
            Failure::new(
                FailureCode::HostConfigInvalid,
                format!("the private host key {}: {e}", path.display()),
            )
        })
    }

    /// `put-secrets`.
    pub(crate) fn put_secrets(
        &self,
        ctx: &mut Ctx<'_>,
        args: &PutSecretsArgs,
    ) -> Result<PutSecretsResult, Failure> {
        ctx.step(Step::Verify)?;
        let paths = self.inspected(&args.namespace, &args.agent)?;
        let _agent_lock = self.agent_lock(ctx, &paths.lock)?;
        // Every value opens (and has its fingerprint) before anything changes.
        let key = self.host_secret_key()?;
        let mut values: Vec<(SecretVersion, Zeroizing<Vec<u8>>)> = Vec::new();
        for sealed in &args.secrets {
            let value = key
                .open(&args.namespace.id, &args.agent.id, sealed)
                .map_err(open_failure)?;
            values.push((sealed.version(), value));
        }
        values.sort_by(|a, b| a.0.cmp(&b.0));
        self.check_fence(ctx, &args.namespace.id, &args.agent.id, &paths)?;
        let ids = self.verify_account(&args.namespace.id, &args.agent, &paths)?;
        ctx.step(Step::Secrets)?;
        let wanted = args.versions();
        let had = at_rest::read_manifest(&paths.dir).map_err(secrets_failure)?;
        let changed = had.secrets != wanted;
        if changed
            && let Some(why) = at_rest::store(&paths.dir, &values, &at_rest::creds_encrypt)
                .map_err(secrets_failure)?
        {
            tracing::warn!(operation_id = %ctx.operation_id, agent = %args.agent.id, "the secrets this put replaces are not kept, so a reload the gateway refuses cannot put them back: {why}");
        }
        // A running gateway reads its files from the unit's runtime directory: replace them
        // there now (no restart). A stopped unit has none; its next start writes them.
        ctx.step(Step::SecretFiles)?;
        let runtime = at_rest::runtime_dir(&self.layout.run_dir, &paths.unit_name);
        let running = self
            .system
            .unit_state(&paths.unit_name)
            .map_err(system_failure)?
            .is_active()
            && matches!(fsutil::kind(&runtime), Ok(Kind::Dir));
        if running {
            at_rest::write_files(&runtime, ids, &values).map_err(secrets_failure)?;
        }
        let names: Vec<String> = wanted
            .iter()
            .map(|v| format!("{}@{} {}", v.name, v.version, v.fingerprint))
            .collect();
        tracing::info!(operation_id = %ctx.operation_id, agent = %args.agent.id, changed, delivered = running, secrets = ?names, "secrets put");
        Ok(PutSecretsResult {
            secrets: wanted,
            changed,
            delivered_to_running_gateway: running,
        })
    }
}
