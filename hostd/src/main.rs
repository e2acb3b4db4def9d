//! hostd: the clawfleet helper installed on every host.
//!
//! This first cut only reports its identity; the operation executor lands with the hostd issue.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("version") | Some("--version") => {
            println!(
                "hostd {} (protocol versions {:?})",
                env!("CARGO_PKG_VERSION"),
                clawfleet_protocol::SUPPORTED_VERSIONS
            );
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!(
                "hostd: `{other}` is not available in this build yet; only `hostd version` is"
            );
            ExitCode::from(2)
        }
        None => {
            eprintln!("usage: hostd version");
            ExitCode::from(2)
        }
    }
}
