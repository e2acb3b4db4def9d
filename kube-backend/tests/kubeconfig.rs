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
