//! Host inventory for a new Agent, always under the host lock: its private account, its port
//! reservation and its directory.

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::AgentRef;
use clawfleet_protocol::result::Step;

use super::{Ctx, Engine, fs_failure, ownership, system_failure};
use crate::fsutil;
use crate::layout::AgentPaths;
use crate::markers::{self, AccountMarker, AgentMarker, PortMarker, SCHEMA};
use crate::system::Ids;

impl Engine<'_> {
    /// Creates the Agent's account (or verifies the existing one). Refuses to adopt a user or
    /// group of that name that hostd did not create.
    pub(crate) fn ensure_account(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
    ) -> Result<Ids, Failure> {
        let marker_path = self.layout.account_marker(&paths.account);
        if fsutil::kind(&marker_path).map_err(fs_failure)? != fsutil::Kind::Missing {
            return self.verify_account(ns, agent, paths);
        }
        ctx.step(Step::Account)?;
        if self
            .system
            .user(&paths.account)
            .map_err(system_failure)?
            .is_some()
            || self
                .system
                .group(&paths.account)
                .map_err(system_failure)?
                .is_some()
        {
            return Err(ownership(format!(
                "a user or group named {} exists but hostd did not create it; refusing to adopt it",
                paths.account
            )));
        }
        fsutil::ensure_dir(&self.layout.accounts_dir(), 0o700).map_err(fs_failure)?;
        let ids = self
            .system
            .create_account(&paths.account, &paths.home)
            .map_err(system_failure)?;
        if ids.uid == 0 || ids.gid == 0 {
            let _ = self.system.delete_user(&paths.account);
            let _ = self.system.delete_group(&paths.account);
            return Err(Failure::new(
                FailureCode::AccountToolFailed,
                format!(
                    "account {} came out with uid or gid 0; removed it",
                    paths.account
                ),
            ));
        }
        let marker = AccountMarker {
            schema: SCHEMA,
            namespace_id: ns.clone(),
            agent_id: agent.id.clone(),
            service_principal_id: agent.service_principal_id.clone(),
            account: paths.account.clone(),
            uid: ids.uid,
            gid: ids.gid,
        };
        if let Err(e) =
            fsutil::write_atomic(&marker_path, &markers::to_bytes(&marker), 0o600, |_| Ok(()))
        {
            let _ = self.system.delete_user(&paths.account);
            let _ = self.system.delete_group(&paths.account);
            return Err(fs_failure(e));
        }
        tracing::info!(operation_id = %ctx.operation_id, account = %paths.account, uid = ids.uid, "account created");
        Ok(ids)
    }

    /// Reserves a port for the Agent: its existing reservation if a killed run left one,
    /// otherwise the lowest free port of the range. Reservations are one file per port, so a
    /// corrupt file blocks only its own port.
    fn reserve_port(&self, ctx: &mut Ctx<'_>, ns: &Ident, agent: &Ident) -> Result<u16, Failure> {
        ctx.step(Step::Port)?;
        let dir = self.layout.ports_dir();
        fsutil::ensure_dir(&dir, 0o700).map_err(fs_failure)?;
        let names = fsutil::list_dir(&dir).map_err(fs_failure)?;
        let mut taken = std::collections::BTreeSet::new();
        for name in &names {
            let Some(port) = name
                .strip_suffix(".json")
                .and_then(|p| p.parse::<u16>().ok())
            else {
                continue;
            };
            taken.insert(port);
            if let Ok(m) = markers::read::<PortMarker>(&dir.join(name), "port")
                && &m.namespace_id == ns
                && &m.agent_id == agent
            {
                return Ok(port);
            }
        }
        if taken.len() >= self.config.max_agents as usize {
            return Err(Failure::new(
                FailureCode::HostFull,
                format!(
                    "this host already runs its maximum of {} Agents",
                    self.config.max_agents
                ),
            ));
        }
        let (start, end) = self.config.port_range;
        let marker = PortMarker {
            schema: SCHEMA,
            namespace_id: ns.clone(),
            agent_id: agent.clone(),
        };
        for port in start..=end {
            if taken.contains(&port) {
                continue;
            }
            let created = fsutil::create_once(
                &self.layout.port_file(port),
                &markers::to_bytes(&marker),
                0o600,
                |_| Ok(()),
            )
            .map_err(fs_failure)?;
            if created {
                return Ok(port);
            }
        }
        Err(Failure::new(
            FailureCode::PortRangeExhausted,
            format!("no free gateway port is left in {start}..={end}"),
        ))
    }

    /// Creates the Agent directory (atomically) if it is missing, then verifies it.
    pub(crate) fn ensure_agent_dir(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
        ids: Ids,
    ) -> Result<AgentMarker, Failure> {
        if !fsutil::dir_exists(&paths.dir).map_err(fs_failure)? {
            let port = self.reserve_port(ctx, ns, &agent.id)?;
            ctx.step(Step::Directories)?;
            let marker = AgentMarker {
                schema: SCHEMA,
                namespace_id: ns.clone(),
                agent_id: agent.id.clone(),
                service_principal_id: agent.service_principal_id.clone(),
                account: paths.account.clone(),
                port,
            };
            let root_group = Ids {
                uid: 0,
                gid: ids.gid,
            };
            fsutil::create_dir_atomic(&paths.dir, 0o750, |tmp| {
                fsutil::write_atomic(
                    &tmp.join("agent.json"),
                    &markers::to_bytes(&marker),
                    0o600,
                    |_| Ok(()),
                )?;
                for (name, mode, owner) in [
                    ("home", 0o700, ids),
                    ("state", 0o700, ids),
                    ("revisions", 0o750, root_group),
                ] {
                    let p = tmp.join(name);
                    fsutil::ensure_dir(&p, mode)?;
                    self.system
                        .chown(&p, owner)
                        .map_err(|e| fsutil::FsError::Io {
                            path: p.display().to_string(),
                            source: std::io::Error::other(e.to_string()),
                        })?;
                }
                self.system
                    .chown(tmp, root_group)
                    .map_err(|e| fsutil::FsError::Io {
                        path: tmp.display().to_string(),
                        source: std::io::Error::other(e.to_string()),
                    })
            })
            .map_err(fs_failure)?;
            tracing::info!(operation_id = %ctx.operation_id, agent = %agent.id, port, "agent directory created");
        }
        self.verify_agent(ns, agent, paths)
    }
}
