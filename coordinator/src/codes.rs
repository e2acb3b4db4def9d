//! Every stable code the coordinator itself emits, from one table: API refusals, work
//! outcomes and transport failures. Codes from hostd and the Kubernetes backend are the
//! protocol's `FailureCode`s and pass through unchanged. `/openapi.json` lists both sets, and
//! `codes_are_only_written_here` in this file's tests refuses a code literal anywhere else
//! in `coordinator/src`.

macro_rules! codes {
    ($( $variant:ident = $text:literal, $doc:literal; )*) => {
        /// A stable code of the coordinator.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $( #[doc = $doc] $variant, )*
        }

        impl Code {
            /// Every code, in table order.
            pub const ALL: &'static [Code] = &[$(Code::$variant),*];

            /// The code as it travels (`SCREAMING_SNAKE_CASE`).
            pub fn as_str(self) -> &'static str {
                match self { $( Code::$variant => $text, )* }
            }

            /// What the code means.
            pub fn describe(self) -> &'static str {
                match self { $( Code::$variant => $doc, )* }
            }

            /// The code of that text, if it is one of the coordinator's.
            pub fn parse(s: &str) -> Option<Code> {
                match s { $( $text => Some(Code::$variant), )* _ => None }
            }
        }

        impl std::fmt::Display for Code {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

codes! {
    // Requests.
    Unauthenticated = "UNAUTHENTICATED", "No, an unknown, a revoked or an expired token.";
    Forbidden = "FORBIDDEN", "The token lacks the route's role for the Namespace.";
    NotFound = "NOT_FOUND", "The named resource does not exist.";
    NoSuchRoute = "NO_SUCH_ROUTE", "No route has this path.";
    MethodNotAllowed = "METHOD_NOT_ALLOWED", "The route does not take this method.";
    UnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE", "Request bodies must be JSON.";
    InvalidRequest = "INVALID_REQUEST", "The framework refused the request (the message says why).";
    InvalidBody = "INVALID_BODY", "The body is not the JSON the route takes; the message names the field.";
    UnexpectedBody = "UNEXPECTED_BODY", "The route takes no body.";
    InvalidQuery = "INVALID_QUERY", "A query parameter is unknown or not of its type; the message names it.";
    BodyTooLarge = "BODY_TOO_LARGE", "The body is over the 1 MiB limit.";
    RequestTimeout = "REQUEST_TIMEOUT", "The request was not completed within the request timeout.";
    ServerBusy = "SERVER_BUSY", "Too many requests in progress; retry after a second.";
    InternalError = "INTERNAL_ERROR", "The coordinator failed; its log says why.";
    StoreFailure = "STORE_FAILURE", "The state store failed; the coordinator log says why.";
    DatabaseUnavailable = "DATABASE_UNAVAILABLE", "The database cannot be reached right now (a restart or a lost connection); nothing was stored; retry.";
    TokenFailure = "TOKEN_FAILURE", "A token could not be created (randomness or store).";
    HttpError = "HTTP_ERROR", "The client got an HTTP error without the API's error body.";
    InvalidIdentifier = "INVALID_IDENTIFIER", "An id is outside the identifier charset or length.";
    InvalidAddress = "INVALID_ADDRESS", "A host address is not a host name or IP address.";
    InvalidPort = "INVALID_PORT", "A port is out of range.";
    InvalidCapacity = "INVALID_CAPACITY", "A host's maxAgents is out of range.";
    InvalidHostKey = "INVALID_HOST_KEY", "A host key is not one OpenSSH ed25519 public key.";
    InvalidHostAccess = "INVALID_HOST_ACCESS", "A host's login user or jump host is not usable.";
    InvalidExpiry = "INVALID_EXPIRY", "A token's expiresAt is not in the future.";
    DuplicateGrant = "DUPLICATE_GRANT", "A token names one Namespace in two grants.";
    HostExists = "HOST_EXISTS", "A host of that name is enrolled.";
    HostNameMismatch = "HOST_NAME_MISMATCH", "hostd at that address answers to another host name (host_name in its hostd.toml, else /etc/hostname); the message names both.";
    HostInUse = "HOST_IN_USE", "A Namespace's pool names the host.";
    UnknownHost = "UNKNOWN_HOST", "The host is not enrolled, or the token may not choose it.";
    EmptyPool = "EMPTY_POOL", "A Namespace needs a host pool or a cluster.";
    HostDedicated = "HOST_DEDICATED", "The host is in a single-tenant pool, or a single-tenant pool names a host another Namespace uses.";
    HostNotIsolated = "HOST_NOT_ISOLATED", "The host cannot isolate the networks of Agents of different Namespaces (its probe's networkIsolation says what is missing), and another Namespace uses it.";
    SingleTenantInvalid = "SINGLE_TENANT_INVALID", "singleTenant applies to host pools only.";
    BackendAmbiguous = "BACKEND_AMBIGUOUS", "A Namespace names both hosts and a cluster.";
    UnknownCluster = "UNKNOWN_CLUSTER", "The cluster is not registered, or the token may not choose it.";
    ClusterExists = "CLUSTER_EXISTS", "A cluster of that name is registered.";
    ClusterInUse = "CLUSTER_IN_USE", "A Namespace uses the cluster.";
    ClusterDuplicate = "CLUSTER_DUPLICATE", "The API server (its URL and CA) is already registered under another name; the message names it.";
    ClusterAccessInsufficient = "CLUSTER_ACCESS_INSUFFICIENT", "The kubeconfig's identity lacks a permission clawfleet needs on the cluster; the message names the verb and resource (kube-backend/rbac/ has the roles to bind).";
    ClusterSettingsInvalid = "CLUSTER_SETTINGS_INVALID", "The cluster settings are invalid; the message names the field.";
    KubeconfigInvalid = "KUBECONFIG_INVALID", "The kubeconfig is invalid; the message names the field.";
    NamespaceExists = "NAMESPACE_EXISTS", "A Namespace of that id exists.";
    NamespaceDeleting = "NAMESPACE_DELETING", "The Namespace is being deleted.";
    NamespaceNotEmpty = "NAMESPACE_NOT_EMPTY", "The Namespace still has Agents (hostd answers the same code for the same condition on a host).";
    ConfigurationExists = "CONFIGURATION_EXISTS", "A Configuration of that id exists.";
    ConfigurationRefused = "CONFIGURATION_REFUSED", "The configuration document cannot be deployed; the message names the field.";
    UnknownConfiguration = "UNKNOWN_CONFIGURATION", "The Agent names a Configuration that does not exist.";
    UnknownSecret = "UNKNOWN_SECRET", "A configuration refers to a secret its Namespace does not have; the message names the field.";
    InvalidSecretName = "INVALID_SECRET_NAME", "A secret's name is outside its charset or length.";
    InvalidSecretValue = "INVALID_SECRET_VALUE", "A secret's value is empty, too large, not UTF-8, holds a NUL or ends with a newline; nothing was stored.";
    SecretInUse = "SECRET_IN_USE", "The secret is bound by Agents' current revisions; the message names them.";
    SecretVersionGone = "SECRET_VERSION_GONE", "A revision binds a secret version the store no longer holds (deleted since); deploy again to bind a current version.";
    SecretSealFailed = "SECRET_SEAL_FAILED", "A secret cannot be sealed to the target host's pinned key (secrets are sealed only to ssh-ed25519 host keys); re-enrol the host with its ed25519 key.";
    InvalidHarness = "INVALID_HARNESS", "The Agent's harness is not the embedded one.";
    HarnessAuthUnsupported = "HARNESS_AUTH_UNSUPPORTED", "The harness authentication method is not supported.";
    AgentExists = "AGENT_EXISTS", "An Agent of that id exists.";
    InvalidWorkspaceFile = "INVALID_WORKSPACE_FILE", "An initial workspace file is refused (its name, size, the count or total, or its encoding); the message names the file.";
    AgentDeleting = "AGENT_DELETING", "The Agent is being deleted.";
    AgentNotPlaced = "AGENT_NOT_PLACED", "The Agent was never placed on a host, so it has no runtime or log yet.";
    InvalidLogQuery = "INVALID_LOG_QUERY", "A log request's parameters are out of range or combined wrongly; the message names the parameter.";
    NothingToReconcile = "NOTHING_TO_RECONCILE", "The Agent is not meant to run or has no active revision, so there is nothing to re-apply.";
    InvalidRollout = "INVALID_ROLLOUT", "A rollout's settings are out of range or combined wrongly; the message names the field.";
    RolloutEmpty = "ROLLOUT_EMPTY", "The rollout selects no Agent (none uses the Configuration, or --agents named none).";
    RolloutInProgress = "ROLLOUT_IN_PROGRESS", "The Agent is in a rollout that is not finished; deploy or reconfigure it once the rollout is done, halted or aborted.";
    RolloutStateConflict = "ROLLOUT_STATE_CONFLICT", "The rollout is not in a state that allows this (pause a running one, resume a paused one, promote one waiting, abort one not finished).";
    PlanStale = "PLAN_STALE", "The plan token no longer matches: a Configuration generation or an Agent's active revision moved since the plan; plan again.";
    InvalidPlanToken = "INVALID_PLAN_TOKEN", "The plan token is not one the coordinator issues (plan1- and 32 hex digits).";
    RateLimited = "RATE_LIMITED", "The token is over one of its limits (requests in progress, requests per minute, reads of hosts and clusters per minute); retry after the Retry-After seconds.";
    // Work outcomes.
    CallInProgress = "CALL_IN_PROGRESS", "A host or cluster call of the work has not answered for a few seconds (a slow hostd or Kubernetes API); the message names the operation, the target and how long. The call's outcome replaces it.";
    NamespaceReady = "NAMESPACE_READY", "The Namespace is ready on its pool or cluster.";
    NamespaceNotReady = "NAMESPACE_NOT_READY", "The Agent waits for its Namespace to become ready.";
    NamespaceDeleted = "NAMESPACE_DELETED", "The Namespace was removed from its pool or cluster.";
    NamespaceGone = "NAMESPACE_GONE", "The Namespace was deleted while its work waited.";
    NoHostAvailable = "NO_HOST_AVAILABLE", "No pool host has room for the Agent.";
    RevisionActivated = "REVISION_ACTIVATED", "The revision serves.";
    RevisionStopped = "REVISION_STOPPED", "The Agent is stopped.";
    RevisionRestored = "REVISION_RESTORED", "The candidate did not become ready; the target put the last served revision back and it serves again (restore: last-served).";
    RevisionSuperseded = "REVISION_SUPERSEDED", "A newer revision took this one's place.";
    RevisionGone = "REVISION_GONE", "The revision was deleted while its work waited.";
    RevisionFinalizationIncomplete = "REVISION_FINALIZATION_INCOMPLETE", "The revision serves but retiring its predecessor is not done yet.";
    StopIncomplete = "STOP_INCOMPLETE", "The stop ran but the host or cluster still reports the Agent's gateway running (or serving); the stop is retried until it is observed stopped.";
    StopSuperseded = "STOP_SUPERSEDED", "The Agent is meant to run again; the stop was dropped.";
    AgentGone = "AGENT_GONE", "The Agent was deleted while its work waited.";
    AgentDeleted = "AGENT_DELETED", "The Agent was removed from its host or cluster.";
    ConvergenceDeadlineExceeded = "CONVERGENCE_DEADLINE_EXCEEDED", "The work did not converge within the convergence deadline.";
    InvalidStoredId = "INVALID_STORED_ID", "Stored data is no longer valid (the database was edited): the store names the column it cannot read.";
    InvalidState = "INVALID_STATE", "The stored state is inconsistent (the message says where).";
    InvalidWork = "INVALID_WORK", "A work item lacks what its kind needs.";
    InvalidHostResult = "INVALID_HOST_RESULT", "The host answered with a result of another operation.";
    StoreUnavailable = "STORE_UNAVAILABLE", "The store failed during work; the worker retries.";
    ClaimLost = "CLAIM_LOST", "This coordinator's claim on the work item was replaced (its lease lapsed and another coordinator took the item), or a target refused its operation as fenced off; it stopped acting on the item and recorded nothing.";
    RolloutHalted = "ROLLOUT_HALTED", "The rollout's failure budget was spent; this Agent was not deployed.";
    RolloutAborted = "ROLLOUT_ABORTED", "The rollout was aborted before this Agent's turn; it was not deployed.";
    // Transport.
    HostUnreachable = "HOST_UNREACHABLE", "The host or cluster could not be reached.";
    HostKeyMismatch = "HOST_KEY_MISMATCH", "The host's SSH key is not the pinned one.";
    HostAuthRefused = "HOST_AUTH_REFUSED", "The host refused the coordinator's SSH login.";
    BackendUnsupported = "BACKEND_UNSUPPORTED", "The target's backend does not support the operation.";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_parse_back_and_do_not_collide_with_the_protocols() {
        // The same condition as the protocol's code of the same text, found by the
        // coordinator before it asks a host.
        const SHARED: &[Code] = &[Code::NamespaceNotEmpty];
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_str()), "{c} twice");
            assert_eq!(Code::parse(c.as_str()), Some(*c));
            let in_protocol = clawfleet_protocol::failure::FailureCode::ALL
                .iter()
                .any(|f| f.as_str() == c.as_str());
            assert_eq!(
                in_protocol,
                SHARED.contains(c),
                "{c}: a protocol code too, but not listed as the same condition"
            );
        }
    }

    /// Codes no test produces, each with the reason; a new code must come with a test that
    /// produces it.
    const NOT_YET_TESTED: &[&str] = &[
        // reserved: emitted only if the compiled-in `worker::HARNESS_VERSION` were not a valid
        // `HarnessVersion` (`worker::revision_spec`), and every deploy in the tests sends it.
        // An Agent names no harness of its own, and another harness selected in a
        // configuration is refused as CONFIGURATION_REFUSED when it is rendered, so no request
        // or stored state can produce it.
        "INVALID_HARNESS",
    ];

    /// Every code is named by a test (`tests/`, or a test module in `src/`), or listed in
    /// [`NOT_YET_TESTED`]; a listed code that a test now names must leave the list.
    #[test]
    fn every_code_is_produced_by_a_test_or_listed() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut text = String::new();
        let mut stack = vec![root.join("tests"), root.join("src")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("codes.rs")
                {
                    let t = std::fs::read_to_string(&path).unwrap();
                    if path.starts_with(root.join("tests")) {
                        text.push_str(&t);
                    } else if let Some(i) = t.find("#[cfg(test)]") {
                        text.push_str(&t[i..]);
                    }
                }
            }
        }
        for c in Code::ALL {
            let named = text.contains(&format!("\"{}\"", c.as_str()))
                || text.contains(&format!("Code::{c:?}"));
            let listed = NOT_YET_TESTED.contains(&c.as_str());
            assert!(
                named || listed,
                "{}: no test produces it; add one (or list it in NOT_YET_TESTED)",
                c.as_str()
            );
            assert!(
                !(named && listed),
                "{}: a test names it now; remove it from NOT_YET_TESTED",
                c.as_str()
            );
        }
    }

    /// No `"SCREAMING_CODE"` literal outside this file, except environment variable names.
    #[test]
    fn codes_are_only_written_here() {
        const NOT_CODES: &[&str] = &[
            "CARGO_PKG_VERSION",
            "OCC_CONFIG_PATH",
            "OCC_LOG",
            "OCC_TOKEN",
            "NO_COLOR",
            "OCC_TOKEN_FILE",
            "OCC_FAULT_STOP_BEFORE",
            "PGPASSWORD",
            "OPENCLAW_GATEWAY_PASSWORD",
            "OPENAI_API_KEY",
        ];
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![src];
        let mut found = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") || path.ends_with("codes.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    for lit in line.split('"').skip(1).step_by(2) {
                        let is_code = lit.len() > 3
                            && lit.contains('_')
                            && lit.starts_with(|c: char| c.is_ascii_uppercase())
                            && lit
                                .chars()
                                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                        if is_code && !NOT_CODES.contains(&lit) {
                            found.push(format!("{}:{}: {lit}", path.display(), n + 1));
                        }
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "code literals outside codes.rs:\n{}",
            found.join("\n")
        );
    }
}
