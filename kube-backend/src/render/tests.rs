//! Rendering unit tests: names, labels, selectors, securityContext, probes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::names::Tenant;
use crate::names::{self, is_dns_label};
use clawfleet_protocol::ident::Sha256Hex;
use clawfleet_protocol::operation::RevisionNumber;

fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

fn tn() -> Tenant {
    Tenant::managed(&id("ns-1"))
}

fn ns_ref() -> NamespaceRef {
    NamespaceRef {
        id: id("ns-1"),
        name: id("team"),
    }
}

fn agent() -> AgentRef {
    AgentRef {
        id: id("Agent_One.x"),
        service_principal_id: id("sp-1"),
    }
}

fn rev() -> RevisionRef {
    RevisionRef {
        id: id("rev-7"),
        number: RevisionNumber::new(7).unwrap(),
        configuration_hash: Sha256Hex::new("a".repeat(64)).unwrap(),
    }
}

fn settings() -> ClusterSettings {
    let mut s = ClusterSettings::new(format!("r.example/gw@sha256:{}", "b".repeat(64)));
    s.node_selector.insert("pool".into(), "agents".into());
    s.storage_class = Some("fast".into());
    s.gateway_clients.push(PeerSelector {
        namespace: "ingress".into(),
        pod_labels: BTreeMap::from([("app".into(), "proxy".into())]),
    });
    s
}

fn v<T: serde::Serialize>(o: &T) -> Value {
    serde_json::to_value(o).unwrap()
}

#[test]
fn names_are_stable_dns_labels() {
    let ns = names::tenant_namespace(&id("ns-1"));
    assert!(ns.starts_with("oce-"));
    assert_eq!(ns.len(), 4 + 15);
    // sha256("ns-1") starts with these 15 hex characters.
    let full = clawfleet_protocol::ident::hex(&clawfleet_protocol::ident::sha256(b"ns-1"));
    assert_eq!(&ns[4..], &full[..15]);
    let n = names::agent(&agent().id);
    for name in [
        &n.gateway,
        &n.state,
        &n.password,
        &n.egress,
        &names::revision_config_map(&agent().id, &rev().id),
        &ns,
    ] {
        assert!(is_dns_label(name), "{name}");
    }
    assert_eq!(n, names::agent(&agent().id), "deterministic");
    assert_ne!(n.gateway, names::agent(&id("other")).gateway);
    assert_ne!(
        names::revision_config_map(&agent().id, &id("rev-7")),
        names::revision_config_map(&agent().id, &id("rev-8"))
    );
    let long = id(&"x".repeat(63));
    assert!(is_dns_label(&names::revision_config_map(&long, &long)));
    assert!(names::serving_value(&rev().id).starts_with('r'));
    assert_ne!(names::serving_value(&rev().id), names::INACTIVE);
}

#[test]
fn namespace_is_restricted_and_marked() {
    let n = v(&namespace(&ns_ref()).unwrap());
    let l = &n["metadata"]["labels"];
    assert_eq!(l["pod-security.kubernetes.io/enforce"], "restricted");
    assert_eq!(l["pod-security.kubernetes.io/warn"], "restricted");
    assert_eq!(l[names::MANAGED_BY], "clawfleet");
    assert_eq!(l[names::NAMESPACE_ID], "ns-1");
    assert_eq!(n["metadata"]["annotations"][names::NAMESPACE_ID], "ns-1");
    assert_eq!(n["metadata"]["annotations"][names::NAMESPACE_NAME], "team");
}

#[test]
fn namespace_policies() {
    let s = settings();
    let deny = v(&default_deny(&tn()).unwrap());
    assert_eq!(deny["spec"]["podSelector"], json!({}));
    assert_eq!(deny["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let dns = v(&allow_dns(&tn(), &s).unwrap());
    let to = &dns["spec"]["egress"][0]["to"][0];
    assert_eq!(
        to["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "kube-system"
    );
    assert_eq!(to["podSelector"]["matchLabels"]["k8s-app"], "kube-dns");
    assert_eq!(dns["spec"]["egress"][0]["ports"][0]["port"], 53);
    let ingress = v(&allow_gateway_ingress(&tn(), &s).unwrap());
    assert_eq!(ingress["spec"]["ingress"][0]["ports"][0]["port"], 18789);
    assert_eq!(
        ingress["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app"],
        "proxy"
    );
    let closed = v(&allow_gateway_ingress(&tn(), &ClusterSettings::new("x")).unwrap());
    assert_eq!(closed["spec"]["ingress"], json!([]), "no clients: nobody");
    let q = v(&resource_quota(&tn(), &s).unwrap());
    assert_eq!(q["spec"]["hard"]["pods"], "20");
    let lr = v(&limit_range(&tn(), &s).unwrap());
    assert_eq!(lr["spec"]["limits"][0]["default"]["memory"], "2Gi");
    for o in [&deny, &dns, &ingress, &q, &lr] {
        assert_eq!(
            o["metadata"]["namespace"],
            names::tenant_namespace(&id("ns-1"))
        );
        assert_eq!(o["metadata"]["labels"][names::MANAGED_BY], "clawfleet");
    }
}

#[test]
fn deployment_shape() {
    let s = settings();
    let d = v(&deployment(&tn(), &agent(), &rev(), &s, None).unwrap());
    let n = names::agent(&agent().id);
    assert_eq!(d["metadata"]["name"], n.gateway);
    assert_eq!(d["metadata"]["annotations"][names::REVISION_ID], "rev-7");
    assert_eq!(d["metadata"]["annotations"][names::REVISION_NUMBER], "7");
    assert_eq!(d["metadata"]["labels"][names::AGENT_ID], "Agent_One.x");
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    let sel = &d["spec"]["selector"]["matchLabels"];
    assert_eq!(
        sel,
        &json!({ names::MANAGED_BY: "clawfleet", names::AGENT_ID: "Agent_One.x" })
    );
    let t = &d["spec"]["template"];
    for (k, val) in sel.as_object().unwrap() {
        assert_eq!(
            &t["metadata"]["labels"][k], val,
            "the template matches the selector"
        );
    }
    assert_eq!(
        t["metadata"]["labels"][names::SERVING_REVISION],
        names::serving_value(&rev().id)
    );
    let pod = &t["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["serviceAccountName"], n.gateway);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["nodeSelector"]["pool"], "agents");
    let c = &pod["containers"][0];
    assert_eq!(c["image"], s.gateway_image);
    assert_eq!(
        c["command"],
        json!(["node", "/app/openclaw.mjs", "gateway", "run"])
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    let probe = &c["readinessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/readyz");
    assert_eq!(probe["port"], names::PORT_NAME);
    assert_eq!(c["ports"][0]["containerPort"], 18789);
    assert_eq!(c["ports"][0]["name"], names::PORT_NAME);
    let env: BTreeMap<String, Value> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_owned(), e.clone()))
        .collect();
    assert_eq!(env["HOME"]["value"], STATE_MOUNT);
    assert_eq!(
        env["OPENCLAW_STATE_DIR"]["value"],
        format!("{STATE_MOUNT}/state")
    );
    assert_eq!(
        env["OPENCLAW_CONFIG_PATH"]["value"],
        "/etc/openclaw/openclaw.json"
    );
    assert_eq!(env["OPENCLAW_GATEWAY_PORT"]["value"], "18789");
    let pw = &env["OPENCLAW_GATEWAY_PASSWORD"]["valueFrom"]["secretKeyRef"];
    assert_eq!(pw["name"], n.password);
    assert_eq!(pw["key"], "OPENCLAW_GATEWAY_PASSWORD");
    let volumes = pod["volumes"].as_array().unwrap();
    assert_eq!(
        volumes[0]["configMap"]["name"],
        names::revision_config_map(&agent().id, &rev().id)
    );
    assert_eq!(volumes[1]["persistentVolumeClaim"]["claimName"], n.state);
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert_eq!(mounts[0]["mountPath"], CONFIG_MOUNT);
    assert_eq!(mounts[0]["readOnly"], true);
    assert_eq!(mounts[1]["mountPath"], STATE_MOUNT);
}

#[test]
fn service_stays_inactive_until_activation() {
    let s = settings();
    let inactive = v(&service(&tn(), &agent(), &s, names::INACTIVE).unwrap());
    assert_eq!(
        inactive["spec"]["selector"][names::SERVING_REVISION],
        "inactive"
    );
    assert_eq!(inactive["spec"]["selector"][names::AGENT_ID], "Agent_One.x");
    assert_eq!(inactive["spec"]["ports"][0]["port"], 18789);
    assert_eq!(inactive["spec"]["ports"][0]["targetPort"], names::PORT_NAME);
    let d = v(&deployment(&tn(), &agent(), &rev(), &s, None).unwrap());
    let pod_labels = d["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    let matches = |svc: &Value| {
        svc["spec"]["selector"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, val)| pod_labels.get(k) == Some(val))
    };
    assert!(
        !matches(&inactive),
        "the inactive selector matches no Pod of ours"
    );
    let active = v(&service(&tn(), &agent(), &s, &names::serving_value(&rev().id)).unwrap());
    assert!(
        matches(&active),
        "the active selector matches the revision's Pod"
    );
}

#[test]
fn per_agent_objects() {
    let s = settings();
    let sa = v(&service_account(&tn(), &agent()).unwrap());
    assert_eq!(sa["automountServiceAccountToken"], false);
    assert_eq!(
        sa["metadata"]["annotations"][names::SERVICE_PRINCIPAL_ID],
        "sp-1"
    );
    let pvc = v(&state_claim(&tn(), &agent(), &s).unwrap());
    assert_eq!(pvc["spec"]["storageClassName"], "fast");
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "1Gi");
    let secret = v(&password_secret(&tn(), &agent(), "pw").unwrap());
    assert_eq!(secret["stringData"]["OPENCLAW_GATEWAY_PASSWORD"], "pw");
    let eg = v(&egress_policy(&tn(), &agent(), EGRESS_PORTS).unwrap());
    assert_eq!(eg["spec"]["egress"][0]["ports"][0]["port"], 443);
    assert_eq!(
        eg["spec"]["podSelector"]["matchLabels"][names::AGENT_ID],
        "Agent_One.x"
    );
    let cm = v(&config_map(&tn(), &agent(), &rev(), "{}").unwrap());
    assert_eq!(cm["immutable"], true);
    assert_eq!(cm["data"]["openclaw.json"], "{}");
    assert_eq!(cm["metadata"]["labels"][names::REVISION_ID], "rev-7");
    assert_eq!(
        cm["metadata"]["annotations"][names::CONFIGURATION_HASH],
        "a".repeat(64)
    );
}

/// The cluster's own egress policy is the one every Agent without settings of its own got
/// before issue 28, to the byte.
#[test]
fn the_default_egress_policy_is_unchanged() {
    let got =
        serde_json::to_string(&egress_policy(&tn(), &agent(), EGRESS_PORTS).unwrap()).unwrap();
    let meta = agent_meta(&tn(), &agent(), &names::agent(&agent().id).egress);
    let before: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": { "matchLabels": map(pod_selector(&agent().id)) },
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{ "ipBlock": { "cidr": "0.0.0.0/0", "except": [
                    "10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12",
                    "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8",
                ] } }],
                "ports": [{ "protocol": "TCP", "port": 443 }],
            }],
        },
    }))
    .unwrap();
    assert_eq!(got, serde_json::to_string(&before).unwrap());
    assert!(
        got.contains(r#""ports":[{"port":443,"protocol":"TCP"}]"#),
        "{got}"
    );
}

/// An Agent's narrowing: the ports it keeps, each a TCP rule to public addresses; none at all
/// leaves a policy without an egress rule (only DNS, by the Namespace's policy).
#[test]
fn an_agents_egress_policy_opens_only_its_ports() {
    let two = v(&egress_policy(&tn(), &agent(), &[443, 8443]).unwrap());
    assert_eq!(
        two["spec"]["egress"][0]["ports"],
        json!([{ "protocol": "TCP", "port": 443 }, { "protocol": "TCP", "port": 8443 }])
    );
    assert_eq!(
        two["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"],
        "0.0.0.0/0"
    );
    let none = v(&egress_policy(&tn(), &agent(), &[]).unwrap());
    assert_eq!(none["spec"]["policyTypes"], json!(["Egress"]));
    assert!(none["spec"].get("egress").is_none(), "{none}");
    assert_eq!(
        none["spec"]["podSelector"]["matchLabels"][names::AGENT_ID],
        "Agent_One.x"
    );
    assert_eq!(
        none["metadata"]["name"],
        names::agent(&agent().id).egress.as_str()
    );
}

fn cfg(v: Value) -> Configuration {
    Configuration::new(v).unwrap()
}

#[test]
fn cluster_configuration_listens_on_the_pod_with_password_auth() {
    let host = cfg(json!({
        "gateway": { "mode": "local", "bind": "loopback",
                     "auth": { "mode": "password",
                               "password": { "source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD" } } },
        "update": { "checkOnStart": false },
    }));
    let out: Value = serde_json::from_str(&cluster_configuration(&host).unwrap()).unwrap();
    assert_eq!(out["gateway"]["bind"], "lan");
    assert_eq!(out["gateway"]["mode"], "local");
    assert_eq!(out["gateway"]["auth"]["mode"], "password");
    assert_eq!(out["update"]["checkOnStart"], false);
    let bare: Value =
        serde_json::from_str(&cluster_configuration(&cfg(json!({}))).unwrap()).unwrap();
    assert_eq!(
        bare["gateway"]["auth"]["mode"], "password",
        "password auth is mandatory"
    );
}

#[test]
fn cluster_configuration_refusals_name_the_field() {
    let field = |v: Value| match cluster_configuration(&cfg(v)) {
        Err(RenderError::Refused { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(json!({"gateway": {"auth": {"mode": "trusted-proxy"}}})),
        "gateway.auth.mode"
    );
    assert_eq!(
        field(json!({"gateway": {"auth": {"mode": "none"}}})),
        "gateway.auth.mode"
    );
    assert_eq!(
        field(json!({"gateway": {"auth": {"trustedProxy": {"userHeader": "x"}}}})),
        "gateway.auth.trustedProxy"
    );
    assert_eq!(
        field(json!({"gateway": {"trustedProxies": ["10.0.0.1"]}})),
        "gateway.trustedProxies"
    );
    assert_eq!(
        field(json!({"gateway": {"bind": "tailnet"}})),
        "gateway.bind"
    );
    assert_eq!(field(json!({"gateway": {"port": 1}})), "gateway.port");
    assert_eq!(
        field(json!({"gateway": {"auth": {"password": "hunter2"}}})),
        "gateway.auth.password"
    );
    assert_eq!(
        field(json!({"gateway": {"mode": "remote"}})),
        "gateway.mode"
    );
    assert_eq!(
        field(json!({"gateway": {"tls": {"enabled": true}}})),
        "gateway.tls.enabled"
    );
}

/// Issue 27 item 4: the Deployment carries the fingerprint of the template it was rendered
/// with; the same template read back matches it, and each foreign edit is named.
#[test]
fn the_workload_fingerprint_names_each_foreign_edit() {
    use k8s_openapi::api::core::v1::Container;
    let d = deployment(&tn(), &agent(), &rev(), &settings(), None).unwrap();
    let text = d.metadata.annotations.as_ref().unwrap()[names::WORKLOAD_FINGERPRINT].clone();
    let applied = WorkloadFingerprint::from_text(&text).unwrap();
    assert_eq!(applied, workload_fingerprint(&d));
    assert_eq!(applied.differences(&workload_fingerprint(&d)), None);

    let edit = |f: &dyn Fn(&mut Vec<Container>)| {
        let mut e = d.clone();
        let spec = e.spec.template.spec.as_mut().unwrap();
        f(&mut spec.containers);
        applied.differences(&workload_fingerprint(&e))
    };
    let swapped = edit(&|c| c[0].image = Some("evil.example/gw:latest".into())).unwrap();
    assert_eq!(swapped, "container gateway: image changed");
    let command = edit(&|c| c[0].command = Some(vec!["sh".into(), "-c".into(), "x".into()]));
    assert_eq!(command.unwrap(), "container gateway: command changed");
    let sidecar = edit(&|c| {
        c.push(Container {
            name: "sidecar".into(),
            image: Some("busybox".into()),
            ..Container::default()
        })
    });
    assert_eq!(sidecar.unwrap(), "container sidecar was added");
    let removed = edit(&|c| c[0].name = "other".into()).unwrap();
    assert!(
        removed.contains("container gateway was removed"),
        "{removed}"
    );
    // Values never appear in the words.
    assert!(!swapped.contains("evil"), "{swapped}");
    assert_eq!(WorkloadFingerprint::from_text("not json"), None);
}

/// Issue 29: the coordinator's per-secret file providers become the one managed exec
/// provider on a cluster, and each reference refers to it by the secret's name; a provider
/// clawfleet did not render is refused, naming it.
#[test]
fn cluster_configuration_resolves_secrets_through_the_exec_provider() {
    let host = cfg(json!({
        "channels": { "slack": {
            "botToken": { "source": "file", "provider": "clawfleet-slack-bot", "id": "value" },
            "appToken": { "source": "file", "provider": "clawfleet-slack-app", "id": "value" },
        } },
        "models": { "providers": { "x": { "apiKey":
            { "source": "env", "provider": "default", "id": "X_KEY" } } } },
        "secrets": { "providers": {
            "clawfleet-slack-bot": { "source": "file", "path": "/run/clawfleet/secrets/slack-bot", "mode": "singleValue" },
            "clawfleet-slack-app": { "source": "file", "path": "/run/clawfleet/secrets/slack-app", "mode": "singleValue" },
        } },
    }));
    let text = cluster_configuration(&host).unwrap();
    assert!(crate::secrets::binds_secrets(&text));
    let out: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        out["secrets"]["providers"],
        json!({ "clawfleet": {
            "source": "exec", "command": "/run/clawfleet/bin/clawfleet-secrets",
            "jsonOnly": true, "timeoutMs": 10000, "trustedDirs": ["/run/clawfleet/bin"],
        } })
    );
    assert_eq!(
        out["channels"]["slack"]["botToken"],
        json!({"source": "exec", "provider": "clawfleet", "id": "slack-bot"})
    );
    assert_eq!(
        out["channels"]["slack"]["appToken"],
        json!({"source": "exec", "provider": "clawfleet", "id": "slack-app"})
    );
    assert_eq!(
        out["models"]["providers"]["x"]["apiKey"]["source"], "env",
        "other references stay"
    );
    let plain = cluster_configuration(&cfg(json!({}))).unwrap();
    assert!(!crate::secrets::binds_secrets(&plain));
    for bad in [
        json!({"secrets": {"providers": {"vault": {"source": "exec", "command": "/bin/x"}}}}),
        json!({"secrets": {"providers": {"clawfleet-a": {"source": "file", "path": "/etc/passwd", "mode": "singleValue"}}}}),
    ] {
        match cluster_configuration(&cfg(bad)) {
            Err(RenderError::Refused { field, .. }) => {
                assert!(field.starts_with("secrets.providers."), "{field}")
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Issue 29: a Pod whose configuration binds secrets mounts the Agent's Secret read-only as
/// a volume (never env), and an init container installs the resolver into a memory emptyDir
/// the gateway mounts read-only; the template's revision may differ from the activated one.
#[test]
fn a_pod_binding_secrets_mounts_them_and_installs_the_resolver() {
    let older = RevisionRef {
        id: id("rev-6"),
        number: RevisionNumber::new(6).unwrap(),
        configuration_hash: Sha256Hex::new("a".repeat(64)).unwrap(),
    };
    let template = Template {
        revision: &older,
        secrets: true,
    };
    let d = v(&deployment_for(&tn(), &agent(), &rev(), template, &settings(), None).unwrap());
    let n = names::agent(&agent().id);
    assert_eq!(d["metadata"]["annotations"][names::REVISION_ID], "rev-7");
    assert_eq!(
        d["metadata"]["annotations"][names::POD_REVISION_ID],
        "rev-6"
    );
    let t = &d["spec"]["template"];
    assert_eq!(t["metadata"]["labels"][names::REVISION_ID], "rev-6");
    assert_eq!(
        t["metadata"]["labels"][names::SERVING_REVISION],
        names::serving_value(&id("rev-6"))
    );
    let pod = &t["spec"];
    let volumes = pod["volumes"].as_array().unwrap();
    assert!(volumes.iter().any(|v| v["configMap"]["name"]
        == names::revision_config_map(&agent().id, &id("rev-6")).as_str()));
    let secret = volumes
        .iter()
        .find(|v| v["name"] == crate::secrets::VOLUME)
        .unwrap();
    assert_eq!(secret["secret"]["secretName"], n.secrets.as_str());
    assert_eq!(secret["secret"]["defaultMode"], 0o440);
    let resolver = volumes
        .iter()
        .find(|v| v["name"] == crate::secrets::RESOLVER_VOLUME)
        .unwrap();
    assert_eq!(resolver["emptyDir"]["medium"], "Memory");
    let gw = &pod["containers"][0];
    let mounts = gw["volumeMounts"].as_array().unwrap();
    for (name, path) in [
        (crate::secrets::VOLUME, "/run/clawfleet/secrets"),
        (crate::secrets::RESOLVER_VOLUME, "/run/clawfleet/bin"),
    ] {
        let m = mounts.iter().find(|m| m["name"] == name).unwrap();
        assert_eq!(m["mountPath"], path);
        assert_eq!(m["readOnly"], true);
    }
    assert!(gw.get("envFrom").is_none());
    assert!(
        !gw["env"].to_string().contains(&n.secrets),
        "no env var refers to the secrets Secret"
    );
    let init = &pod["initContainers"][0];
    assert_eq!(init["name"], crate::secrets::INIT_CONTAINER);
    assert_eq!(init["securityContext"], gw["securityContext"]);
    let script = init["command"][2].as_str().unwrap();
    assert!(script.contains("command -v node") && script.contains("chmod 500"));
    assert!(script.contains(crate::secrets::RESOLVER_SOURCE));
    // Without secrets: no volume, no init container.
    let plain = v(&deployment(&tn(), &agent(), &rev(), &settings(), None).unwrap());
    assert!(plain["spec"]["template"]["spec"]["initContainers"].is_null());
    assert!(!plain.to_string().contains(&n.secrets));
}

/// The values never show in a secrets set's `Debug`, and the Secret's annotations carry
/// fingerprints only.
#[test]
fn a_secrets_secret_holds_values_in_data_only() {
    use crate::secrets::{AgentSecrets, SecretValue, VERSIONS};
    let value = "xoxb-unit-value-1234";
    let set = AgentSecrets {
        namespace: ns_ref(),
        agent: agent(),
        secrets: vec![SecretValue {
            name: clawfleet_protocol::SecretName::new("slack-bot").unwrap(),
            version: 3,
            fingerprint: clawfleet_protocol::SecretFingerprint::of(value.as_bytes()),
            value: zeroize::Zeroizing::new(value.as_bytes().to_vec()),
        }],
    };
    assert!(set.check().is_ok());
    assert!(!format!("{set:?}").contains(value));
    let s = crate::secrets::secret(&tn(), &agent(), &set).unwrap();
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    assert_eq!(s.data.as_ref().unwrap()["slack-bot"].0, value.as_bytes());
    assert!(!serde_json::to_string(&s.metadata).unwrap().contains(value));
    assert!(s.metadata.annotations.as_ref().unwrap()[VERSIONS].contains("sha256:"));
    let mut wrong = set;
    wrong.secrets[0].fingerprint = clawfleet_protocol::SecretFingerprint::of(b"other");
    let (field, message) = wrong.check().unwrap_err();
    assert_eq!(field, "secrets[0].fingerprint");
    assert!(!message.contains(value));
}
