//! Kubeconfig validation: every refused case names its field; secrets never show.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use clawfleet_kube::{
    ClusterAuth, ClusterCredentials, KubeconfigError, parse_kubeconfig, parse_kubeconfig_file,
};
use serde_json::{Value, json};

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBkTCB+wIJAKHHIG11QWERTYUIOPASDFGHJKLZXCVBNM1234567890abcd\n-----END CERTIFICATE-----\n";
const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBCERTIFICATEBODYFORTHECLIENTAAAAA\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvSECRETKEYMATERIALDONOTPRINTAAAA\n-----END PRIVATE KEY-----\n";
const TOKEN: &str = "s3cr3t-token-value";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn doc(cluster: Value, user: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{ "name": "c", "cluster": cluster }],
        "users": [{ "name": "u", "user": user }],
        "contexts": [{ "name": "ctx", "context": { "cluster": "c", "user": "u" } }],
        "current-context": "ctx",
    })
}

fn good_cluster() -> Value {
    json!({ "server": "https://127.0.0.1:6443", "certificate-authority-data": b64(CA) })
}

fn parse(v: &Value) -> Result<ClusterCredentials, KubeconfigError> {
    parse_kubeconfig(&v.to_string(), None)
}

fn refused_field(v: &Value) -> String {
    match parse(v) {
        Err(KubeconfigError::Refused { field, .. }) => field,
        Err(KubeconfigError::Unreadable { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn token_and_client_certificate_are_accepted() {
    let creds = parse(&doc(good_cluster(), json!({ "token": TOKEN }))).unwrap();
    assert_eq!(creds.server(), "https://127.0.0.1:6443");
    assert_eq!(creds.context(), "ctx");
    assert_eq!(creds.auth().kind(), "token");
    assert!(creds.ca_fingerprint().starts_with("SHA256:"));
    let creds = parse(&doc(
        good_cluster(),
        json!({ "client-certificate-data": b64(CERT), "client-key-data": b64(KEY) }),
    ))
    .unwrap();
    assert!(matches!(
        creds.auth(),
        ClusterAuth::ClientCertificate { .. }
    ));
    // YAML works as well as JSON.
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://k.example:443\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {TOKEN}\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\ncurrent-context: ctx\n",
        b64(CA)
    );
    parse_kubeconfig(&yaml, None).unwrap();
}

#[test]
fn secrets_never_show_in_debug_or_display() {
    for user in [
        json!({ "token": TOKEN }),
        json!({ "client-certificate-data": b64(CERT), "client-key-data": b64(KEY) }),
    ] {
        let creds = parse(&doc(good_cluster(), user)).unwrap();
        for text in [
            format!("{creds:?}"),
            format!("{creds}"),
            format!("{:?}", creds.auth()),
        ] {
            assert!(!text.contains(TOKEN), "{text}");
            assert!(!text.contains("SECRETKEY"), "{text}");
            assert!(!text.contains("CERTIFICATEBODY"), "{text}");
        }
    }
}

#[test]
fn stored_form_round_trips_and_revalidates() {
    let creds = parse(&doc(good_cluster(), json!({ "token": TOKEN }))).unwrap();
    let stored = serde_json::to_value(&creds).unwrap();
    let back: ClusterCredentials = serde_json::from_value(stored.clone()).unwrap();
    assert_eq!(back, creds);
    let mut bad = stored;
    bad["server"] = json!("http://127.0.0.1:6443");
    assert!(serde_json::from_value::<ClusterCredentials>(bad).is_err());
}

#[test]
fn files_are_read_now_and_embedded() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), CA).unwrap();
    std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(dir.path().join("client.crt"), CERT).unwrap();
    std::fs::write(dir.path().join("client.key"), KEY).unwrap();
    let cluster = json!({ "server": "https://127.0.0.1:6443", "certificate-authority": "ca.crt" });
    let path = dir.path().join("config");
    std::fs::write(
        &path,
        doc(cluster.clone(), json!({ "tokenFile": "token" })).to_string(),
    )
    .unwrap();
    let creds = parse_kubeconfig_file(&path, None).unwrap();
    assert_eq!(creds.ca_pem(), CA);
    assert_eq!(
        creds.auth(),
        &ClusterAuth::Token {
            token: TOKEN.to_owned()
        }
    );
    std::fs::write(
        &path,
        doc(
            cluster.clone(),
            json!({ "client-certificate": "client.crt", "client-key": "client.key" }),
        )
        .to_string(),
    )
    .unwrap();
    let creds = parse_kubeconfig_file(&path, None).unwrap();
    assert_eq!(creds.auth().kind(), "client-certificate");
    // Removing the files afterwards changes nothing: they were embedded.
    drop(dir);
    assert_eq!(creds.ca_pem(), CA);
}

#[test]
fn each_bad_case_names_its_field() {
    let c = "clusters[name=c].cluster";
    let u = "users[name=u].user";
    let token = json!({ "token": TOKEN });
    let cases: Vec<(Value, String)> = vec![
        (
            doc(
                json!({ "server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": true, "certificate-authority-data": b64(CA) }),
                token.clone(),
            ),
            format!("{c}.insecure-skip-tls-verify"),
        ),
        (
            doc(
                json!({ "server": "http://127.0.0.1:6443", "certificate-authority-data": b64(CA) }),
                token.clone(),
            ),
            format!("{c}.server"),
        ),
        (
            doc(
                json!({ "server": "https://admin:hunter2@127.0.0.1:6443", "certificate-authority-data": b64(CA) }),
                token.clone(),
            ),
            format!("{c}.server"),
        ),
        (
            doc(json!({ "server": "https://127.0.0.1:6443" }), token.clone()),
            format!("{c}.certificate-authority-data"),
        ),
        (
            doc(
                json!({ "server": "https://127.0.0.1:6443", "certificate-authority-data": b64("not pem") }),
                token.clone(),
            ),
            format!("{c}.certificate-authority-data"),
        ),
        (
            doc(
                json!({ "server": "https://127.0.0.1:6443", "certificate-authority": "/nonexistent/ca.crt" }),
                token.clone(),
            ),
            format!("{c}.certificate-authority"),
        ),
        (
            doc(
                json!({ "server": "https://127.0.0.1:6443", "certificate-authority-data": b64(CA), "proxy-url": "http://p:3128" }),
                token.clone(),
            ),
            format!("{c}.proxy-url"),
        ),
        (
            doc(
                good_cluster(),
                json!({ "exec": { "apiVersion": "client.authentication.k8s.io/v1", "command": "aws" } }),
            ),
            format!("{u}.exec"),
        ),
        (
            doc(
                good_cluster(),
                json!({ "auth-provider": { "name": "gcp", "config": {} } }),
            ),
            format!("{u}.auth-provider"),
        ),
        (
            doc(
                good_cluster(),
                json!({ "username": "admin", "password": "hunter2" }),
            ),
            format!("{u}.username"),
        ),
        (
            doc(good_cluster(), json!({ "password": "hunter2" })),
            format!("{u}.password"),
        ),
        (
            doc(good_cluster(), json!({ "tokenFile": "/nonexistent/token" })),
            format!("{u}.tokenFile"),
        ),
        (
            doc(
                good_cluster(),
                json!({ "as": "someone-else", "token": TOKEN }),
            ),
            format!("{u}.as"),
        ),
        (
            doc(
                good_cluster(),
                json!({ "client-certificate-data": b64(CERT) }),
            ),
            format!("{u}.client-key-data"),
        ),
        (
            doc(good_cluster(), json!({ "client-key-data": b64(KEY) })),
            format!("{u}.client-certificate-data"),
        ),
        (doc(good_cluster(), json!({})), u.to_owned()),
    ];
    for (v, field) in cases {
        let got = refused_field(&v);
        assert_eq!(got, field, "for {v}");
        let message = parse(&v).unwrap_err().to_string();
        assert!(message.contains(&field), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        assert!(!message.contains(TOKEN), "{message}");
    }
}

#[test]
fn missing_context_cluster_or_user_is_named() {
    let mut v = doc(good_cluster(), json!({ "token": TOKEN }));
    assert!(matches!(
        parse_kubeconfig(&v.to_string(), Some("nope")),
        Err(KubeconfigError::MissingContext(c)) if c == "nope"
    ));
    v["current-context"] = json!("");
    assert_eq!(parse(&v).unwrap_err(), KubeconfigError::NoCurrentContext);
    let mut v = doc(good_cluster(), json!({ "token": TOKEN }));
    v["contexts"][0]["context"]["cluster"] = json!("other");
    let e = parse(&v).unwrap_err();
    assert!(
        e.to_string().contains("contexts[name=ctx].context.cluster"),
        "{e}"
    );
    let mut v = doc(good_cluster(), json!({ "token": TOKEN }));
    v["contexts"][0]["context"]["user"] = json!("ghost");
    let e = parse(&v).unwrap_err();
    assert!(
        e.to_string().contains("contexts[name=ctx].context.user"),
        "{e}"
    );
    let mut v = doc(good_cluster(), json!({ "token": TOKEN }));
    v["contexts"][0]["context"]
        .as_object_mut()
        .unwrap()
        .remove("user");
    let e = parse(&v).unwrap_err();
    assert!(matches!(e, KubeconfigError::NoUser(_)), "{e}");
}

/// Issue 26 N1: text received by the coordinator names no file it would read. Every path
/// field is refused, naming the field and never the path (whether it exists is not told).
#[test]
fn file_references_in_received_text_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("admin.token");
    std::fs::write(&secret, "coordinator-admin-secret").unwrap();
    let s = secret.display().to_string();
    let c = "clusters[name=c].cluster";
    let u = "users[name=u].user";
    let cert = json!({ "client-certificate": s, "client-key-data": b64(KEY) });
    let key = json!({ "client-certificate-data": b64(CERT), "client-key": s });
    let cases = [
        (
            doc(good_cluster(), json!({ "tokenFile": s })),
            format!("{u}.tokenFile"),
        ),
        (doc(good_cluster(), cert), format!("{u}.client-certificate")),
        (doc(good_cluster(), key), format!("{u}.client-key")),
        (
            doc(
                json!({ "server": "https://127.0.0.1:6443", "certificate-authority": s }),
                json!({ "token": TOKEN }),
            ),
            format!("{c}.certificate-authority"),
        ),
        (
            doc(good_cluster(), json!({ "tokenFile": "/dev/zero" })),
            format!("{u}.tokenFile"),
        ),
        (
            doc(good_cluster(), json!({ "tokenFile": "/nonexistent/x" })),
            format!("{u}.tokenFile"),
        ),
    ];
    for (v, field) in cases {
        match parse(&v) {
            Err(e @ KubeconfigError::Refused { .. }) => {
                let text = e.to_string();
                assert!(text.contains(&field), "{text}");
                assert!(text.contains("occ cluster add"), "{text}");
                assert!(!text.contains(&s) && !text.contains("/dev/zero"), "{text}");
                assert!(!text.contains("/nonexistent"), "{text}");
            }
            other => panic!("{field}: expected a refusal, got {other:?}"),
        }
    }
}

/// What `occ cluster add` sends: the files read on the operator's machine (relative to the
/// kubeconfig's directory, as kubectl does), inlined; the result passes the coordinator's
/// file-refusing parser with the same credentials. Reads are bounded: `/dev/zero` and a file
/// over the limit fail at once, naming the field and the path.
#[test]
fn the_cli_inlines_file_references_with_bounded_reads() {
    use clawfleet_kube::inline_kubeconfig_file;
    use clawfleet_kube::kubeconfig::MAX_FILE_BYTES;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("certs")).unwrap();
    std::fs::write(dir.path().join("certs/ca.crt"), CA).unwrap();
    std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(dir.path().join("client.crt"), CERT).unwrap();
    std::fs::write(dir.path().join("client.key"), KEY).unwrap();
    let cluster =
        json!({ "server": "https://127.0.0.1:6443", "certificate-authority": "certs/ca.crt" });
    let path = dir.path().join("config");
    // Run from elsewhere: relative paths are the kubeconfig's, not the working directory's.
    for user in [
        json!({ "tokenFile": "token" }),
        json!({ "client-certificate": "client.crt", "client-key": "client.key" }),
    ] {
        std::fs::write(&path, doc(cluster.clone(), user).to_string()).unwrap();
        let text = inline_kubeconfig_file(&path, None).unwrap();
        for field in [
            "\"tokenFile\"",
            "\"certificate-authority\"",
            "\"client-certificate\"",
            "\"client-key\"",
        ] {
            assert!(!text.contains(field), "{field} still sent: {text}");
        }
        let sent = parse_kubeconfig(&text, None).unwrap();
        assert_eq!(sent, parse_kubeconfig_file(&path, None).unwrap());
        assert_eq!(sent.ca_pem(), CA);
        assert_eq!(sent.context(), "ctx");
    }
    std::fs::write(
        dir.path().join("big"),
        vec![b'a'; MAX_FILE_BYTES as usize + 1],
    )
    .unwrap();
    for (file, shown) in [
        ("/dev/zero", "/dev/zero".to_owned()),
        ("big", dir.path().join("big").display().to_string()),
    ] {
        std::fs::write(
            &path,
            doc(cluster.clone(), json!({ "tokenFile": file })).to_string(),
        )
        .unwrap();
        let started = std::time::Instant::now();
        match inline_kubeconfig_file(&path, None) {
            Err(e @ KubeconfigError::Unreadable { .. }) => {
                let text = e.to_string();
                assert!(text.contains("users[name=u].user.tokenFile"), "{text}");
                assert!(text.contains(&shown), "{text}");
                assert!(text.contains("larger than"), "{text}");
            }
            other => panic!("{file}: expected Unreadable, got {other:?}"),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }
}

/// Issue 27 N2: a token no HTTP header can carry is refused at registration, naming the
/// field, instead of panicking later when the client is built; stored credentials holding
/// one do not decode either.
#[test]
fn a_token_with_a_newline_is_refused() {
    for token in ["abc\ndef", "abc\rdef", "abc\u{1}def"] {
        assert_eq!(
            refused_field(&doc(good_cluster(), json!({ "token": token }))),
            "users[name=u].user.token",
            "{token:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "abc\ndef\n").unwrap();
    let path = dir.path().join("config");
    std::fs::write(
        &path,
        doc(good_cluster(), json!({ "tokenFile": "token" })).to_string(),
    )
    .unwrap();
    assert!(matches!(
        parse_kubeconfig_file(&path, None),
        Err(KubeconfigError::Refused { field, .. }) if field == "users[name=u].user.tokenFile"
    ));
    let creds = parse(&doc(good_cluster(), json!({ "token": TOKEN }))).unwrap();
    let mut stored = serde_json::to_value(&creds).unwrap();
    stored["auth"]["token"] = json!("abc\ndef");
    assert!(serde_json::from_value::<ClusterCredentials>(stored).is_err());
}
