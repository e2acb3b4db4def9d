//! `occ configuration`: native openclaw.json documents, in generations.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use clawfleet_api::types::{ConfigurationUpdate, ConfigurationWritten, NewConfiguration};
use coordinator::client::{Api, Client};

use super::table::{Column, col, print_fields, print_one};
use super::{Cli, read_json};

const WRITTEN_COLUMNS: &[Column<ConfigurationWritten>] = &[
    col("CONFIGURATION", |c| c.id.clone()),
    col("GENERATION", |c| c.generation.to_string()),
];

#[derive(Subcommand, Debug)]
pub(crate) enum ConfigurationCmd {
    /// Create a Configuration from an openclaw.json document.
    Create {
        namespace: String,
        id: String,
        /// JSON file with the document.
        #[arg(long)]
        file: PathBuf,
    },
    /// Add a generation to a Configuration (Agents use it on their next deploy).
    Update {
        namespace: String,
        id: String,
        /// JSON file with the document.
        #[arg(long)]
        file: PathBuf,
    },
    /// Show a Configuration's latest generation.
    Get { namespace: String, id: String },
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &ConfigurationCmd) -> Result<()> {
    match cmd {
        ConfigurationCmd::Create {
            namespace,
            id,
            file,
        } => {
            let v = c.create_configuration(
                [namespace],
                &NewConfiguration {
                    id: id.clone(),
                    document: read_json(file)?,
                },
            )?;
            print_one(cli, &v, WRITTEN_COLUMNS);
        }
        ConfigurationCmd::Update {
            namespace,
            id,
            file,
        } => {
            let v = c.put_configuration(
                [namespace, id],
                &ConfigurationUpdate {
                    document: read_json(file)?,
                },
            )?;
            print_one(cli, &v, WRITTEN_COLUMNS);
        }
        ConfigurationCmd::Get { namespace, id } => {
            print_fields(cli, &c.get_configuration([namespace, id])?)
        }
    }
    Ok(())
}
