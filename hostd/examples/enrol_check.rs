//! Runs `hostd::enrol::enrol` with the standard paths and prints the outcome as JSON, so
//! hostd/tests/enrol_real_host.rs can enrol inside a test host without hostd's CLI.
//!
//! Usage: `enrol_check <ssh-key.pub> <signing-key.pub> <principal> <forced command>`

use hostd::enrol::{EnrolRequest, enrol};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [ssh, signing, principal, command] = args.as_slice() else {
        return Err(
            "usage: enrol_check <ssh-key.pub> <signing-key.pub> <principal> <command>".into(),
        );
    };
    let mut req = EnrolRequest::new(
        std::fs::read_to_string(ssh)?,
        std::fs::read_to_string(signing)?,
        principal.as_str(),
    );
    req.forced_command = command.clone();
    match enrol(&req) {
        Ok(outcome) => println!("{}", serde_json::json!({ "ok": outcome })),
        Err(e) => println!("{}", serde_json::json!({ "error": e.to_string() })),
    }
    Ok(())
}
