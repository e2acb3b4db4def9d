//! occ: the clawfleet coordinator and its CLI.
//!
//! This first cut only reports its identity; the coordinator lands with its own issue.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("version") | Some("--version") => {
            println!(
                "occ {} (protocol versions {:?})",
                env!("CARGO_PKG_VERSION"),
                clawfleet_protocol::SUPPORTED_VERSIONS
            );
            ExitCode::SUCCESS
        }
        Some("demo") => {
            eprintln!(
                "occ demo: the coordinator, its worker and the SSH backend are not built yet \
                 (see the coordinator issue); nothing was started"
            );
            ExitCode::from(2)
        }
        Some(other) => {
            eprintln!("occ: `{other}` is not available in this build yet; try `occ version`");
            ExitCode::from(2)
        }
        None => {
            eprintln!("usage: occ version | occ demo");
            ExitCode::from(2)
        }
    }
}
