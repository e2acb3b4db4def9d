//! `occ namespace`: Namespaces on a host pool or a cluster.

use anyhow::Result;
use clap::Subcommand;
use clawfleet_api::types::{Namespace, NamespaceStatus, NewNamespace};
use coordinator::client::{Api, Client, all_pages};

use super::Cli;
use super::table::{Column, col, opt, print_fields, print_one, print_rows};

const CREATED_COLUMNS: &[Column<Namespace>] = &[
    col("NAMESPACE", |n| n.id.to_string()),
    col("HOSTS", |n| super::table::list(&n.hosts)),
    col("CLUSTER", |n| opt(&n.cluster)),
    col("READY", |n| n.ready.to_string()),
];

const LIST_COLUMNS: &[Column<Namespace>] = &[
    col("NAMESPACE", |n| n.id.to_string()),
    col("NAME", |n| n.name.to_string()),
    col("HOSTS", |n| super::table::list(&n.hosts)),
    col("READY", |n| n.ready.to_string()),
    col("DELETING", |n| n.deleting.to_string()),
];

const GET_COLUMNS: &[Column<NamespaceStatus>] = &[
    col("NAMESPACE", |n| n.namespace.id.to_string()),
    col("HOSTS", |n| super::table::list(&n.namespace.hosts)),
    col("READY HOSTS", |n| {
        super::table::list(&n.namespace.ready_hosts)
    }),
    col("READY", |n| n.namespace.ready.to_string()),
];

#[derive(Subcommand, Debug)]
pub(crate) enum NamespaceCmd {
    /// Create a Namespace on a host pool (--hosts) or on a cluster (--cluster).
    Create {
        id: String,
        /// Comma-separated host pool.
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "cluster",
            conflicts_with = "cluster"
        )]
        hosts: Vec<String>,
        /// A registered Kubernetes cluster.
        #[arg(long)]
        cluster: Option<String>,
        /// A display name (default: the id).
        #[arg(long)]
        name: Option<String>,
        /// The pool's hosts run this Namespace's Agents only (needed for trusted-proxy auth).
        #[arg(long, conflicts_with = "cluster")]
        single_tenant: bool,
    },
    /// List the Namespaces the token may read.
    List,
    /// Show a Namespace: its pool or cluster and whether it is ready.
    Get { id: String },
    /// Show a Namespace with its newest ensure or delete work: state, attempts, and the last
    /// code and message (why it is not ready on its cluster or pool, and whether it is retried).
    Status { id: String },
    /// Delete an empty Namespace (refused while it has Agents).
    Delete { id: String },
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &NamespaceCmd) -> Result<()> {
    match cmd {
        NamespaceCmd::Create {
            id,
            hosts,
            cluster,
            name,
            single_tenant,
        } => {
            let v = c.create_namespace(
                [],
                &NewNamespace {
                    id: id.clone(),
                    name: name.clone(),
                    hosts: hosts.clone(),
                    cluster: cluster.clone(),
                    single_tenant: *single_tenant,
                },
            )?;
            print_one(cli, &v, CREATED_COLUMNS);
        }
        NamespaceCmd::List => print_rows(
            cli,
            &all_pages(None, |q| c.list_namespaces([], q))?,
            LIST_COLUMNS,
        ),
        NamespaceCmd::Get { id } => print_one(cli, &c.get_namespace([id])?, GET_COLUMNS),
        NamespaceCmd::Status { id } => print_fields(cli, &c.get_namespace([id])?),
        NamespaceCmd::Delete { id } => print_fields(cli, &c.delete_namespace([id])?),
    }
    Ok(())
}
