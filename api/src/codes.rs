//! Every stable code, from one definition: the coordinator's own ([`Code`]: API refusals,
//! work outcomes, transport failures), each with its class and the HTTP status the API
//! answers it with, and the protocol's (`clawfleet_protocol::FailureCode`, what hostd and
//! the Kubernetes backend answer). [`AnyCode`] is either, with the same questions answered
//! for both: its text, class, HTTP status and description. `/openapi.json` lists them all.

use clawfleet_protocol::failure::{FailureClass, FailureCode};

/// What a code says about the work or request that ended with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeClass {
    /// Done as asked.
    Done,
    /// A later attempt may succeed.
    Retryable,
    /// Nothing changes by retrying; a person or a new request has to act.
    Permanent,
    /// Something newer took the work's place (a newer revision, a stop, another claim, a
    /// deletion): it ends without being a failure of its own.
    Overtaken,
}

macro_rules! codes {
    ($( $variant:ident = $text:literal => $status:literal $class:ident, $doc:literal; )*) => {
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

            /// The HTTP status of an API answer with this code (for a work outcome, the
            /// status a request ending with it would be answered with).
            pub fn http_status(self) -> u16 {
                match self { $( Code::$variant => $status, )* }
            }

            /// What the code says about the work or request that ended with it.
            pub fn class(self) -> CodeClass {
                match self { $( Code::$variant => CodeClass::$class, )* }
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

// `Variant = "TEXT" => HTTP status Class, "description";`
codes! {
    // Requests.
    Unauthenticated = "UNAUTHENTICATED" => 401 Permanent, "No, an unknown, a revoked or an expired token.";
    Forbidden = "FORBIDDEN" => 403 Permanent, "The token lacks the route's role for the Namespace.";
    NotFound = "NOT_FOUND" => 404 Permanent, "The named resource does not exist.";
    NoSuchRoute = "NO_SUCH_ROUTE" => 404 Permanent, "No route has this path.";
    MethodNotAllowed = "METHOD_NOT_ALLOWED" => 405 Permanent, "The route does not take this method.";
    UnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE" => 415 Permanent, "Request bodies must be JSON.";
    InvalidRequest = "INVALID_REQUEST" => 400 Permanent, "The framework refused the request (the message says why).";
    InvalidBody = "INVALID_BODY" => 400 Permanent, "The body is not the JSON the route takes; the message names the field.";
    UnexpectedBody = "UNEXPECTED_BODY" => 400 Permanent, "The route takes no body.";
    InvalidQuery = "INVALID_QUERY" => 400 Permanent, "A query parameter is unknown or not of its type; the message names it.";
    BodyTooLarge = "BODY_TOO_LARGE" => 413 Permanent, "The body is over the 1 MiB limit.";
    RequestTimeout = "REQUEST_TIMEOUT" => 408 Retryable, "The request was not completed within the request timeout.";
    ServerBusy = "SERVER_BUSY" => 503 Retryable, "Too many requests in progress; retry after a second.";
    InternalError = "INTERNAL_ERROR" => 500 Permanent, "The coordinator failed; its log says why.";
    StoreFailure = "STORE_FAILURE" => 500 Permanent, "The state store failed; the coordinator log says why.";
    DatabaseUnavailable = "DATABASE_UNAVAILABLE" => 503 Retryable, "The database cannot be reached right now (a restart or a lost connection); nothing was stored; retry.";
    TokenFailure = "TOKEN_FAILURE" => 500 Permanent, "A token could not be created (randomness or store).";
    HttpError = "HTTP_ERROR" => 502 Permanent, "The client got an HTTP error without the API's error body.";
    InvalidIdentifier = "INVALID_IDENTIFIER" => 400 Permanent, "An id is outside the identifier charset or length.";
    InvalidAddress = "INVALID_ADDRESS" => 400 Permanent, "A host address is not a host name or IP address.";
    InvalidPort = "INVALID_PORT" => 400 Permanent, "A port is out of range.";
    InvalidCapacity = "INVALID_CAPACITY" => 400 Permanent, "A host's maxAgents is out of range.";
    InvalidHostKey = "INVALID_HOST_KEY" => 400 Permanent, "A host key is not one OpenSSH ed25519 public key.";
    InvalidHostAccess = "INVALID_HOST_ACCESS" => 400 Permanent, "A host's login user or jump host is not usable.";
    InvalidExpiry = "INVALID_EXPIRY" => 400 Permanent, "A token's expiresAt is not in the future.";
    DuplicateGrant = "DUPLICATE_GRANT" => 400 Permanent, "A token names one Namespace in two grants.";
    HostExists = "HOST_EXISTS" => 409 Permanent, "A host of that name is enrolled.";
    HostNameMismatch = "HOST_NAME_MISMATCH" => 409 Permanent, "hostd at that address answers to another host name (host_name in its hostd.toml, else /etc/hostname); the message names both.";
    HostInUse = "HOST_IN_USE" => 409 Permanent, "A Namespace's pool names the host.";
    UnknownHost = "UNKNOWN_HOST" => 400 Permanent, "The host is not enrolled, or the token may not choose it.";
    EmptyPool = "EMPTY_POOL" => 400 Permanent, "A Namespace needs a host pool or a cluster.";
    HostDedicated = "HOST_DEDICATED" => 409 Permanent, "The host is in a single-tenant pool, or a single-tenant pool names a host another Namespace uses.";
    HostNotIsolated = "HOST_NOT_ISOLATED" => 409 Permanent, "The host cannot isolate the networks of Agents of different Namespaces (its probe's networkIsolation says what is missing), and another Namespace uses it.";
    HostNotQuotaLimited = "HOST_NOT_QUOTA_LIMITED" => 409 Permanent, "The host cannot limit each Agent's disk and inode use (its probe's quotas says what is missing), and another Namespace uses it.";
    SingleTenantInvalid = "SINGLE_TENANT_INVALID" => 400 Permanent, "singleTenant applies to host pools only.";
    BackendAmbiguous = "BACKEND_AMBIGUOUS" => 400 Permanent, "A Namespace names both hosts and a cluster.";
    UnknownCluster = "UNKNOWN_CLUSTER" => 400 Permanent, "The cluster is not registered, or the token may not choose it.";
    ClusterExists = "CLUSTER_EXISTS" => 409 Permanent, "A cluster of that name is registered.";
    ClusterInUse = "CLUSTER_IN_USE" => 409 Permanent, "A Namespace uses the cluster.";
    ClusterDuplicate = "CLUSTER_DUPLICATE" => 409 Permanent, "The API server (its URL and CA) is already registered under another name; the message names it.";
    ClusterAccessInsufficient = "CLUSTER_ACCESS_INSUFFICIENT" => 400 Permanent, "The kubeconfig's identity lacks a permission clawfleet needs on the cluster; the message names the verb and resource (kube-backend/rbac/ has the roles to bind).";
    ClusterSettingsInvalid = "CLUSTER_SETTINGS_INVALID" => 400 Permanent, "The cluster settings are invalid; the message names the field.";
    KubeconfigInvalid = "KUBECONFIG_INVALID" => 400 Permanent, "The kubeconfig is invalid; the message names the field.";
    NamespaceExists = "NAMESPACE_EXISTS" => 409 Permanent, "A Namespace of that id exists.";
    NamespaceDeleting = "NAMESPACE_DELETING" => 409 Permanent, "The Namespace is being deleted.";
    NamespaceNotEmpty = "NAMESPACE_NOT_EMPTY" => 409 Permanent, "The Namespace still has Agents (hostd answers the same code for the same condition on a host).";
    ConfigurationExists = "CONFIGURATION_EXISTS" => 409 Permanent, "A Configuration of that id exists.";
    ConfigurationRefused = "CONFIGURATION_REFUSED" => 400 Permanent, "The configuration document cannot be deployed; the message names the field.";
    UnknownConfiguration = "UNKNOWN_CONFIGURATION" => 400 Permanent, "The Agent names a Configuration that does not exist.";
    UnknownSecret = "UNKNOWN_SECRET" => 400 Permanent, "A configuration refers to a secret its Namespace does not have; the message names the field.";
    InvalidSecretName = "INVALID_SECRET_NAME" => 400 Permanent, "A secret's name is outside its charset or length.";
    InvalidSecretValue = "INVALID_SECRET_VALUE" => 400 Permanent, "A secret's value is empty, too large, not UTF-8, holds a NUL or ends with a newline; nothing was stored.";
    SecretInUse = "SECRET_IN_USE" => 409 Permanent, "The secret is bound by Agents' current revisions; the message names them.";
    SecretVersionGone = "SECRET_VERSION_GONE" => 409 Permanent, "A revision binds a secret version the store no longer holds (deleted since); deploy again to bind a current version.";
    SecretSealFailed = "SECRET_SEAL_FAILED" => 409 Permanent, "A secret cannot be sealed to the target host's pinned key (secrets are sealed only to ssh-ed25519 host keys); re-enrol the host with its ed25519 key.";
    InvalidHarness = "INVALID_HARNESS" => 400 Permanent, "The Agent's harness is not the embedded one.";
    HarnessAuthUnsupported = "HARNESS_AUTH_UNSUPPORTED" => 400 Permanent, "The harness authentication method is not supported.";
    AgentExists = "AGENT_EXISTS" => 409 Permanent, "An Agent of that id exists.";
    InvalidWorkspaceFile = "INVALID_WORKSPACE_FILE" => 400 Permanent, "An initial workspace file is refused (its name, size, the count or total, or its encoding); the message names the file.";
    AgentDeleting = "AGENT_DELETING" => 409 Permanent, "The Agent is being deleted.";
    AgentNotPlaced = "AGENT_NOT_PLACED" => 409 Permanent, "The Agent was never placed on a host, so it has no runtime or log yet.";
    InvalidLogQuery = "INVALID_LOG_QUERY" => 400 Permanent, "A log request's parameters are out of range or combined wrongly; the message names the parameter.";
    NothingToReconcile = "NOTHING_TO_RECONCILE" => 409 Permanent, "The Agent is not meant to run or has no active revision, so there is nothing to re-apply.";
    InvalidRollout = "INVALID_ROLLOUT" => 400 Permanent, "A rollout's settings are out of range or combined wrongly; the message names the field.";
    RolloutEmpty = "ROLLOUT_EMPTY" => 400 Permanent, "The rollout selects no Agent (none uses the Configuration, or --agents named none).";
    RolloutInProgress = "ROLLOUT_IN_PROGRESS" => 409 Permanent, "The Agent is in a rollout that is not finished; deploy or reconfigure it once the rollout is done, halted or aborted.";
    RolloutStateConflict = "ROLLOUT_STATE_CONFLICT" => 409 Permanent, "The rollout is not in a state that allows this (pause a running one, resume a paused one, promote one waiting, abort one not finished).";
    PlanStale = "PLAN_STALE" => 409 Permanent, "The plan token no longer matches: a Configuration generation or an Agent's active revision moved since the plan; plan again.";
    InvalidPlanToken = "INVALID_PLAN_TOKEN" => 400 Permanent, "The plan token is not one the coordinator issues (plan1- and 32 hex digits).";
    UpgradeRequired = "UPGRADE_REQUIRED" => 426 Permanent, "The route is an HTTP upgrade: send `Connection: Upgrade` and `Upgrade: clawfleet-gateway`.";
    OriginRefused = "ORIGIN_REFUSED" => 403 Permanent, "The request's Origin is neither the coordinator's own nor in api.gateway_allowed_origins (a page of another site may not open gateway streams nor send changes to a gateway); the message names the Origin.";
    GatewayRouteFailed = "GATEWAY_ROUTE_FAILED" => 502 Retryable, "The stream to the Agent's gateway opened, but the gateway did not answer the request as HTTP (it closed, or answered garbage); the message says what happened.";
    GatewayNotServing = "GATEWAY_NOT_SERVING" => 409 Permanent, "The Agent is not meant to run (stopped or being deleted) or has no active revision, so there is no gateway to reach.";
    ControlUiNotDeployed = "CONTROL_UI_NOT_DEPLOYED" => 409 Permanent, "The Agent's active revision does not serve its Control UI at the coordinator's .../ui/ path: it was rendered before the coordinator set gateway.controlUi.basePath (deploy a new revision), or its configuration turns the Control UI off (gateway.controlUi.enabled: false).";
    GatewayStreamLimit = "GATEWAY_STREAM_LIMIT" => 429 Retryable, "The token has its most gateway streams open (api.gateway_streams_per_token); close one or retry later.";
    RateLimited = "RATE_LIMITED" => 429 Retryable, "The token is over one of its limits (requests in progress, requests per minute, reads of hosts and clusters per minute); retry after the Retry-After seconds.";
    // Work outcomes.
    CallInProgress = "CALL_IN_PROGRESS" => 503 Retryable, "A host or cluster call of the work has not answered for a few seconds (a slow hostd or Kubernetes API); the message names the operation, the target and how long. The call's outcome replaces it.";
    NamespaceReady = "NAMESPACE_READY" => 200 Done, "The Namespace is ready on its pool or cluster.";
    NamespaceNotReady = "NAMESPACE_NOT_READY" => 503 Retryable, "The Agent waits for its Namespace to become ready.";
    NamespaceDeleted = "NAMESPACE_DELETED" => 200 Done, "The Namespace was removed from its pool or cluster.";
    NamespaceGone = "NAMESPACE_GONE" => 409 Overtaken, "The Namespace was deleted while its work waited.";
    NoHostAvailable = "NO_HOST_AVAILABLE" => 409 Retryable, "No pool host has room for the Agent.";
    RevisionActivated = "REVISION_ACTIVATED" => 200 Done, "The revision serves.";
    RevisionStopped = "REVISION_STOPPED" => 200 Done, "The Agent is stopped.";
    RevisionRestored = "REVISION_RESTORED" => 409 Permanent, "The candidate did not become ready; the target put the last served revision back and it serves again (restore: last-served).";
    RevisionSuperseded = "REVISION_SUPERSEDED" => 409 Overtaken, "A newer revision took this one's place.";
    RevisionGone = "REVISION_GONE" => 409 Overtaken, "The revision was deleted while its work waited.";
    RevisionFinalizationIncomplete = "REVISION_FINALIZATION_INCOMPLETE" => 503 Retryable, "The revision serves but retiring its predecessor is not done yet.";
    StopIncomplete = "STOP_INCOMPLETE" => 503 Retryable, "The stop ran but the host or cluster still reports the Agent's gateway running (or serving); the stop is retried until it is observed stopped.";
    StopSuperseded = "STOP_SUPERSEDED" => 409 Overtaken, "The Agent is meant to run again; the stop was dropped.";
    AgentGone = "AGENT_GONE" => 409 Overtaken, "The Agent was deleted while its work waited.";
    AgentDeleted = "AGENT_DELETED" => 200 Done, "The Agent was removed from its host or cluster.";
    ConvergenceDeadlineExceeded = "CONVERGENCE_DEADLINE_EXCEEDED" => 409 Permanent, "The work did not converge within the convergence deadline.";
    InvalidStoredId = "INVALID_STORED_ID" => 400 Permanent, "Stored data is no longer valid (the database was edited): the store names the column it cannot read.";
    InvalidState = "INVALID_STATE" => 409 Permanent, "The stored state is inconsistent (the message says where).";
    InvalidWork = "INVALID_WORK" => 409 Permanent, "A work item lacks what its kind needs.";
    InvalidHostResult = "INVALID_HOST_RESULT" => 409 Permanent, "The host answered with a result of another operation.";
    StoreUnavailable = "STORE_UNAVAILABLE" => 503 Retryable, "The store failed during work; the worker retries.";
    ClaimLost = "CLAIM_LOST" => 409 Overtaken, "This coordinator's claim on the work item was replaced (its lease lapsed and another coordinator took the item), or a target refused its operation as fenced off; it stopped acting on the item and recorded nothing.";
    RolloutHalted = "ROLLOUT_HALTED" => 409 Overtaken, "The rollout's failure budget was spent; this Agent was not deployed.";
    RolloutAborted = "ROLLOUT_ABORTED" => 409 Overtaken, "The rollout was aborted before this Agent's turn; it was not deployed.";
    // Transport.
    HostUnreachable = "HOST_UNREACHABLE" => 502 Retryable, "The host or cluster could not be reached.";
    HostKeyMismatch = "HOST_KEY_MISMATCH" => 409 Permanent, "The host's SSH key is not the pinned one.";
    HostAuthRefused = "HOST_AUTH_REFUSED" => 409 Permanent, "The host refused the coordinator's SSH login.";
    BackendUnsupported = "BACKEND_UNSUPPORTED" => 501 Permanent, "The target's backend does not support the operation.";
}

/// Any stable code: the coordinator's or a target's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnyCode {
    /// One of the coordinator's own codes.
    Coordinator(Code),
    /// A code of hostd or the Kubernetes backend, passed through unchanged.
    Target(FailureCode),
}

impl From<Code> for AnyCode {
    fn from(c: Code) -> Self {
        AnyCode::Coordinator(c)
    }
}

impl From<FailureCode> for AnyCode {
    fn from(c: FailureCode) -> Self {
        AnyCode::Target(c)
    }
}

impl AnyCode {
    /// Every code: the coordinator's, then the protocol's that are not also the
    /// coordinator's (the same condition found before asking a target, e.g.
    /// `NAMESPACE_NOT_EMPTY`).
    pub fn all() -> impl Iterator<Item = AnyCode> {
        Code::ALL.iter().map(|c| AnyCode::Coordinator(*c)).chain(
            FailureCode::ALL
                .iter()
                .filter(|f| Code::parse(f.as_str()).is_none())
                .map(|f| AnyCode::Target(*f)),
        )
    }

    /// The code as it travels.
    pub fn as_str(self) -> &'static str {
        match self {
            AnyCode::Coordinator(c) => c.as_str(),
            AnyCode::Target(f) => f.as_str(),
        }
    }

    /// The code of that text: the coordinator's first, then the protocol's.
    pub fn parse(s: &str) -> Option<AnyCode> {
        Code::parse(s).map(AnyCode::Coordinator).or_else(|| {
            FailureCode::ALL
                .iter()
                .find(|f| f.as_str() == s)
                .map(|f| AnyCode::Target(*f))
        })
    }

    /// What the code says by default (a target's failure carries its own class, which
    /// may say otherwise): a target's retry class, except that a newer revision
    /// (`SUPERSEDED`) and a higher fence (`FENCE_STALE`) mean the work was overtaken.
    pub fn class(self) -> CodeClass {
        match self {
            AnyCode::Coordinator(c) => c.class(),
            AnyCode::Target(FailureCode::Superseded | FailureCode::FenceStale) => {
                CodeClass::Overtaken
            }
            AnyCode::Target(f) => match f.default_class() {
                FailureClass::Retryable => CodeClass::Retryable,
                FailureClass::Permanent => CodeClass::Permanent,
            },
        }
    }

    /// The HTTP status of an API answer with this code: a target's failure is 502 when a
    /// retry may succeed and 409 when it cannot.
    pub fn http_status(self) -> u16 {
        match self {
            AnyCode::Coordinator(c) => c.http_status(),
            AnyCode::Target(f) => match f.default_class() {
                FailureClass::Retryable => 502,
                FailureClass::Permanent => 409,
            },
        }
    }

    /// What the code means, for `/openapi.json` (a target's: its description in the
    /// protocol).
    pub fn describe(self) -> &'static str {
        match self {
            AnyCode::Coordinator(c) => c.describe(),
            AnyCode::Target(f) => f.describe(),
        }
    }
}

impl std::fmt::Display for AnyCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A code travels as its text.
impl serde::Serialize for AnyCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A code travels as its text.
impl serde::Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A code equals its text (what a test or a stored row holds).
impl PartialEq<str> for AnyCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

/// A code equals its text (what a test or a stored row holds).
impl PartialEq<&str> for AnyCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<Code> for AnyCode {
    fn eq(&self, other: &Code) -> bool {
        *self == AnyCode::Coordinator(*other)
    }
}

impl PartialEq<FailureCode> for AnyCode {
    fn eq(&self, other: &FailureCode) -> bool {
        *self == AnyCode::Target(*other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_parses_back_and_has_a_status_and_a_description() {
        let mut seen = std::collections::HashSet::new();
        for c in AnyCode::all() {
            assert!(seen.insert(c.as_str()), "{c} twice");
            assert_eq!(AnyCode::parse(c.as_str()), Some(c), "{c}");
            assert!((200..600).contains(&c.http_status()), "{c}");
            assert!(!c.describe().trim().is_empty(), "{c}: no description");
            // Done is a success; an answer of the API with a refusal is 4xx or 5xx.
            assert_eq!(c.class() == CodeClass::Done, c.http_status() < 300, "{c}");
        }
        assert_eq!(
            AnyCode::parse(FailureCode::NamespaceNotEmpty.as_str()),
            Some(AnyCode::Coordinator(Code::NamespaceNotEmpty))
        );
    }
}

/// The walk over the tree: every code literal in the workspace's sources is a defined code,
/// and every defined code is produced somewhere.
#[cfg(test)]
mod walk {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::*;

    /// The crates whose sources produce codes.
    const PRODUCERS: &[&str] = &[
        "coordinator",
        "store",
        "ssh-backend",
        "hostd",
        "kube-backend",
        "protocol",
        "api",
    ];

    /// Literals that look like codes and are not: environment variables (of hooks, hostd,
    /// occ, the gateway, Cargo), journal fields and `/etc/login.defs` keys, and prefixes of
    /// such names.
    const NOT_CODES: &[&str] = &[
        "ALL_PROXY",
        "BASH_ENV",
        "CARGO_MANIFEST_DIR",
        "CARGO_PKG_VERSION",
        "CLAWFLEET_",
        "CLAWFLEET_AGENT_ID",
        "CLAWFLEET_EVENT",
        "CLAWFLEET_NAMESPACE_ID",
        "CLAWFLEET_NAMESPACE_NAME",
        "CLAWFLEET_OPERATION_ID",
        "CLAWFLEET_REVISION_ID",
        "CLAWFLEET_REVISION_NUMBER",
        "CLAWFLEET_SERVICE_PRINCIPAL_ID",
        "CREDENTIALS_DIRECTORY",
        "CURL_CA_BUNDLE",
        "DB_PASSWORD",
        "EXIT_CODE",
        "EXIT_STATUS",
        "FTP_PROXY",
        "GCONV_PATH",
        "GLIBC_",
        "HOSTD_FAULT_FILE",
        "HOSTD_LOG",
        "HOSTD_TRASH_TEST_DIR",
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "INVOCATION_ID",
        "JOURNAL_STREAM",
        "LC_ALL",
        "LISTEN_FDNAMES",
        "LISTEN_FDS",
        "LISTEN_PID",
        "LOG_STYLE",
        "MALLOC_",
        "NODE_",
        "NOTIFY_SOCKET",
        "NO_COLOR",
        "NO_PROXY",
        "OCC_CONFIG_PATH",
        "OCC_FAULT_STOP_BEFORE",
        "OCC_LOG",
        "OCC_TOKEN",
        "OCC_TOKEN_FILE",
        "OPENCLAW_",
        "OPENCLAW_CONFIG_PATH",
        "OPENCLAW_CONFIG_READONLY",
        "OPENCLAW_DISABLE_BONJOUR",
        "OPENCLAW_GATEWAY_PASSWORD",
        "OPENCLAW_GATEWAY_PORT",
        "OPENCLAW_STATE_DIR",
        "OPENSSL_",
        "REQUESTS_CA_BUNDLE",
        "RES_OPTIONS",
        "RUNTIME_DIRECTORY",
        "SSL_CERT_DIR",
        "SSL_CERT_FILE",
        "SSH_ORIGINAL_COMMAND",
        "STATE_DIRECTORY",
        "SUDO_USER",
        "SYSTEMD_",
        "SYSTEMD_PAGER",
        "SYS_GID_MAX",
        "SYS_GID_MIN",
        "SYS_UID_MAX",
        "SYS_UID_MIN",
        "X_KEY",
        "PGPASSWORD",
        "OPENAI_API_KEY",
    ];

    /// Target codes no source produces, each with the reason.
    const NOT_PRODUCED: &[(FailureCode, &str)] = &[
        // The coordinator refuses a delete of a Namespace with Agents itself, with its own
        // code of the same text; hostd removes a Namespace's Agents with it.
        (
            FailureCode::NamespaceNotEmpty,
            "the coordinator's NAMESPACE_NOT_EMPTY answers it",
        ),
        // Reserved since protocol version 1 for a revision configuration a host refuses; the
        // coordinator refuses such configurations first (CONFIGURATION_REFUSED).
        (
            FailureCode::ConfigurationRejected,
            "reserved; CONFIGURATION_REFUSED answers first",
        ),
    ];

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// The non-test source of every producer (everything before a file's `#[cfg(test)]`;
    /// test-only files are skipped), but not the two tables.
    fn sources() -> Vec<(PathBuf, String)> {
        let mut out = Vec::new();
        for krate in PRODUCERS {
            let mut stack = vec![workspace().join(krate).join("src")];
            while let Some(dir) = stack.pop() {
                for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
                    let path = entry.map(|e| e.path()).unwrap_or_default();
                    if path.is_dir() {
                        stack.push(path);
                        continue;
                    }
                    let name = path.to_string_lossy().into_owned();
                    if !name.ends_with(".rs")
                        || name.ends_with("api/src/codes.rs")
                        || name.ends_with("protocol/src/failure.rs")
                        || name.ends_with("store/src/suite.rs")
                        || name.contains("test")
                    {
                        continue;
                    }
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let text = match text.find("#[cfg(test)]") {
                        Some(i) => text[..i].to_owned(),
                        None => text,
                    };
                    out.push((path, text));
                }
            }
        }
        out
    }

    #[test]
    fn every_code_in_the_tree_is_defined_and_every_defined_code_is_produced() {
        let sources = sources();
        assert!(
            sources.len() > 50,
            "too few sources under {:?}",
            workspace()
        );
        let defined: BTreeSet<&str> = AnyCode::all()
            .map(AnyCode::as_str)
            .chain(FailureCode::ALL.iter().map(|f| f.as_str()))
            .collect();
        let mut undefined = Vec::new();
        for (path, text) in &sources {
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for lit in line.split('"').skip(1).step_by(2) {
                    let looks_like_a_code = lit.len() > 3
                        && lit.contains('_')
                        && lit.starts_with(|c: char| c.is_ascii_uppercase())
                        && lit
                            .chars()
                            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                    if looks_like_a_code && !defined.contains(lit) && !NOT_CODES.contains(&lit) {
                        undefined.push(format!("{}:{}: {lit}", path.display(), n + 1));
                    }
                }
            }
        }
        assert!(
            undefined.is_empty(),
            "codes used but not defined in clawfleet_api::codes or the protocol:\n{}",
            undefined.join("\n")
        );
        let all: String = sources.iter().map(|(_, t)| t.as_str()).collect();
        let produced = |needle: String| all.contains(&needle);
        for c in AnyCode::all() {
            let (found, listed) = match c {
                AnyCode::Coordinator(code) => (produced(format!("Code::{code:?}")), false),
                AnyCode::Target(f) => (
                    produced(format!("FailureCode::{f:?}")),
                    NOT_PRODUCED.iter().any(|(n, _)| *n == f),
                ),
            };
            assert!(found || listed, "{c}: defined but never produced");
            assert!(
                !(found && listed),
                "{c}: produced now; take it off NOT_PRODUCED"
            );
        }
        for (f, _) in NOT_PRODUCED {
            assert!(
                !produced(format!("FailureCode::{f:?}")),
                "{f:?}: produced now; take it off NOT_PRODUCED"
            );
        }
    }
}
