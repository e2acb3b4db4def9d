//! `occ`: the clawfleet coordinator (`occ init`, `occ serve`) and its CLI over the HTTP API.
//! The command line lives in `cli/`; this file only runs it.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
