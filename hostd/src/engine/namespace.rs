//! `ensure-namespace`.

use clawfleet_protocol::failure::Failure;
use clawfleet_protocol::operation::NamespaceRef;
use clawfleet_protocol::result::{EnsureNamespaceResult, Step};

use super::hooks::{Event, Subject};
use super::{Ctx, Engine, fs_failure};
use crate::fsutil;
use crate::markers::{self, NamespaceMarker, SCHEMA};

impl Engine<'_> {
    /// Creates the Namespace directory and marker atomically if missing, then verifies them.
    /// An existing directory that belongs to another Namespace is refused, never repaired.
    pub(crate) fn ensure_namespace(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &NamespaceRef,
    ) -> Result<EnsureNamespaceResult, Failure> {
        let host = self.host_lock(ctx)?;
        ctx.step(Step::Directories)?;
        fsutil::ensure_dir(&self.layout.namespaces_dir(), 0o755).map_err(fs_failure)?;
        self.sweep_pending(&self.layout.namespaces_dir());
        let marker = NamespaceMarker {
            schema: SCHEMA,
            namespace_id: ns.id.clone(),
            namespace_name: ns.name.clone(),
        };
        let created = fsutil::create_dir_atomic(&self.layout.namespace_dir(&ns.id), 0o755, |tmp| {
            fsutil::write_atomic(
                &tmp.join("namespace.json"),
                &markers::to_bytes(&marker),
                0o600,
                |_| Ok(()),
            )?;
            fsutil::ensure_dir(&tmp.join("agents"), 0o755).map(|_| ())
        })
        .map_err(fs_failure)?;
        ctx.step(Step::Verify)?;
        self.verify_namespace(ns)?;
        drop(host);
        if created {
            tracing::info!(operation_id = %ctx.operation_id, namespace = %ns.id, "namespace created");
        }
        // On every ensure (hooks are safe to repeat), outside the host lock.
        ctx.step(Step::Hooks)?;
        self.run_hooks(
            ctx,
            Event::AfterNamespacePrepared,
            &Subject {
                namespace_id: ns.id.as_str(),
                namespace_name: ns.name.as_str(),
                ..Subject::default()
            },
        )?;
        Ok(EnsureNamespaceResult {
            namespace_id: ns.id.clone(),
            created,
        })
    }
}
