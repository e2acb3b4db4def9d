//! Host inventory for a new Agent, always under the host lock: its private account, its port
//! reservation and its directory. Everything that could refuse is checked before anything is
//! created, so a refused prepare leaves no account, marker, port or directory behind.

use std::path::Path;

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::AgentRef;
use clawfleet_protocol::result::Step;

use super::{Ctx, Engine, fs_failure, ownership, system_failure};
use crate::fsutil;
use crate::layout::AgentPaths;
use crate::markers::{self, AccountIntent, AccountMarker, AgentMarker, PortMarker, SCHEMA};
use crate::system::Ids;

/// The passwd home of every Agent account: it does not exist, and the Agent cannot create it.
pub const ACCOUNT_HOME: &str = "/nonexistent";

/// The port a new Agent directory will record.
#[derive(Debug, Clone, Copy)]
struct PortChoice {
    port: u16,
    /// A killed earlier run already reserved it for this Agent.
    reserved: bool,
}

impl Engine<'_> {
    /// Makes sure the Agent's account and directory exist and are ours, creating what is
    /// missing. Checks first (foreign unit file, foreign account, the existing directory, a
    /// free port), then records `raise_fence` (the operation's fence, when higher than the
    /// Agent's record), creates after. Returns the account's ids.
    pub(crate) fn provision(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
        raise_fence: Option<u64>,
    ) -> Result<Ids, Failure> {
        // Check.
        self.verify_unit_file(ns, &agent.id, paths)?;
        let marker_path = self.layout.account_marker(&paths.account);
        let intent = self.account_intent(ns, agent, paths)?;
        let existing_ids =
            if fsutil::kind(&marker_path).map_err(fs_failure)? != fsutil::Kind::Missing {
                Some(self.verify_account(ns, agent, paths)?)
            } else {
                if intent.is_none() {
                    self.refuse_foreign_account(paths)?;
                }
                None
            };
        let port = if fsutil::dir_exists(&paths.dir).map_err(fs_failure)? {
            self.verify_agent(ns, agent, paths)?;
            None
        } else {
            Some(self.choose_port(ctx, ns, &agent.id)?)
        };
        // Accepted: the fence first, before anything of the Agent changes.
        if let Some(fence) = raise_fence {
            self.raise_fence(ctx, ns, &agent.id, paths, fence)?;
        }
        // Create.
        let ids = match existing_ids {
            Some(ids) => {
                // A run killed after the marker and before the intent's removal.
                if intent.is_some() {
                    fsutil::remove_file_if_present(&self.layout.account_intent(&paths.account))
                        .map_err(fs_failure)?;
                }
                ids
            }
            None => self.create_account(ctx, ns, agent, paths, intent.is_some())?,
        };
        if let Some(choice) = port {
            self.reserve_port(ns, &agent.id, choice)?;
            self.create_agent_dir(ctx, ns, agent, paths, ids, choice.port)?;
        }
        self.verify_agent(ns, agent, paths)?;
        self.limit_disk(ctx, agent, paths, ids)?;
        Ok(ids)
    }

    /// Puts the Agent's writable directories (`home`, `state`, the workspace below it) into
    /// the project of its uid with `[quota]`'s limits, where the state root's file system has
    /// project quotas (`crate::quota`); every time, so an Agent created before they were
    /// turned on gets them at its next prepare (files it made before keep project 0). On
    /// btrfs with quotas, its subvolumes go into its quota group `1/<uid>` with `max_bytes`;
    /// an Agent whose directories are plain directories (provisioned before quotas were
    /// enabled) stays unlimited, its data never moved: logged here, listed by `status`.
    /// Without either nothing is limited per Agent (see the operator guide).
    fn limit_disk(
        &self,
        ctx: &Ctx<'_>,
        agent: &AgentRef,
        paths: &AgentPaths,
        ids: Ids,
    ) -> Result<(), Failure> {
        let crate::quota::Support::Enforced(mechanism) =
            crate::quota::support(&self.config.state_root)
        else {
            return Ok(());
        };
        let limited = crate::quota::limit_agent(
            &self.config.state_root,
            mechanism,
            &[&paths.home, &paths.state],
            ids.uid,
            self.config.quota,
        )
        .map_err(|e| {
            Failure::new(
                if e.is_no_space() {
                    FailureCode::NoSpace
                } else {
                    FailureCode::IoFailed
                },
                format!("cannot limit the Agent's disk use: {e}"),
            )
        })?;
        if let crate::quota::Limited::NotSubvolumes(plain) = &limited {
            tracing::warn!(
                operation_id = %ctx.operation_id,
                agent = %agent.id,
                directories = %plain.join(", "),
                "agent directories are not btrfs subvolumes (provisioned before quotas were enabled): its disk use is not limited"
            );
        }
        tracing::debug!(
            operation_id = %ctx.operation_id,
            agent = %agent.id,
            project = ids.uid,
            ?mechanism,
            max_bytes = self.config.quota.max_bytes,
            max_inodes = self.config.quota.max_inodes,
            "agent directories limited"
        );
        Ok(())
    }

    /// The intent a killed run left to create this Agent's account, if any. One for another
    /// Agent (or service principal) under this account name is refused.
    pub(crate) fn account_intent(
        &self,
        ns: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
    ) -> Result<Option<AccountIntent>, Failure> {
        let intent: Option<AccountIntent> = markers::read_optional(
            &self.layout.account_intent(&paths.account),
            "account intent",
        )
        .map_err(super::marker_failure)?;
        if let Some(i) = &intent
            && (&i.namespace_id != ns
                || i.agent_id != agent.id
                || i.service_principal_id != agent.service_principal_id
                || i.account != paths.account)
        {
            return Err(ownership(format!(
                "the intent to create account {} names Agent {}/{} (service principal {}), not {}/{} ({})",
                paths.account,
                i.namespace_id,
                i.agent_id,
                i.service_principal_id,
                ns,
                agent.id,
                agent.service_principal_id
            )));
        }
        Ok(intent)
    }

    /// A user or group of the account's name that hostd did not record is not ours to adopt.
    pub(crate) fn refuse_foreign_account(&self, paths: &AgentPaths) -> Result<(), Failure> {
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
        Ok(())
    }

    /// Creates the Agent's account and its marker, recording the intent first (durably): a
    /// run killed between the account tool and the marker leaves an intent, and the next run
    /// adopts exactly what it describes, the user and group of that name when both exist and
    /// fit (the user's primary group is the group, neither is root), removes a lone group
    /// (an earlier hostd ran `groupadd`, then `useradd`) and creates afresh. The account's
    /// passwd home is [`ACCOUNT_HOME`], which does not exist and which the Agent cannot create: nothing it
    /// writes (say `~/.ssh/authorized_keys`) is ever read by sshd or by the account tools.
    /// The gateway's `HOME` is set by the unit alone. Without an intent the caller checked
    /// that neither user nor group exists.
    fn create_account(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
        had_intent: bool,
    ) -> Result<Ids, Failure> {
        ctx.step(Step::Account)?;
        let marker_path = self.layout.account_marker(&paths.account);
        let intent_path = self.layout.account_intent(&paths.account);
        fsutil::ensure_dir(&self.layout.accounts_dir(), 0o700).map_err(fs_failure)?;
        if !had_intent {
            let intent = AccountIntent {
                schema: SCHEMA,
                namespace_id: ns.clone(),
                agent_id: agent.id.clone(),
                service_principal_id: agent.service_principal_id.clone(),
                account: paths.account.clone(),
            };
            fsutil::write_atomic(&intent_path, &markers::to_bytes(&intent), 0o600, |_| Ok(()))
                .map_err(fs_failure)?;
        }
        crate::fault::point("after-account-intent");
        let user = self.system.user(&paths.account).map_err(system_failure)?;
        let group = self.system.group(&paths.account).map_err(system_failure)?;
        let ids = match (user, group) {
            (Some(ids), Some(gid)) if had_intent && ids.gid == gid => {
                tracing::info!(operation_id = %ctx.operation_id, account = %paths.account, uid = ids.uid, "adopting the account a killed run created");
                ids
            }
            (None, group) if had_intent || group.is_none() => {
                if group.is_some() {
                    tracing::info!(operation_id = %ctx.operation_id, account = %paths.account, "removing the lone group a killed run created");
                    self.system
                        .delete_group(&paths.account)
                        .map_err(system_failure)?;
                }
                // A uid never handed out before on this host (crate::uids).
                let id = match crate::uids::allocate(
                    &self.layout.uids_file(),
                    self.config.uid_range,
                    self.system,
                ) {
                    Ok(id) => id,
                    Err(e) => {
                        // Nothing was created: the intent this run wrote goes too.
                        if !had_intent && let Err(r) = fsutil::remove_file_if_present(&intent_path)
                        {
                            tracing::warn!(operation_id = %ctx.operation_id, "cannot remove {}: {r}", intent_path.display());
                        }
                        return Err(e.into_failure());
                    }
                };
                self.system
                    .create_account(&paths.account, Path::new(ACCOUNT_HOME), id)
                    .map_err(system_failure)?
            }
            _ => {
                return Err(ownership(format!(
                    "a user or group named {} exists that hostd's intent does not describe (user without its group, or another primary group); refusing to adopt it",
                    paths.account
                )));
            }
        };
        crate::fault::point("after-useradd");
        if ids.uid == 0 || ids.gid == 0 {
            let _ = self.system.delete_user(&paths.account);
            let _ = self.system.delete_group(&paths.account);
            let _ = fsutil::remove_file_if_present(&intent_path);
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
        // A failure here leaves the intent: the next run adopts the account.
        fsutil::write_atomic(&marker_path, &markers::to_bytes(&marker), 0o600, |_| Ok(()))
            .map_err(fs_failure)?;
        fsutil::remove_file_if_present(&intent_path).map_err(fs_failure)?;
        tracing::info!(operation_id = %ctx.operation_id, account = %paths.account, uid = ids.uid, "account created");
        Ok(ids)
    }

    /// Chooses the Agent's port without reserving it: its existing reservation if a killed run
    /// left one, otherwise the lowest free port of the range. Reservations are one file per
    /// port, so a corrupt file blocks only its own port.
    fn choose_port(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &Ident,
        agent: &Ident,
    ) -> Result<PortChoice, Failure> {
        ctx.step(Step::Port)?;
        let dir = self.layout.ports_dir();
        let names = if fsutil::dir_exists(&dir).map_err(fs_failure)? {
            fsutil::list_dir(&dir).map_err(fs_failure)?
        } else {
            Vec::new()
        };
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
                return Ok(PortChoice {
                    port,
                    reserved: true,
                });
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
        (start..=end)
            .find(|p| !taken.contains(p))
            .map(|port| PortChoice {
                port,
                reserved: false,
            })
            .ok_or_else(|| {
                Failure::new(
                    FailureCode::PortRangeExhausted,
                    format!("no free gateway port is left in {start}..={end}"),
                )
            })
    }

    /// Writes the reservation file of a chosen port. Under the host lock nobody else
    /// reserves ports, so a file that appeared meanwhile is someone else's doing.
    fn reserve_port(&self, ns: &Ident, agent: &Ident, choice: PortChoice) -> Result<(), Failure> {
        if choice.reserved {
            return Ok(());
        }
        fsutil::ensure_dir(&self.layout.ports_dir(), 0o700).map_err(fs_failure)?;
        let marker = PortMarker {
            schema: SCHEMA,
            namespace_id: ns.clone(),
            agent_id: agent.clone(),
        };
        let path = self.layout.port_file(choice.port);
        let created = fsutil::create_once(&path, &markers::to_bytes(&marker), 0o600, |_| Ok(()))
            .map_err(fs_failure)?;
        if !created {
            return Err(Failure::new(
                FailureCode::IoFailed,
                format!(
                    "{} appeared while the host lock was held; retry",
                    path.display()
                ),
            ));
        }
        Ok(())
    }

    /// Creates the Agent directory atomically. The caller checked that it is missing.
    fn create_agent_dir(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
        ids: Ids,
        port: u16,
    ) -> Result<(), Failure> {
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
        // On a btrfs state root with quotas, the writable directories are subvolumes, so
        // that `limit_disk` can put them into the Agent's quota group.
        let subvolumes = crate::quota::support(&self.config.state_root).subvolumes();
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
                if subvolumes && name != "revisions" {
                    crate::quota::create_subvolume(&p, mode).map_err(|e| fsutil::FsError::Io {
                        path: p.display().to_string(),
                        source: match e {
                            crate::quota::QuotaError::Subvolume { source, .. } => source,
                            other => std::io::Error::other(other.to_string()),
                        },
                    })?;
                } else {
                    fsutil::ensure_dir(&p, mode)?;
                }
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
        Ok(())
    }
}
