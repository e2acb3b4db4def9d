//! The shipped roles (`kube-backend/rbac/*.yaml`) grant exactly what `rbac.rs` lists, the one
//! list the registration check uses too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use clawfleet_kube::rbac::{self, Rule};
use serde_json::Value;

/// (group, resource, verb, resourceNames) of every rule.
type Grant = (String, String, String, Vec<String>);

fn from_code(rules: &[Rule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        for res in r.resources {
            for v in r.verbs {
                out.insert((r.api_group.to_owned(), (*res).to_owned(), (*v).to_owned()));
            }
        }
    }
    out
}

fn docs(file: &str) -> Vec<Value> {
    let path = format!("{}/rbac/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str_multiple(&text).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// Every grant of the documents of `kind`.
fn grants(docs: &[Value], kind: &str) -> Vec<Grant> {
    let mut out = Vec::new();
    for d in docs.iter().filter(|d| d["kind"] == kind) {
        for rule in d["rules"].as_array().unwrap() {
            let names = strings(&rule["resourceNames"]);
            for g in strings(&rule["apiGroups"]) {
                for res in strings(&rule["resources"]) {
                    for v in strings(&rule["verbs"]) {
                        out.push((g.clone(), res.clone(), v, names.clone()));
                    }
                }
            }
        }
    }
    out
}

fn unnamed(grants: &[Grant]) -> BTreeSet<(String, String, String)> {
    grants
        .iter()
        .map(|(g, r, v, _)| (g.clone(), r.clone(), v.clone()))
        .collect()
}

#[test]
fn managed_yaml_is_the_managed_list() {
    let d = docs("managed.yaml");
    assert!(grants(&d, "Role").is_empty());
    let g = grants(&d, "ClusterRole");
    assert!(g.iter().all(|(.., names)| names.is_empty()), "{g:?}");
    assert_eq!(unnamed(&g), from_code(&rbac::rules(rbac::MANAGED)));
    // It is bound cluster-wide to the ClusterRole it defines.
    let binding = d
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(binding["roleRef"]["name"], "clawfleet-managed");
}

#[test]
fn adopted_yaml_is_the_adopted_lists() {
    let d = docs("adopted.yaml");
    let role = grants(&d, "Role");
    assert_eq!(
        unnamed(&role),
        from_code(&rbac::rules(rbac::ADOPTED_NAMESPACED))
    );
    let cluster = grants(&d, "ClusterRole");
    assert_eq!(
        unnamed(&cluster),
        from_code(&rbac::rules(rbac::ADOPTED_CLUSTER))
    );
    // Cluster-wide, only reads are unrestricted; the claim's patch names its namespace.
    for (_, res, verb, names) in &cluster {
        assert_eq!(res, "namespaces");
        match verb.as_str() {
            "get" | "list" => assert!(names.is_empty()),
            _ => assert_eq!(names, &["team-a".to_owned()], "{verb}"),
        }
    }
    for kind in ["RoleBinding", "ClusterRoleBinding"] {
        assert!(d.iter().any(|d| d["kind"] == kind), "{kind}");
    }
}
