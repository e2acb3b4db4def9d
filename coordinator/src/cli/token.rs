//! `occ token`: API tokens with grants and an optional expiry.

use anyhow::{Context, Result};
use clap::Subcommand;
use clawfleet_api::types::{CreatedToken, Grant, NewToken, Role};
use coordinator::client::{Api, Client};

use super::Cli;
use super::out::say;
use super::table::{Column, col, opt, print_one};

const CREATED_COLUMNS: &[Column<CreatedToken>] = &[
    col("ID", |t| t.id.clone()),
    col("TOKEN", |t| t.token.clone()),
    col("EXPIRES", |t| opt(&t.expires_at)),
];

#[derive(Subcommand, Debug)]
pub(crate) enum TokenCmd {
    /// Create a token; grants are NAMESPACE:ROLE (NAMESPACE may be *).
    Create {
        name: String,
        /// NAMESPACE:ROLE (roles: read, operate, deploy, admin; NAMESPACE * for all); repeat.
        #[arg(long = "grant", required = true)]
        grants: Vec<String>,
        /// Refuse the token after this many seconds (e.g. 86400 for a day); default: never.
        #[arg(long = "expires-in", value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..))]
        expires_in: Option<u32>,
    },
    /// Revoke a token by its id.
    Revoke { id: String },
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &TokenCmd) -> Result<()> {
    match cmd {
        TokenCmd::Create {
            name,
            grants,
            expires_in,
        } => {
            let mut parsed = Vec::new();
            for g in grants {
                let (ns, role) = g
                    .split_once(':')
                    .with_context(|| format!("--grant {g:?} must be NAMESPACE:ROLE"))?;
                let role = Role::parse(role).with_context(|| {
                    format!("--grant {g:?}: the role must be read, operate, deploy or admin")
                })?;
                parsed.push(Grant {
                    namespace: ns.to_owned(),
                    role,
                });
            }
            print_one(
                cli,
                &c.create_token(
                    [],
                    &NewToken {
                        name: name.clone(),
                        grants: parsed,
                        expires_at: expires_in
                            .map(|s| coordinator::clock::now_seconds() + i64::from(s)),
                    },
                )?,
                CREATED_COLUMNS,
            );
        }
        TokenCmd::Revoke { id } => {
            c.revoke_token([id])?;
            say(&format!("token {id} revoked"));
        }
    }
    Ok(())
}
