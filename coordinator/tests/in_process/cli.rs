//! `occ` itself, run as a process against the API on loopback with hostd's engine in process
//! behind it (tests/hostd_engine/mod.rs): what it prints for people and for scripts, its exit
//! codes, a closed stdout, and colour in its log lines. `CLAWFLEET_OCC_BIN` runs another
//! `occ` binary against the same checks (to show what an older build did).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support::{self, Served};
use crate::hostd_engine;

use std::process::{Command, Stdio};
use std::sync::Arc;

use coordinator::client::Client;
use coordinator::config::ApiSettings;
use hostd_engine::EngineBackend;
use serde_json::{Value, json};

use crate::fixtures::HOST_KEY;

/// What an untrusted string may carry: a terminal title change, a screen clear, a colour, a
/// bidi override that shows `exe.txt` as `txt.exe`, a zero-width space and a line separator.
const HOSTILE: &str =
    "x\u{1b}]0;owned\u{7}\u{1b}[2J\u{1b}[31mred\u{202e}exe.txt\u{200b}\u{2028}end";

/// The API and a worker on in-process hosts ([`Served`]).
struct Api(Served<EngineBackend>);

impl std::ops::Deref for Api {
    type Target = Served<EngineBackend>;
    fn deref(&self) -> &Served<EngineBackend> {
        &self.0
    }
}

/// What `occ` did: exit code, stdout, stderr.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Api {
    async fn start() -> Self {
        let (store, admin) = api_support::store_with_admin().await;
        let backend = Arc::new(EngineBackend::new());
        Self(Served::start(store, admin, backend, ApiSettings::default()).await)
    }

    async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let c = Client::new(&self.server, Some(self.admin.clone())).unwrap();
        let (method, path) = (method.to_owned(), path.to_owned());
        tokio::task::spawn_blocking(move || c.request(&method, &path, body.as_ref()))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Host h1, Namespace ns1 on it, Configuration cfg (its `meta.note` is [`HOSTILE`]),
    /// Agent a1.
    async fn fleet(&self) {
        self.admin(
            "POST",
            "/hosts",
            Some(json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY})),
        )
        .await;
        self.admin(
            "POST",
            "/namespaces",
            Some(json!({"id": "ns1", "hosts": ["h1"]})),
        )
        .await;
        self.admin(
            "POST",
            "/namespaces/ns1/configurations",
            Some(json!({"id": "cfg", "document": {"meta": {"note": HOSTILE}}})),
        )
        .await;
        self.admin(
            "POST",
            "/namespaces/ns1/agents",
            Some(json!({"id": "a1", "configurationId": "cfg"})),
        )
        .await;
        self.settle().await;
    }

    /// Runs the worker in the background until the returned sender is dropped.
    fn run_worker(&self) -> tokio::sync::watch::Sender<bool> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(self.worker.clone().run(1, rx));
        tx
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(occ_binary());
        cmd.args(["--server", &self.server, "--token", &self.admin])
            .args(args)
            .env("OCC_LOG", "error")
            .stdin(Stdio::null());
        cmd
    }

    async fn occ(&self, args: &[&str]) -> Run {
        let mut cmd = self.command(args);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The `occ` under test: `$CLAWFLEET_OCC_BIN` if set, else this build's.
fn occ_binary() -> std::path::PathBuf {
    std::env::var_os("CLAWFLEET_OCC_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_occ").into())
}

/// Characters that must not reach a terminal from untrusted text.
fn hidden(text: &str) -> Vec<char> {
    text.chars()
        .filter(|c| {
            (c.is_control() && *c != '\n')
                || matches!(*c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200b}'..='\u{200f}' | '\u{2028}' | '\u{2029}')
        })
        .collect()
}

/// N10: a Configuration field with terminal escapes, a bidi override and invisible characters
/// is shown with visible escapes in table output (it reached the terminal raw), while
/// `--output json` keeps it exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_text_is_escaped_in_tables_and_exact_in_json() {
    let api = Api::start().await;
    api.fleet().await;
    let table = api.occ(&["configuration", "get", "ns1", "cfg"]).await;
    assert_eq!(table.code, 0, "{}{}", table.stdout, table.stderr);
    assert!(
        hidden(&table.stdout).is_empty(),
        "raw {:?} in {:?}",
        hidden(&table.stdout),
        table.stdout
    );
    assert!(
        table.stdout.contains(
            "x\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{1b}[31mred\\u{202e}exe.txt\\u{200b}\\u{2028}end"
        ),
        "{}",
        table.stdout
    );
    let json = api
        .occ(&["--output", "json", "configuration", "get", "ns1", "cfg"])
        .await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["document"]["meta"]["note"], HOSTILE, "{v}");

    // An Agent table and the API's refusal messages (stderr) are escaped too.
    let agents = api.occ(&["agent", "list", "ns1"]).await;
    assert!(hidden(&agents.stdout).is_empty(), "{}", agents.stdout);
    let refused = api
        .occ(&[
            "configuration",
            "create",
            "ns1",
            "cfg",
            "--file",
            "/nonexistent\u{1b}[2J\u{202e}",
        ])
        .await;
    assert_eq!(refused.code, 1);
    assert!(hidden(&refused.stderr).is_empty(), "{:?}", refused.stderr);
    assert!(
        refused.stderr.contains("\\u{1b}[2J\\u{202e}"),
        "{}",
        refused.stderr
    );
}

/// `--output json` is honoured by every verb: stop, delete and reconcile printed a sentence,
/// `deploy --wait` printed two documents. With `--wait`, stdout carries exactly one document
/// when the wait ends: `{"work": …, "status": …}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_is_one_document_for_every_verb() {
    let api = Api::start().await;
    api.fleet().await;
    let _worker = api.run_worker();
    let one = |run: &Run, what: &str| -> Value {
        assert_eq!(run.code, 0, "{what}: {}{}", run.stdout, run.stderr);
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| {
            panic!("{what} printed not one JSON document ({e}): {}", run.stdout)
        })
    };
    let deployed = one(
        &api.occ(&[
            "--output",
            "json",
            "agent",
            "deploy",
            "ns1",
            "a1",
            "--wait",
            "--timeout",
            "60",
        ])
        .await,
        "deploy --wait",
    );
    assert_eq!(deployed["work"]["state"], "done", "{deployed}");
    assert_eq!(
        deployed["status"]["activeRevisionId"], deployed["work"]["revisionId"],
        "{deployed}"
    );
    let reconciled = one(
        &api.occ(&["--output", "json", "agent", "reconcile", "ns1", "a1"])
            .await,
        "reconcile",
    );
    assert!(reconciled["workId"].is_i64(), "{reconciled}");
    let waited = one(
        &api.occ(&[
            "--output",
            "json",
            "agent",
            "reconcile",
            "ns1",
            "a1",
            "--wait",
            "--timeout",
            "60",
        ])
        .await,
        "reconcile --wait",
    );
    assert_eq!(waited["work"]["state"], "done", "{waited}");
    let stop = one(
        &api.occ(&["--output", "json", "agent", "stop", "ns1", "a1"])
            .await,
        "stop",
    );
    assert!(stop["workId"].is_i64(), "{stop}");
    let stopped = one(
        &api.occ(&[
            "--output",
            "json",
            "agent",
            "stop",
            "ns1",
            "a1",
            "--wait",
            "--timeout",
            "60",
        ])
        .await,
        "stop --wait",
    );
    assert_eq!(stopped["status"]["desiredState"], "stopped", "{stopped}");
    api.admin(
        "POST",
        "/namespaces/ns1/agents",
        Some(json!({"id": "a2", "configurationId": "cfg"})),
    )
    .await;
    let delete = one(
        &api.occ(&["--output", "json", "agent", "delete", "ns1", "a2"])
            .await,
        "delete",
    );
    assert!(delete["workId"].is_i64(), "{delete}");
    // The table form still speaks to people.
    let deleted = api
        .occ(&["agent", "delete", "ns1", "a1", "--wait", "--timeout", "60"])
        .await;
    assert_eq!(deleted.code, 0, "{}{}", deleted.stdout, deleted.stderr);
    assert_eq!(deleted.stdout, "a1: deleted\n");
}

/// A reader that goes away (`occ … | head`) ends occ quietly with 141, as SIGPIPE ends other
/// tools; it used to panic with "failed printing to stdout: Broken pipe" (exit 101).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_occ_quietly() {
    let api = Api::start().await;
    api.fleet().await;
    for args in [
        &["configuration", "get", "ns1", "cfg"][..],
        &["--output", "json", "agent", "list", "ns1"][..],
        &["agent", "list", "ns1"][..],
    ] {
        let mut cmd = api.command(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = tokio::task::spawn_blocking(move || {
            let mut child = cmd.spawn().unwrap();
            // The reader is gone before occ writes anything.
            drop(child.stdout.take());
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

/// Log lines carry no ANSI colour codes when stderr is not a terminal (a pipe, a file, the
/// service's journal); they used to.
#[test]
fn log_lines_have_no_colour_codes_off_a_terminal() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("occ.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nstate_dir = \"{}\"\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let occ = |args: &[&str]| {
        let mut cmd = Command::new(occ_binary());
        cmd.arg("--config")
            .arg(&config)
            .args(args)
            .env("OCC_LOG", "info")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null());
        cmd
    };
    let init = occ(&["init"]).output().unwrap();
    assert!(init.status.success(), "{init:?}");
    let mut serve = occ(&["serve"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    let reader = std::io::BufReader::new(serve.stderr.take().unwrap());
    for line in reader.lines() {
        let line = line.unwrap();
        let done = line.contains("serving the API");
        lines.push(line);
        if done || lines.len() > 200 {
            break;
        }
    }
    // Ours: ended by its pid.
    serve.kill().unwrap();
    serve.wait().unwrap();
    let log = lines.join("\n");
    assert!(log.contains("occ serving"), "no log line: {log}");
    assert!(!log.contains('\u{1b}'), "colour codes in {log:?}");
    // `enrol-command` honours --output json too.
    let enrol = occ(&["--output", "json", "enrol-command"])
        .output()
        .unwrap();
    assert!(enrol.status.success(), "{enrol:?}");
    let v: Value = serde_json::from_slice(&enrol.stdout).unwrap();
    assert!(
        v["command"]
            .as_str()
            .unwrap()
            .starts_with("hostd enrol --ssh-key"),
        "{v}"
    );
}

/// `occ secret`: a value comes from a file or standard input (one trailing newline dropped),
/// never from the command line, and is never printed; list, get, rotate and delete work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occ_secret_takes_values_from_a_file_or_stdin_only() {
    let api = Api::start().await;
    api.fleet().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bot.token");
    std::fs::write(&file, "tok-CLI-VALUE-one\n").unwrap();
    let set = api
        .occ(&[
            "secret",
            "set",
            "ns1",
            "bot",
            "--from-file",
            file.to_str().unwrap(),
        ])
        .await;
    assert_eq!(set.code, 0, "{}", set.stderr);
    assert!(!set.stdout.contains("tok-CLI-VALUE"), "{}", set.stdout);
    let latest = api
        .store
        .latest_secret("ns1", "bot")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        latest.fingerprint,
        clawfleet_protocol::SecretFingerprint::of(b"tok-CLI-VALUE-one"),
        "one trailing newline is dropped"
    );
    // A value on the command line is not an argument occ takes; nothing is stored.
    for args in [
        &["secret", "set", "ns1", "bot", "tok-CLI-VALUE-argv"][..],
        &[
            "secret",
            "set",
            "ns1",
            "bot",
            "--value",
            "tok-CLI-VALUE-argv",
        ][..],
        &["secret", "set", "ns1", "bot"][..],
    ] {
        let r = api.occ(args).await;
        assert_ne!(r.code, 0, "{args:?}");
        assert!(!r.stdout.contains("tok-CLI-VALUE"), "{}", r.stdout);
    }
    assert_eq!(
        api.store.secret_versions("ns1", "bot").await.unwrap().len(),
        1
    );
    // Standard input.
    let mut cmd = api.command(&["secret", "rotate", "ns1", "bot", "--from-stdin"]);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"tok-CLI-VALUE-two\r\n")
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("version 2") && !stdout.contains("tok-CLI-VALUE"),
        "{stdout}"
    );
    assert_eq!(
        api.store
            .latest_secret("ns1", "bot")
            .await
            .unwrap()
            .unwrap()
            .fingerprint,
        clawfleet_protocol::SecretFingerprint::of(b"tok-CLI-VALUE-two")
    );
    let list = api
        .occ(&["secret", "list", "ns1", "--output", "json"])
        .await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    let listed: Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(listed[0]["name"], "bot");
    assert_eq!(listed[0]["version"], 2);
    let get = api.occ(&["secret", "get", "ns1", "bot"]).await;
    assert_eq!(get.code, 0, "{}", get.stderr);
    assert!(get.stdout.contains("sha256:"), "{}", get.stdout);
    let del = api.occ(&["secret", "delete", "ns1", "bot"]).await;
    assert_eq!(del.code, 0, "{}", del.stderr);
    assert!(
        api.store
            .latest_secret("ns1", "bot")
            .await
            .unwrap()
            .is_none()
    );
}
