//! `occ init` as an operator runs it (the real binary, a state directory of its own): the
//! first admin token is handed once and never kept in the state directory, the database and
//! the encryption key are private, and a database that holds tokens already gets no new admin
//! token unless asked, saying so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Occ {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Occ {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        // A state directory that exists already, world-readable, as N15 found it.
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = dir.path().join("occ.toml");
        std::fs::write(&config, format!("state_dir = \"{}\"\n", state.display())).unwrap();
        Self { dir, config }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_occ"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env("OCC_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Whether any file under `dir` holds `needle`.
fn anywhere_under(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
            {
                found.push(p);
            }
        }
    }
    found
}

/// N1: `occ init` wrote the first admin token 0600 into the state directory, where it stayed
/// readable to anyone who reads that directory (and clients read it back from there). Now it
/// goes only where the operator says, and nothing in the state directory holds it.
#[test]
fn the_first_admin_token_is_handed_once_and_not_kept() {
    let occ = Occ::new();
    let token_file = occ.dir.path().join("operator.token");
    let out = occ.run(&["init", "--admin-token-file", token_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(mode(&token_file), 0o600);
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    assert!(token.len() > 20, "{token}");
    assert!(!occ.state().join("admin.token").exists());
    assert_eq!(anywhere_under(&occ.state(), &token), Vec::<PathBuf>::new());
    assert!(
        !text(&out).contains(&token),
        "printed as well: {}",
        text(&out)
    );
    // N15: the database and the key are private although the directory is not.
    assert_eq!(mode(&occ.state().join("occ.db")), 0o600);
    assert_eq!(mode(&occ.state().join("keys/encryption.key")), 0o600);

    // Again (as the packaged unit does before every start): no token, and it says why.
    let again = occ.run(&["init"]);
    assert!(again.status.success(), "{}", text(&again));
    let said = text(&again);
    assert!(
        said.contains("already holds 1 token(s): no admin token created")
            && said.contains("occ token create")
            && said.contains("--new-admin-token"),
        "{said}"
    );
    // Asking for a token on a database that has one is refused, writing nothing.
    let second = occ.dir.path().join("second.token");
    let refused = occ.run(&["init", "--admin-token-file", second.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("already holds"),
        "{}",
        text(&refused)
    );
    assert!(!second.exists());
    // Never into the state directory.
    let inside = occ.state().join("mine.token");
    let refused = occ.run(&[
        "init",
        "--new-admin-token",
        "--admin-token-file",
        inside.to_str().unwrap(),
    ]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("inside the state directory"),
        "{}",
        text(&refused)
    );
    assert!(!inside.exists());
    // Every admin token lost: a new one, with access to the database itself, printed alone.
    let new = occ.run(&["init", "--new-admin-token", "--admin-token-file", "-"]);
    assert!(new.status.success(), "{}", text(&new));
    let printed = String::from_utf8(new.stdout).unwrap();
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 1, "{printed}");
    assert_ne!(lines[0], token);
    assert!(String::from_utf8_lossy(&new.stderr).contains("shown once"));
    // Without a terminal and without the flag, a fresh database gets no token at all.
    let fresh = Occ::new();
    let out = fresh.run(&["init"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("no admin token created"),
        "{}",
        text(&out)
    );
}
