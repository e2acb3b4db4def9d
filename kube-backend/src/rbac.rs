//! The permissions clawfleet's identity needs on a cluster: the one list the shipped roles
//! (`kube-backend/rbac/*.yaml`, checked against it by a test) and the registration check
//! ([`crate::KubeBackend::missing_access`]) both come from.
//!
//! - Managed namespaces ([`MANAGED`]): a ClusterRole bound cluster-wide. clawfleet creates
//!   and deletes its `oce-…` namespaces and everything in them.
//! - Adopted namespaces ([`ADOPTED_NAMESPACED`] + [`ADOPTED_CLUSTER`]): a Role in each adopted
//!   namespace, and a ClusterRole for what is cluster-scoped: reading namespaces (to find the
//!   claim and refuse a second one) and patching the adopted namespace itself (the claim's
//!   labels; the shipped binding names it with `resourceNames`).

use futures::StreamExt as _;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use crate::client::Requests;
use clawfleet_protocol::failure::Failure;

/// One rule: the verbs on some resources of one API group (`""` is the core group). A
/// resource may name a subresource (`pods/log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub api_group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

const WRITE: &[&str] = &["get", "list", "create", "update", "patch", "delete"];
const READ: &[&str] = &["get", "list"];

/// What clawfleet does inside a tenant namespace (managed or adopted).
const IN_NAMESPACE: &[Rule] = &[
    Rule {
        api_group: "",
        resources: &[
            "configmaps",
            "secrets",
            "services",
            "serviceaccounts",
            "persistentvolumeclaims",
            "resourcequotas",
            "limitranges",
        ],
        verbs: WRITE,
    },
    Rule {
        api_group: "",
        resources: &["pods", "events"],
        verbs: READ,
    },
    Rule {
        api_group: "",
        resources: &["pods/log"],
        verbs: &["get"],
    },
    // The gateway stream (gateway_stream.rs): the API server authorizes a port-forward's
    // WebSocket upgrade (a GET) as `get`, and as `create` too where the
    // AuthorizePodWebsocketUpgradeCreatePermission gate is on (SPDY's POST is `create`).
    Rule {
        api_group: "",
        resources: &["pods/portforward"],
        verbs: &["get", "create"],
    },
    Rule {
        api_group: "apps",
        resources: &["deployments"],
        verbs: WRITE,
    },
    Rule {
        api_group: "apps",
        resources: &["replicasets"],
        verbs: READ,
    },
    Rule {
        api_group: "networking.k8s.io",
        resources: &["networkpolicies"],
        verbs: WRITE,
    },
    Rule {
        api_group: "discovery.k8s.io",
        resources: &["endpointslices"],
        verbs: READ,
    },
];

/// The ClusterRole for managed namespaces (bound with a ClusterRoleBinding): namespaces
/// themselves, then everything inside them.
pub const MANAGED: &[&[Rule]] = &[
    &[Rule {
        api_group: "",
        resources: &["namespaces"],
        verbs: &["get", "list", "create", "patch", "delete"],
    }],
    IN_NAMESPACE,
];

/// The Role in each adopted namespace.
pub const ADOPTED_NAMESPACED: &[&[Rule]] = &[IN_NAMESPACE];

/// The cluster-scoped part for adopted namespaces: read namespaces; `patch` is bound to the
/// adopted namespace only (`resourceNames`) in the shipped role.
pub const ADOPTED_CLUSTER: &[&[Rule]] = &[&[Rule {
    api_group: "",
    resources: &["namespaces"],
    verbs: &["get", "list", "patch"],
}]];

/// Every rule of a role, flattened.
pub fn rules(role: &[&[Rule]]) -> Vec<Rule> {
    role.iter().flat_map(|r| r.iter().copied()).collect()
}

/// One permission to check: a verb on a resource, in a namespace or cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Permission {
    pub(crate) verb: &'static str,
    pub(crate) group: &'static str,
    pub(crate) resource: &'static str,
    pub(crate) subresource: Option<&'static str>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(s) = self.subresource {
            write!(f, "/{s}")?;
        }
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(n) = &self.name {
            write!(f, " {n}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " (in namespace {ns})"),
            None => write!(f, " (cluster-wide)"),
        }
    }
}

/// The permissions `rules` grant, in `namespace` (or cluster-wide), on `name` if given.
pub(crate) fn permissions(
    rules: &[Rule],
    namespace: Option<&str>,
    name: Option<&str>,
) -> Vec<Permission> {
    let mut out = Vec::new();
    for rule in rules {
        for resource in rule.resources {
            let (resource, subresource) = match resource.split_once('/') {
                Some((r, s)) => (r, Some(s)),
                None => (*resource, None),
            };
            for verb in rule.verbs {
                out.push(Permission {
                    verb,
                    group: rule.api_group,
                    resource,
                    subresource,
                    namespace: namespace.map(str::to_owned),
                    name: name.map(str::to_owned),
                });
            }
        }
    }
    out
}

/// How many reviews are in flight at once.
const PARALLEL_REVIEWS: usize = 8;

/// Asks the API server, one SelfSubjectAccessReview per permission, which of `wanted` the
/// credentials lack.
pub(crate) async fn missing(
    r: &Requests,
    wanted: Vec<Permission>,
) -> Result<Vec<Permission>, Failure> {
    let api: Api<SelfSubjectAccessReview> = Api::all(r.client());
    let checks = futures::stream::iter(wanted.into_iter().map(|p| {
        let api = api.clone();
        async move {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some(p.verb.to_owned()),
                        group: Some(p.group.to_owned()),
                        resource: Some(p.resource.to_owned()),
                        subresource: p.subresource.map(str::to_owned),
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            let what = format!("access review ({p})");
            let params = PostParams::default();
            let answer = r.read(&what, || api.create(&params, &review)).await?;
            let allowed = answer.status.is_some_and(|s| s.allowed);
            Ok::<_, Failure>((!allowed).then_some(p))
        }
    }))
    .buffered(PARALLEL_REVIEWS)
    .collect::<Vec<_>>()
    .await;
    let mut out = Vec::new();
    for c in checks {
        if let Some(p) = c? {
            out.push(p);
        }
    }
    Ok(out)
}
