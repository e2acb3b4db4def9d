//! End to end on a mixed fleet (issue 12): one `occ serve` drives a host-pool Namespace on a
//! real test host and a cluster Namespace on the project's real Kubernetes control plane
//! (etcd, kube-apiserver, controller manager, scheduler, kwok), deploying to both at once.
//! Everything goes through `occ`: `occ cluster add` with the control plane's kubeconfig,
//! `occ namespace create --cluster`, deploy with `--wait`, replace, stop twice, deploy again,
//! delete an Agent, delete the Namespace; at each phase the cluster's objects are compared with
//! what the design says (read with the control plane's admin client). No container runs here
//! (kwok marks Pods Ready); see k8s-tests/README.md for what this tier does not prove.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "fleet_support/mod.rs"]
pub mod fleet;

use std::process::Output;
use std::time::{Duration, Instant};

use clawfleet_k8s_tests::{ControlPlane, Tier, TierCluster};
use fleet::{Fleet, NS, document};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}

const CLUSTER_NS: &str = "team-k";
const IMAGE: &str = "registry.invalid/openclaw/gateway@sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    )
}

fn occ_code(fleet: &Fleet, args: &[&str]) -> (i32, String) {
    let out = fleet.occ(args);
    (out.status.code().unwrap_or(-1), text(&out))
}

fn write_doc(fleet: &Fleet, name: &str, doc: &Value) -> String {
    let path = fleet.dir.path().join(format!("{name}.json"));
    std::fs::write(&path, doc.to_string()).unwrap();
    path.display().to_string()
}

/// The tenant namespace clawfleet made for a Namespace (found by label, never guessed).
async fn tenant_namespace(client: &kube::Client) -> Option<String> {
    let api: Api<Namespace> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=clawfleet"))
        .await
        .unwrap();
    list.items
        .into_iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .find_map(|n| n.metadata.name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_fleet_host_pool_and_cluster_through_occ() {
    mixed_fleet(Tier::Kwok).await;
}

/// The same on the real node: the cluster's Agents are the test gateway really running in
/// Pods (Ready by their readiness probe, the workspace written by a real init container), next
/// to the host's. The Pod-log part (kwok serves the control plane's log files) and the codes
/// and API faults (kwok's markers, a killed apiserver) stay on the kwok tier; e2e_pods covers
/// real logs, a crash loop and a missing image on the real node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_fleet_host_pool_and_cluster_on_the_real_node() {
    mixed_fleet(Tier::RealNode).await;
}

async fn mixed_fleet(tier: Tier) {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    if let Some(reason) = tier.skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let cp = TierCluster::start(tier).await.expect("the tier's cluster");
    let client = cp.client().await.unwrap();
    // clawfleet's identity holds the shipped least-privilege ClusterRole only.
    let kubeconfig = cp.backend_kubeconfig_path().display().to_string();
    let mut fleet = tokio::task::spawn_blocking(|| Fleet::start(1))
        .await
        .unwrap();
    let fleet_ref = &fleet;
    let cluster_name = tier.name();

    // Register the cluster: validated, probed, stored without credentials in any answer. On
    // the kwok tier with `--gateway-image`, on the real node with `--settings` (the test
    // gateway's image by digest, its command, the node's StorageClass and label).
    let settings_file = write_doc(fleet_ref, "settings", &cp.settings_json(IMAGE, None));
    let image_args: [&str; 2] = match tier {
        Tier::Kwok => ["--gateway-image", IMAGE],
        Tier::RealNode => ["--settings", &settings_file],
    };
    let (code, out) = occ_code(
        fleet_ref,
        &[
            "--output",
            "json",
            "cluster",
            "add",
            cluster_name,
            "--kubeconfig",
            &kubeconfig,
            image_args[0],
            image_args[1],
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        !out.contains(cp.backend_token()),
        "a credential was printed"
    );
    let listed = fleet_ref.occ_json(&["cluster", "list"]);
    assert!(!listed.to_string().contains(cp.backend_token()));
    fleet_ref.occ_ok(&["namespace", "create", CLUSTER_NS, "--cluster", cluster_name]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ns = fleet_ref
            .api
            .request("GET", &format!("/namespaces/{CLUSTER_NS}"), None)
            .unwrap();
        if ns["ready"] == json!(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cluster Namespace not ready: {ns}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tenant = tenant_namespace(&client).await.expect("a tenant namespace");
    assert!(tenant.starts_with("oce-"), "{tenant}");

    // Two Agents on the cluster and one on the host, deployed at once.
    let doc = write_doc(fleet_ref, "k1", &json!({}));
    fleet_ref.occ_ok(&["configuration", "create", CLUSTER_NS, "cfg", "--file", &doc]);
    fleet_ref.occ_ok(&[
        "agent",
        "create",
        CLUSTER_NS,
        "k1",
        "--configuration",
        "cfg",
    ]);
    // k2 has an initial workspace file (a Secret and an init container on the cluster).
    let agents_md = fleet_ref.dir.path().join("agents.md");
    std::fs::write(&agents_md, "# k2 agents\n").unwrap();
    fleet_ref.occ_ok(&[
        "agent",
        "create",
        CLUSTER_NS,
        "k2",
        "--configuration",
        "cfg",
        "--workspace-file",
        &format!("AGENTS.md={}", agents_md.display()),
    ]);
    fleet_ref.create_agent("h1", &document("v1", json!({})));
    let started = Instant::now();
    let results: Vec<(i32, String)> = std::thread::scope(|s| {
        let jobs: Vec<_> = [(CLUSTER_NS, "k1"), (CLUSTER_NS, "k2"), (NS, "h1")]
            .into_iter()
            .map(|(ns, a)| {
                s.spawn(move || {
                    occ_code(
                        fleet_ref,
                        &["agent", "deploy", ns, a, "--wait", "--timeout", "300"],
                    )
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for (code, out) in &results {
        assert_eq!(*code, 0, "{out}");
    }
    eprintln!(
        "3 Agents (2 on the cluster, 1 on the host) deployed at once in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    let services: Api<Service> = Api::namespaced(client.clone(), &tenant);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &tenant);
    let list = deployments.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2, "one Deployment per Agent");
    for d in &list.items {
        let status = d.status.clone().unwrap_or_default();
        assert_eq!(status.ready_replicas, Some(1), "{:?}", d.metadata.name);
        assert_eq!(
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/managed-by"))
                .map(String::as_str),
            Some("clawfleet")
        );
    }
    assert_eq!(
        services
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    let status = fleet_ref.status("h1").unwrap();
    assert_eq!(status["converged"], true, "{status}");
    // k2's workspace file: applied by its Pod's init container, its content gone from the
    // coordinator and from the cluster, its name kept.
    let w = fleet_ref.occ_json(&["agent", "workspace", CLUSTER_NS, "k2"]);
    assert_eq!(w["state"], "applied", "{w}");
    assert_eq!(w["files"][0]["name"], "AGENTS.md", "{w}");
    assert_eq!(w["files"][0]["contentHeld"], false, "{w}");
    let k2 = deployments
        .get(&clawfleet_kube::names::agent(&clawfleet_protocol::Ident::new("k2").unwrap()).gateway)
        .await
        .unwrap();
    let k2 = serde_json::to_value(&k2).unwrap();
    let init = k2["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(init.len(), 1, "k2's Pod has the workspace init container");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &tenant);
    let ws = secrets
        .get(
            &clawfleet_kube::names::agent(&clawfleet_protocol::Ident::new("k2").unwrap()).workspace,
        )
        .await
        .unwrap();
    assert_eq!(
        ws.data.unwrap().len(),
        1,
        "only the manifest stays on the cluster"
    );

    // Replace k1 with revision 2; the old revision's ConfigMap goes after success.
    let cms_before = configmaps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    let doc2 = write_doc(fleet_ref, "k1-v2", &json!({"logging": {"level": "debug"}}));
    fleet_ref.occ_ok(&[
        "configuration",
        "update",
        CLUSTER_NS,
        "cfg",
        "--file",
        &doc2,
    ]);
    let (code, out) = occ_code(
        fleet_ref,
        &[
            "agent",
            "deploy",
            CLUSTER_NS,
            "k1",
            "--wait",
            "--timeout",
            "300",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let s = fleet_ref
        .api
        .request(
            "GET",
            &format!("/namespaces/{CLUSTER_NS}/agents/k1/deployment-status"),
            None,
        )
        .unwrap();
    assert_eq!(rev_num(s["servedRevisionId"].as_str()), Some(2), "{s}");
    assert_eq!(s["revisions"][0]["status"], "retired", "{s}");
    // Runtime through the same route as on hosts: the Pod, its state and restarts.
    let rt = fleet_ref.occ_json(&["agent", "runtime", CLUSTER_NS, "k1"]);
    assert_eq!(rt["workload"]["kind"], "pod", "{rt}");
    assert_eq!(rt["workload"]["activeState"], "Running", "{rt}");
    assert_eq!(rt["workload"]["restarts"], 0, "{rt}");
    assert_eq!(
        rev_num(rt["observation"]["served"].as_str()),
        Some(2),
        "{rt}"
    );
    assert!(rt["events"].is_array(), "{rt}");
    // On the real node the logs are the gateway's own (e2e_pods reads them there).
    if tier == Tier::Kwok {
        // Pod logs through the API server (kwok serves them from the control plane's log files),
        // redacted with the Agent's own password from its Secret, paged by cursor, and the
        // previous container's log.
        let tenant = tenant_namespace(&client).await.expect("a tenant namespace");
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &tenant);
        let password = secrets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("gw-password-"))
            })
            .find_map(|s| s.data?.into_values().next())
            .map(|v| String::from_utf8(v.0).unwrap())
            .expect("a password Secret");
        cp.append_pod_log(&[
            "Authorization: Bearer abcdefghijklmnop0123456789",
            &format!("cluster password {password} leaked"),
            "k8s line 1",
            "k8s line 2",
            "k8s line 3",
        ])
        .unwrap();
        let out = fleet_ref.occ_ok(&["agent", "logs", CLUSTER_NS, "k1", "--tail", "100"]);
        assert!(
            !out.contains(&password) && !out.contains("abcdefghijklmnop0123456789"),
            "{out}"
        );
        for kept in [
            "Authorization: Bearer [REDACTED]",
            "cluster password [REDACTED] leaked",
            "k8s line 3",
        ] {
            assert!(out.contains(kept), "{kept} missing: {out}");
        }
        let mut seen = Vec::new();
        let mut query = "sinceSeconds=3600&limit=2".to_owned();
        for _ in 0..20 {
            let page = fleet_ref
                .api
                .request(
                    "GET",
                    &format!("/namespaces/{CLUSTER_NS}/agents/k1/runtime/logs?{query}"),
                    None,
                )
                .unwrap();
            for e in page["entries"].as_array().unwrap() {
                seen.push(e["message"].as_str().unwrap().to_owned());
            }
            if page["more"] != true {
                break;
            }
            let cursor = coordinator::client::percent_encode(page["cursor"].as_str().unwrap());
            query = format!("cursor={cursor}&limit=2");
        }
        let k8s_lines: Vec<&String> = seen.iter().filter(|l| l.starts_with("k8s line")).collect();
        assert_eq!(
            k8s_lines,
            ["k8s line 1", "k8s line 2", "k8s line 3"],
            "{seen:?}"
        );
        cp.append_previous_pod_log(&["the container before the restart"])
            .unwrap();
        let prev = fleet_ref.occ_ok(&["agent", "logs", CLUSTER_NS, "k1", "--previous"]);
        assert!(
            prev.contains("the container before the restart") && !prev.contains("k8s line"),
            "{prev}"
        );
    }
    // The drift sweep covers clusters too.
    let rows = fleet_ref.occ_json(&["drift", "--now"]);
    let k1 = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["namespaceId"] == CLUSTER_NS && r["agentId"] == "k1")
        .cloned()
        .unwrap_or_else(|| panic!("no drift row for k1: {rows}"));
    assert_eq!(k1["state"], "synced", "{rows}");
    assert_eq!(k1["target"], cluster_name, "{rows}");
    let cms_after = configmaps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(cms_after, cms_before, "rev-2's ConfigMap replaced rev-1's");

    // Stop twice, then deploy again.
    for _ in 0..2 {
        let (code, out) = occ_code(
            fleet_ref,
            &[
                "agent",
                "stop",
                CLUSTER_NS,
                "k2",
                "--wait",
                "--timeout",
                "300",
            ],
        );
        assert_eq!(code, 0, "{out}");
    }
    assert_eq!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1,
        "the stopped Agent's Deployment is gone"
    );
    let (code, out) = occ_code(
        fleet_ref,
        &[
            "agent",
            "deploy",
            CLUSTER_NS,
            "k2",
            "--wait",
            "--timeout",
            "300",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // Delete both cluster Agents, then the Namespace (waits for termination).
    for a in ["k1", "k2"] {
        let (code, out) = occ_code(
            fleet_ref,
            &[
                "agent",
                "delete",
                CLUSTER_NS,
                a,
                "--wait",
                "--timeout",
                "300",
            ],
        );
        assert_eq!(code, 0, "{out}");
    }
    assert!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    fleet_ref.occ_ok(&["namespace", "delete", CLUSTER_NS]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let gone = fleet_ref
            .api
            .request("GET", &format!("/namespaces/{CLUSTER_NS}"), None)
            .is_err();
        if gone && tenant_namespace(&client).await.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster Namespace was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The cluster is free again: it can be forgotten.
    fleet_ref.occ_ok(&["cluster", "remove", cluster_name]);
    if tier == Tier::RealNode {
        // The codes and faults below need kwok's markers and a killable apiserver.
        fleet.kill_serve();
        cp.finish("mixed fleet").await.unwrap();
        return;
    }

    // Codes a cluster gives, each shown in `occ agent status`: the same control plane
    // registered once more, its settings replaced (`occ cluster update`) by ones that cannot
    // work, case by case (a second registration of one API server is refused).
    let pulls_fail = IMAGE.replace("openclaw/gateway", "openclaw/fail-pull");
    let cases = [
        (
            "pull",
            json!({"gatewayImage": pulls_fail}),
            "REVISION_IMAGE_PULL_FAILED",
        ),
        (
            "quota",
            json!({"gatewayImage": IMAGE, "quota": {"pods": 0}}),
            "NAMESPACE_POD_QUOTA_EXCEEDED",
        ),
        (
            "nosched",
            json!({"gatewayImage": IMAGE, "nodeSelector": {"clawfleet.dev/nowhere": "true"}}),
            "REVISION_UNSCHEDULABLE",
        ),
    ];
    let cluster = "kwok-codes";
    let mut verb = "add";
    for (name, settings, code) in cases {
        let file = write_doc(fleet_ref, &format!("settings-{name}"), &settings);
        fleet_ref.occ_ok(&[
            "cluster",
            verb,
            cluster,
            "--kubeconfig",
            &kubeconfig,
            "--settings",
            &file,
        ]);
        verb = "update";
        let ns = format!("codes-{name}");
        fleet_ref.occ_ok(&["namespace", "create", &ns, "--cluster", cluster]);
        let doc = write_doc(fleet_ref, &format!("doc-{name}"), &json!({}));
        fleet_ref.occ_ok(&["configuration", "create", &ns, "cfg", "--file", &doc]);
        fleet_ref.occ_ok(&["agent", "create", &ns, "a", "--configuration", "cfg"]);
        fleet_ref.occ_ok(&["agent", "deploy", &ns, "a"]);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let table = fleet_ref.occ_ok(&["agent", "status", &ns, "a"]);
            if table.contains(code) {
                break;
            }
            assert!(Instant::now() < deadline, "{code} never shown: {table}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let s = fleet_ref
            .api
            .request(
                "GET",
                &format!("/namespaces/{ns}/agents/a/deployment-status"),
                None,
            )
            .unwrap();
        assert!(s["servedRevisionId"].is_null(), "{s}");
        // The blocker's evidence: its code and the Pod's state, without a second request.
        let failure = &s["revisions"][0]["runtimeFailure"];
        assert_eq!(failure["code"], code, "{s}");
        assert_eq!(failure["check"], "rollout", "{s}");
        assert!(failure["events"].is_array(), "{s}");
        let (code_rc, out) = occ_code(
            fleet_ref,
            &["agent", "delete", &ns, "a", "--wait", "--timeout", "300"],
        );
        assert_eq!(code_rc, 0, "{out}");
        fleet_ref.occ_ok(&["namespace", "delete", &ns]);
    }

    // Faults. The apiserver killed mid-deploy: KUBERNETES_API_UNAVAILABLE is shown, and once it
    // is back the deploy converges without a new request.
    let settings = write_doc(&fleet, "settings-faults", &json!({"gatewayImage": IMAGE}));
    fleet.occ_ok(&["cluster", "update", cluster, "--settings", &settings]);
    fleet.occ_ok(&["namespace", "create", "faults", "--cluster", cluster]);
    let doc = write_doc(&fleet, "doc-faults", &json!({}));
    fleet.occ_ok(&["configuration", "create", "faults", "cfg", "--file", &doc]);
    fleet.occ_ok(&["agent", "create", "faults", "a", "--configuration", "cfg"]);
    let wait_status = |fleet: &Fleet, what: &str, done: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let s = fleet
                .api
                .request("GET", "/namespaces/faults/agents/a/deployment-status", None)
                .unwrap();
            if done(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what}: {s}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_status(&fleet, "the faults Namespace never became ready", &|_| {
        fleet
            .api
            .request("GET", "/namespaces/faults", None)
            .is_ok_and(|n| n["ready"] == json!(true))
    });
    cp.kill_apiserver().unwrap();
    fleet.occ_ok(&["agent", "deploy", "faults", "a"]);
    wait_status(&fleet, "KUBERNETES_API_UNAVAILABLE never shown", &|s| {
        s["lastCode"] == "KUBERNETES_API_UNAVAILABLE"
    });
    cp.start_apiserver().await.unwrap();
    let s = wait_status(
        &fleet,
        "no convergence after the apiserver came back",
        &|s| s["converged"] == json!(true),
    );
    assert_eq!(rev_num(s["servedRevisionId"].as_str()), Some(1), "{s}");

    // `occ serve` SIGKILLed mid-deploy: after a restart the deploy converges.
    let doc2 = write_doc(
        &fleet,
        "doc-faults-2",
        &json!({"logging": {"level": "debug"}}),
    );
    fleet.occ_ok(&["configuration", "update", "faults", "cfg", "--file", &doc2]);
    fleet.occ_ok(&["agent", "deploy", "faults", "a"]);
    std::thread::sleep(Duration::from_millis(150));
    fleet.kill_serve();
    fleet.start_serve();
    let s = wait_status(&fleet, "no convergence after occ serve was killed", &|s| {
        s["converged"] == json!(true)
    });
    assert_eq!(rev_num(s["servedRevisionId"].as_str()), Some(2), "{s}");
    let (code, out) = occ_code(
        &fleet,
        &[
            "agent",
            "delete",
            "faults",
            "a",
            "--wait",
            "--timeout",
            "300",
        ],
    );
    assert_eq!(code, 0, "{out}");
    fleet.kill_serve();
}

/// Every file under `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file()
                && let Ok(bytes) = std::fs::read(&p)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

/// Issue 29 on a cluster, through `occ` only (control plane, no host): a secret set with
/// `occ secret set` and bound in a configuration reaches the Agent's Secret on the cluster,
/// mounted as a volume; `occ secret rotate` updates that Secret in place and, the Pod kept,
/// asks its gateway to reload: kwok runs none, so the canary fails, the rollout halts naming
/// the Agent, the same Pod serves the same revision, and the Secret holds version 1 again. Neither
/// value is found anywhere but in the Agent's Secret: not in the coordinator's database files,
/// its logs, the audit table, any API answer or `occ` output, nor in any other object of the
/// tenant namespace (ConfigMaps, the Deployment, events).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_secrets_rotate_in_place_and_leak_nowhere() {
    if let Some(reason) = clawfleet_k8s_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    const V1: &str = "xoxb-kube-leak-first-5e7c1a";
    const V2: &str = "xoxb-kube-leak-second-8d2f4b";
    const KNS: &str = "team-s";
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let kubeconfig = cp.backend_kubeconfig_path().display().to_string();
    let fleet = tokio::task::spawn_blocking(|| Fleet::start(0))
        .await
        .unwrap();
    let f = &fleet;
    let mut said = String::new();
    said += &f.occ_ok(&[
        "cluster",
        "add",
        "kwok",
        "--kubeconfig",
        &kubeconfig,
        "--gateway-image",
        IMAGE,
    ]);
    said += &f.occ_ok(&["namespace", "create", KNS, "--cluster", "kwok"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while f
        .api
        .request("GET", &format!("/namespaces/{KNS}"), None)
        .map(|n| n["ready"] != json!(true))
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "the Namespace never became ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let value_file = f.dir.path().join("value");
    std::fs::write(&value_file, format!("{V1}\n")).unwrap();
    let vf = value_file.display().to_string();
    said += &f.occ_ok(&["secret", "set", KNS, "slack-bot", "--from-file", &vf]);
    let doc = write_doc(
        f,
        "s1",
        &json!({"channels": {"slack": {"botToken":
            {"source": "file", "provider": "clawfleet", "id": "slack-bot"}}}}),
    );
    said += &f.occ_ok(&["configuration", "create", KNS, "cfg", "--file", &doc]);
    said += &f.occ_ok(&["agent", "create", KNS, "s1", "--configuration", "cfg"]);
    let (code, out) = occ_code(
        f,
        &["agent", "deploy", KNS, "s1", "--wait", "--timeout", "300"],
    );
    assert_eq!(code, 0, "{out}");
    said += &out;

    let tenant = tenant_namespace(&client).await.expect("a tenant namespace");
    let agent = clawfleet_kube::names::agent(&clawfleet_protocol::Ident::new("s1").unwrap());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &tenant);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &tenant);
    let held =
        |s: &Secret| String::from_utf8(s.data.as_ref().unwrap()["slack-bot"].0.clone()).unwrap();
    let s = secrets.get(&agent.secrets).await.unwrap();
    assert_eq!(
        held(&s),
        V1,
        "the trailing newline is dropped, the value kept"
    );
    let d = deployments.get(&agent.gateway).await.unwrap();
    let template = d.spec.template.clone();
    let pod_uids = || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|p| p.metadata.uid)
            .collect::<Vec<_>>()
    };
    let before = pod_uids().await;
    assert_eq!(before.len(), 1, "{before:?}");
    // The cluster reports what the Agent's Secret records (versions, fingerprints): drift
    // compares it with what the active revision binds.
    let drift_of_s1 = |f: &Fleet| {
        let rows = f.occ_json(&["drift", "--now"]);
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["namespaceId"] == KNS && r["agentId"] == "s1")
            .cloned()
            .unwrap_or_else(|| panic!("no drift row for s1: {rows}"))
    };
    let row = drift_of_s1(f);
    assert_eq!(row["state"], "synced", "{row}");
    // A Secret put back from an old backup records other versions: drift names them.
    let recorded =
        s.metadata.annotations.as_ref().unwrap()["clawfleet.dev/secret-versions"].clone();
    let other_fp = clawfleet_protocol::SecretFingerprint::of(b"an older value");
    let restored_from_backup = recorded.replace(
        clawfleet_protocol::SecretFingerprint::of(V1.as_bytes()).as_str(),
        other_fp.as_str(),
    );
    assert_ne!(restored_from_backup, recorded);
    let patch = |versions: &str| json!({"metadata": {"annotations": {"clawfleet.dev/secret-versions": versions}}});
    secrets
        .patch(
            &agent.secrets,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch(&restored_from_backup)),
        )
        .await
        .unwrap();
    let row = drift_of_s1(f);
    println!("drift after the Secret's record changed: {row}");
    assert_eq!(row["reason"], "secrets-changed", "{row}");
    assert!(
        row["message"]
            .as_str()
            .unwrap_or("")
            .contains(other_fp.as_str()),
        "{row}"
    );
    secrets
        .patch(
            &agent.secrets,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch(&recorded)),
        )
        .await
        .unwrap();
    assert_eq!(drift_of_s1(f)["state"], "synced");

    let rev1 = f
        .api
        .request(
            "GET",
            &format!("/namespaces/{KNS}/agents/s1/deployment-status"),
            None,
        )
        .unwrap()["servedRevisionId"]
        .as_str()
        .unwrap_or_else(|| panic!("nothing served"))
        .to_owned();

    // The rotation: version 2, a revision binding it, the Secret changed in place, the Pod
    // kept, and the running gateway asked to reload through the API server's port-forward.
    // kwok's Pod runs no gateway and kwok forwards no port, so here the reload is refused:
    // the canary fails, the rollout halts naming the Agent, the Agent keeps serving its
    // revision with the same Pod, and its Secret holds version 1 again (what a Pod started
    // later must read). The real-node tier (`e2e_pods.rs`) shows the reload holding.
    std::fs::write(&value_file, format!("{V2}\n")).unwrap();
    let rotated = f.occ(&[
        "secret",
        "rotate",
        KNS,
        "slack-bot",
        "--from-file",
        &vf,
        "--wait",
        "--timeout",
        "120",
        "--output",
        "json",
    ]);
    let out = String::from_utf8_lossy(&rotated.stdout).to_string();
    let err = String::from_utf8_lossy(&rotated.stderr).to_string();
    said += &out;
    said += &err;
    assert_ne!(rotated.status.code(), Some(0), "{out}\n{err}");
    let rotated: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!(
        rotated["rollout"]["secret"]["name"], "slack-bot",
        "{rotated}"
    );
    assert_eq!(rotated["rollout"]["state"], "halted", "{rotated}");
    assert_eq!(
        rotated["rollout"]["agents"][0]["agentId"], "s1",
        "{rotated}"
    );
    assert_eq!(
        rotated["rollout"]["agents"][0]["code"], "SECRET_RELOAD_FAILED",
        "{rotated}"
    );
    assert!(
        rotated["rollout"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("s1"),
        "the halt does not name the canary: {rotated}"
    );
    let rev2 = rotated["rollout"]["agents"][0]["revisionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{rotated}"))
        .to_owned();
    assert_ne!(rev2, rev1);
    let st = f
        .api
        .request(
            "GET",
            &format!("/namespaces/{KNS}/agents/s1/deployment-status"),
            None,
        )
        .unwrap();
    said += &st.to_string();
    assert_eq!(st["servedRevisionId"], json!(rev1), "{st}");
    let s = secrets.get(&agent.secrets).await.unwrap();
    assert_eq!(
        held(&s),
        V1,
        "the refused version stays in the Agent's Secret"
    );
    // The revision records the version and fingerprint it was made with, as on hosts, and
    // the Secret's annotation the served one's: never the value.
    let r2 = f
        .api
        .request(
            "GET",
            &format!("/namespaces/{KNS}/agents/s1/revisions/{rev2}"),
            None,
        )
        .unwrap();
    let fp1 = clawfleet_protocol::SecretFingerprint::of(V1.as_bytes());
    let fp2 = clawfleet_protocol::SecretFingerprint::of(V2.as_bytes());
    assert_eq!(r2["secrets"][0]["version"], 2, "{r2}");
    assert_eq!(r2["secrets"][0]["fingerprint"], fp2.as_str(), "{r2}");
    let versions = &s.metadata.annotations.as_ref().unwrap()["clawfleet.dev/secret-versions"];
    assert!(versions.contains(fp1.as_str()), "{versions}");
    assert!(!versions.contains(fp2.as_str()), "{versions}");
    let d = deployments.get(&agent.gateway).await.unwrap();
    assert_eq!(d.spec.template, template, "the Pod template changed");
    assert_eq!(pod_uids().await, before, "the rotation made a new Pod");
    // Drift: the cluster serves the revision before the refused one.
    let row = drift_of_s1(f);
    said += &row.to_string();
    assert_eq!(row["reason"], "current-changed", "{row}");
    let message = row["message"].as_str().unwrap_or("");
    assert!(message.contains(&rev1) && message.contains(&rev2), "{row}");

    // API answers and occ output: every read an operator or a tool makes.
    for path in [
        format!("/namespaces/{KNS}"),
        format!("/namespaces/{KNS}/secrets"),
        format!("/namespaces/{KNS}/secrets/slack-bot"),
        format!("/namespaces/{KNS}/agents"),
        format!("/namespaces/{KNS}/agents/s1"),
        format!("/namespaces/{KNS}/agents/s1/deployment-status"),
        format!("/namespaces/{KNS}/agents/s1/revisions"),
        format!("/namespaces/{KNS}/configurations/cfg"),
        "/audit?limit=1000".to_owned(),
        "/clusters".to_owned(),
    ] {
        if let Ok(v) = f.api.request("GET", &path, None) {
            said += &v.to_string();
        }
    }
    said += &f.occ_ok(&["--output", "json", "agent", "runtime", KNS, "s1"]);
    for v in [V1, V2] {
        assert!(!said.contains(v), "a value in an API answer or occ output");
        // The coordinator's files: its database (and WAL), its logs, its configuration.
        let found = files_containing(f.dir.path(), v.as_bytes());
        let found: Vec<_> = found
            .into_iter()
            .filter(|p| !p.ends_with("/value"))
            .collect();
        assert!(
            found.is_empty(),
            "a value in the coordinator's files: {found:?}"
        );
    }
    // The audit table was read above (every event, through the API), and holds the
    // secret's events.
    assert!(
        said.contains("secret.set"),
        "no secret event in the audit answer"
    );
    // The cluster: only the Agent's Secret holds the value.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &tenant);
    let mut objects =
        serde_json::to_string(&configmaps.list(&ListParams::default()).await.unwrap()).unwrap();
    objects +=
        &serde_json::to_string(&deployments.list(&ListParams::default()).await.unwrap()).unwrap();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &tenant);
    objects += &serde_json::to_string(&events.list(&ListParams::default()).await.unwrap()).unwrap();
    for s in secrets.list(&ListParams::default()).await.unwrap().items {
        if s.metadata.name.as_deref() != Some(agent.secrets.as_str()) {
            objects += &serde_json::to_string(&s).unwrap();
        } else {
            objects += &serde_json::to_string(&s.metadata).unwrap();
        }
    }
    for v in [V1, V2] {
        assert!(
            !objects.contains(v),
            "a value in a cluster object other than the Secret's data"
        );
    }

    // Deleting the Agent deletes its Secret.
    f.occ_ok(&["agent", "delete", KNS, "s1"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while secrets.get_opt(&agent.secrets).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the Agent's Secret stays after its deletion"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
