//! Reading an operator's kubeconfig into the credentials clawfleet stores for a cluster.
//!
//! Everything is checked before anything is stored. Accepted: one HTTPS server with a CA, and
//! either a bearer token or a client certificate with its key. Refused, each with the field
//! named: `insecure-skip-tls-verify`, plain `http`, credentials in the URL, `proxy-url`, exec
//! plugins, `auth-provider`, basic auth, impersonation, a token no HTTP header can carry,
//! unknown fields.
//!
//! File references (`certificate-authority`, `client-certificate`, `client-key`, `tokenFile`)
//! are read only on the operator's machine: [`parse_kubeconfig_file`] and
//! [`inline_kubeconfig_file`] (what `occ cluster add` sends) read them relative to the
//! kubeconfig's directory, as kubectl does, each at most [`MAX_FILE_BYTES`].
//! [`parse_kubeconfig`] (what the coordinator's API uses on text it received) refuses them,
//! naming the field: a path in a request must never make the server read its own files (its
//! admin token, `/dev/zero`) or reveal whether they exist.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use kube::config::{AuthInfo, Kubeconfig, NamedAuthInfo, NamedCluster};
use secrecy::ExposeSecret as _;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a kubeconfig cannot be used. Every variant names the field in kubectl's spelling
/// (`clusters[name=prod].cluster.server`), and none carries a credential.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KubeconfigError {
    #[error("the kubeconfig does not parse: {0}")]
    Syntax(String),
    #[error("`current-context` is not set; pass a context")]
    NoCurrentContext,
    #[error("`contexts[name={0}]`: no such context in the kubeconfig")]
    MissingContext(String),
    #[error(
        "`{field}`: the context names cluster {cluster:?}, which the kubeconfig does not define"
    )]
    MissingCluster { field: String, cluster: String },
    #[error("`{0}`: the context names no user; a token or a client certificate is required")]
    NoUser(String),
    #[error("`{field}`: the context names user {user:?}, which the kubeconfig does not define")]
    MissingUser { field: String, user: String },
    #[error("`{field}`: {reason}")]
    Refused { field: String, reason: String },
    #[error("`{field}`: cannot read {path}: {reason}")]
    Unreadable {
        field: String,
        path: String,
        reason: String,
    },
}

/// How clawfleet authenticates to a cluster's API server.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind", deny_unknown_fields)]
pub enum ClusterAuth {
    /// A bearer token (for example a ServiceAccount token).
    Token { token: String },
    /// A client certificate chain and its private key, both PEM.
    ClientCertificate {
        certificate_pem: String,
        key_pem: String,
    },
}

impl ClusterAuth {
    /// `token` or `client-certificate`, for display.
    pub fn kind(&self) -> &'static str {
        match self {
            ClusterAuth::Token { .. } => "token",
            ClusterAuth::ClientCertificate { .. } => "client-certificate",
        }
    }
}

impl fmt::Debug for ClusterAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterAuth::{}(<redacted>)", self.kind())
    }
}

/// Validated credentials for one cluster: an HTTPS server, the CA that verifies it, and one
/// way to authenticate.
///
/// The serialized form (serde, camelCase) holds the secrets: it is what the coordinator stores,
/// and it must never be returned by the API or logged. `Debug` and `Display` never show the
/// token, the key or the certificate. Deserializing validates again.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    try_from = "StoredCredentials"
)]
pub struct ClusterCredentials {
    server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tls_server_name: Option<String>,
    ca_pem: String,
    auth: ClusterAuth,
    context: String,
}

/// The stored shape, validated into [`ClusterCredentials`] on decode.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StoredCredentials {
    server: String,
    #[serde(default)]
    tls_server_name: Option<String>,
    ca_pem: String,
    auth: ClusterAuth,
    context: String,
}

impl TryFrom<StoredCredentials> for ClusterCredentials {
    type Error = KubeconfigError;
    fn try_from(s: StoredCredentials) -> Result<Self, Self::Error> {
        check_server("server", &s.server)?;
        check_ca("caPem", s.ca_pem.as_bytes())?;
        if let ClusterAuth::Token { token } = &s.auth {
            check_token("auth.token", token)?;
        }
        if let ClusterAuth::ClientCertificate {
            certificate_pem,
            key_pem,
        } = &s.auth
        {
            check_pem(
                "auth.certificatePem",
                certificate_pem.as_bytes(),
                &["CERTIFICATE"],
            )?;
            check_pem("auth.keyPem", key_pem.as_bytes(), KEY_TAGS)?;
        }
        Ok(Self {
            server: s.server,
            tls_server_name: s.tls_server_name,
            ca_pem: s.ca_pem,
            auth: s.auth,
            context: s.context,
        })
    }
}

impl ClusterCredentials {
    /// The API server URL (`https://…`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The kubeconfig context these came from.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// The CA bundle (PEM) that verifies the server.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The name to verify in the server certificate instead of the URL's host, if set.
    pub fn tls_server_name(&self) -> Option<&str> {
        self.tls_server_name.as_deref()
    }

    /// How the backend authenticates (the secret inside is only for building the client).
    pub fn auth(&self) -> &ClusterAuth {
        &self.auth
    }

    /// `SHA256:<base64>` of the first CA certificate (DER): the cluster's pinned identity, shown
    /// where hosts show their host-key fingerprint.
    pub fn ca_fingerprint(&self) -> String {
        let der = ca_ders(self.ca_pem.as_bytes())
            .ok()
            .and_then(|d| d.into_iter().next())
            .unwrap_or_default();
        let digest = clawfleet_protocol::ident::sha256(&der);
        format!(
            "SHA256:{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        )
    }

    /// These credentials as a one-context kubeconfig with everything inline (JSON text).
    pub fn to_inline_kubeconfig(&self) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        let mut cluster = serde_json::json!({
            "server": self.server,
            "certificate-authority-data": b64(&self.ca_pem),
        });
        if let Some(name) = &self.tls_server_name {
            cluster["tls-server-name"] = serde_json::json!(name);
        }
        let user = match &self.auth {
            ClusterAuth::Token { token } => serde_json::json!({ "token": token }),
            ClusterAuth::ClientCertificate {
                certificate_pem,
                key_pem,
            } => serde_json::json!({
                "client-certificate-data": b64(certificate_pem),
                "client-key-data": b64(key_pem),
            }),
        };
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": self.context,
            "clusters": [{ "name": "cluster", "cluster": cluster }],
            "users": [{ "name": "user", "user": user }],
            "contexts": [{
                "name": self.context,
                "context": { "cluster": "cluster", "user": "user" },
            }],
        })
        .to_string()
    }

    /// The same credentials with `auth` swapped in unvalidated: tests of what happens when
    /// stored credentials hold something validation would refuse.
    #[cfg(test)]
    pub(crate) fn with_auth_unchecked(mut self, auth: ClusterAuth) -> Self {
        self.auth = auth;
        self
    }

    /// A digest of everything, so a client cached for old credentials is never reused.
    pub(crate) fn cache_key(&self) -> [u8; 32] {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        clawfleet_protocol::ident::sha256(&bytes)
    }

    /// The CA certificates in DER, for the TLS client.
    pub(crate) fn ca_der(&self) -> Vec<Vec<u8>> {
        ca_ders(self.ca_pem.as_bytes()).unwrap_or_default()
    }
}

impl fmt::Debug for ClusterCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCredentials")
            .field("server", &self.server)
            .field("context", &self.context)
            .field("tls_server_name", &self.tls_server_name)
            .field("ca", &self.ca_fingerprint())
            .field("auth", &self.auth)
            .finish()
    }
}

impl fmt::Display for ClusterCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (context {}, {} auth, CA {})",
            self.server,
            self.context,
            self.auth.kind(),
            self.ca_fingerprint()
        )
    }
}

const KEY_TAGS: &[&str] = &["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"];

/// The largest file a kubeconfig may name (CA bundle, certificate, key, token), and the
/// largest kubeconfig file read: far above any real one, small enough that `/dev/zero` or a
/// huge file fails at once instead of exhausting memory.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Where the files a kubeconfig names may be read.
#[derive(Debug, Clone, Copy)]
enum Files<'a> {
    /// Nowhere: text received by the coordinator; a path field is refused, naming it.
    Refused,
    /// On this machine (the operator's), relative paths from this directory.
    ReadFrom(Option<&'a Path>),
}

/// Parses kubeconfig text received from elsewhere and validates the chosen context
/// (`context`, else `current-context`). Every file reference is refused, naming the field: the
/// text must carry its CA, certificate, key and token inline (`*-data`, `token`), as
/// [`inline_kubeconfig_file`] produces.
pub fn parse_kubeconfig(
    text: &str,
    context: Option<&str>,
) -> Result<ClusterCredentials, KubeconfigError> {
    parse_in(text, context, Files::Refused)
}

/// Reads a kubeconfig file on this machine and validates it like [`parse_kubeconfig`]; the
/// files it names are read too, relative paths from the kubeconfig's directory (as kubectl
/// does), each at most [`MAX_FILE_BYTES`].
pub fn parse_kubeconfig_file(
    path: &Path,
    context: Option<&str>,
) -> Result<ClusterCredentials, KubeconfigError> {
    let bytes = read_bounded("kubeconfig", path)?;
    let text = String::from_utf8(bytes).map_err(|_| KubeconfigError::Unreadable {
        field: "kubeconfig".to_owned(),
        path: path.display().to_string(),
        reason: "not UTF-8 text".to_owned(),
    })?;
    parse_in(&text, context, Files::ReadFrom(path.parent()))
}

/// What `occ cluster add` sends: the kubeconfig file read and validated on the operator's
/// machine (files it names read there, see [`parse_kubeconfig_file`]), reduced to the chosen
/// context with everything inline, as kubeconfig text (JSON, which is YAML) that
/// [`parse_kubeconfig`] accepts.
pub fn inline_kubeconfig_file(
    path: &Path,
    context: Option<&str>,
) -> Result<String, KubeconfigError> {
    Ok(parse_kubeconfig_file(path, context)?.to_inline_kubeconfig())
}

fn parse_in(
    text: &str,
    context: Option<&str>,
    base: Files<'_>,
) -> Result<ClusterCredentials, KubeconfigError> {
    let config =
        Kubeconfig::from_yaml(text).map_err(|e| KubeconfigError::Syntax(syntax_message(&e)))?;
    let context_name = match context {
        Some(c) => c.to_owned(),
        None => config
            .current_context
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or(KubeconfigError::NoCurrentContext)?,
    };
    let named_context = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .ok_or_else(|| KubeconfigError::MissingContext(context_name.clone()))?;
    let ctx_field = format!("contexts[name={context_name}].context");
    let ctx = named_context
        .context
        .as_ref()
        .ok_or_else(|| KubeconfigError::MissingContext(context_name.clone()))?;
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .ok_or_else(|| KubeconfigError::MissingCluster {
            field: format!("{ctx_field}.cluster"),
            cluster: ctx.cluster.clone(),
        })?;
    let user_name = ctx
        .user
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| KubeconfigError::NoUser(format!("{ctx_field}.user")))?;
    let user = config
        .auth_infos
        .iter()
        .find(|u| u.name == user_name)
        .ok_or_else(|| KubeconfigError::MissingUser {
            field: format!("{ctx_field}.user"),
            user: user_name.to_owned(),
        })?;
    let (server, tls_server_name, ca_pem) = read_cluster(cluster, base)?;
    let auth = read_user(user, base)?;
    Ok(ClusterCredentials {
        server,
        tls_server_name,
        ca_pem,
        auth,
        context: context_name,
    })
}

/// The parser's message without echoing the document (which may hold secrets).
fn syntax_message(e: &kube::config::KubeconfigError) -> String {
    // Parser messages may quote the offending value (a token, a key): keep only the text
    // before the first quote.
    let text = e.to_string();
    let cut = text.find(['"', '\'', '`']).unwrap_or(text.len());
    let short: String = text[..cut].chars().take(200).collect();
    if short.contains("-----BEGIN") {
        "invalid YAML or an unexpected shape".to_owned()
    } else {
        short.trim_end().to_owned()
    }
}

fn refused(field: String, reason: impl Into<String>) -> KubeconfigError {
    KubeconfigError::Refused {
        field,
        reason: reason.into(),
    }
}

fn read_cluster(
    named: &NamedCluster,
    base: Files<'_>,
) -> Result<(String, Option<String>, String), KubeconfigError> {
    let field = format!("clusters[name={}].cluster", named.name);
    let cluster = named
        .cluster
        .as_ref()
        .ok_or_else(|| refused(field.clone(), "the cluster entry is empty"))?;
    if let Some(key) = named.other.keys().chain(cluster.other.keys()).next() {
        return Err(refused(
            format!("{field}.{key}"),
            "is not a field clawfleet understands; remove it",
        ));
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        return Err(refused(
            format!("{field}.insecure-skip-tls-verify"),
            "the server certificate must be verified against a CA; remove it and set certificate-authority-data",
        ));
    }
    if cluster.proxy_url.is_some() {
        return Err(refused(
            format!("{field}.proxy-url"),
            "clawfleet talks to the API server directly; proxies are not supported",
        ));
    }
    let server = cluster
        .server
        .clone()
        .ok_or_else(|| refused(format!("{field}.server"), "is missing"))?;
    check_server(&format!("{field}.server"), &server)?;
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => decode_base64(&format!("{field}.certificate-authority-data"), data)?,
        (None, Some(path)) => read_file(&format!("{field}.certificate-authority"), path, base)?,
        (None, None) => {
            return Err(refused(
                format!("{field}.certificate-authority-data"),
                "is missing: the server's CA is required (the system trust store is never used)",
            ));
        }
    };
    let ca_field = if cluster.certificate_authority_data.is_some() {
        format!("{field}.certificate-authority-data")
    } else {
        format!("{field}.certificate-authority")
    };
    let ca_pem = pem_text(&ca_field, ca)?;
    check_ca(&ca_field, ca_pem.as_bytes())?;
    Ok((server, cluster.tls_server_name.clone(), ca_pem))
}

fn read_user(named: &NamedAuthInfo, base: Files<'_>) -> Result<ClusterAuth, KubeconfigError> {
    let field = format!("users[name={}].user", named.name);
    let user: &AuthInfo = named
        .auth_info
        .as_ref()
        .ok_or_else(|| refused(field.clone(), "the user entry is empty"))?;
    if let Some(key) = named.other.keys().chain(user.other.keys()).next() {
        return Err(refused(
            format!("{field}.{key}"),
            "is not a field clawfleet understands; remove it",
        ));
    }
    if user.exec.is_some() {
        return Err(refused(
            format!("{field}.exec"),
            "exec credential plugins would run a program on the coordinator; use a token or a client certificate",
        ));
    }
    if user.auth_provider.is_some() {
        return Err(refused(
            format!("{field}.auth-provider"),
            "auth-provider plugins are not supported; use a token or a client certificate",
        ));
    }
    if user.username.is_some() {
        return Err(refused(
            format!("{field}.username"),
            "basic authentication is not supported; use a token or a client certificate",
        ));
    }
    if user.password.is_some() {
        return Err(refused(
            format!("{field}.password"),
            "basic authentication is not supported; use a token or a client certificate",
        ));
    }
    if user.impersonate.is_some()
        || user.impersonate_uid.is_some()
        || user.impersonate_groups.is_some()
        || user.impersonate_user_extra.is_some()
    {
        return Err(refused(
            format!("{field}.as"),
            "impersonation is not supported; give clawfleet its own identity",
        ));
    }
    let token = match (&user.token, &user.token_file) {
        (Some(_), Some(_)) => {
            return Err(refused(
                format!("{field}.tokenFile"),
                "both token and tokenFile are set; keep one",
            ));
        }
        (Some(t), None) => Some(check_token(
            &format!("{field}.token"),
            t.expose_secret().trim(),
        )?),
        (None, Some(path)) => {
            let bytes = read_file(&format!("{field}.tokenFile"), path, base)?;
            let text = String::from_utf8(bytes)
                .map_err(|_| refused(format!("{field}.tokenFile"), "the token file is not text"))?;
            Some(check_token(&format!("{field}.tokenFile"), text.trim())?)
        }
        (None, None) => None,
    };
    if token.as_deref() == Some("") {
        return Err(refused(format!("{field}.token"), "is empty"));
    }
    let cert = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(d), _) => Some((
            format!("{field}.client-certificate-data"),
            decode_base64(&format!("{field}.client-certificate-data"), d)?,
        )),
        (None, Some(p)) => Some((
            format!("{field}.client-certificate"),
            read_file(&format!("{field}.client-certificate"), p, base)?,
        )),
        (None, None) => None,
    };
    let key = match (&user.client_key_data, &user.client_key) {
        (Some(d), _) => Some((
            format!("{field}.client-key-data"),
            decode_base64(&format!("{field}.client-key-data"), d.expose_secret())?,
        )),
        (None, Some(p)) => Some((
            format!("{field}.client-key"),
            read_file(&format!("{field}.client-key"), p, base)?,
        )),
        (None, None) => None,
    };
    match (token, cert, key) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(refused(
            format!("{field}.token"),
            "both a token and a client certificate are set; keep one",
        )),
        (Some(token), None, None) => Ok(ClusterAuth::Token { token }),
        (None, Some((cert_field, cert)), Some((key_field, key))) => {
            let certificate_pem = pem_text(&cert_field, cert)?;
            check_pem(&cert_field, certificate_pem.as_bytes(), &["CERTIFICATE"])?;
            let key_pem = pem_text(&key_field, key)?;
            check_pem(&key_field, key_pem.as_bytes(), KEY_TAGS)?;
            Ok(ClusterAuth::ClientCertificate {
                certificate_pem,
                key_pem,
            })
        }
        (None, Some(_), None) => Err(refused(
            format!("{field}.client-key-data"),
            "a client certificate needs its key (client-key-data or client-key)",
        )),
        (None, None, Some(_)) => Err(refused(
            format!("{field}.client-certificate-data"),
            "a client key needs its certificate (client-certificate-data or client-certificate)",
        )),
        (None, None, None) => Err(refused(
            field,
            "no credentials: set token, tokenFile, or client-certificate-data with client-key-data",
        )),
    }
}

/// The server must be `https://host[:port][/path]` without user information.
fn check_server(field: &str, server: &str) -> Result<(), KubeconfigError> {
    let uri: http::Uri = server
        .parse()
        .map_err(|_| refused(field.to_owned(), "is not a valid URL"))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") => {
            return Err(refused(
                field.to_owned(),
                "plain http is refused; the API server must be reached over HTTPS",
            ));
        }
        _ => return Err(refused(field.to_owned(), "must be an https:// URL")),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| refused(field.to_owned(), "has no host"))?;
    if authority.as_str().contains('@') {
        return Err(refused(
            field.to_owned(),
            "credentials embedded in the URL (user:password@) are refused",
        ));
    }
    if uri.query().is_some() {
        return Err(refused(field.to_owned(), "must not carry a query"));
    }
    Ok(())
}

fn decode_base64(field: &str, data: &str) -> Result<Vec<u8>, KubeconfigError> {
    let compact: String = data.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|_| refused(field.to_owned(), "is not valid base64"))
}

fn read_file(field: &str, path: &str, base: Files<'_>) -> Result<Vec<u8>, KubeconfigError> {
    let base = match base {
        Files::ReadFrom(base) => base,
        Files::Refused => {
            // The path is not echoed: whether it exists on this machine is nobody's business.
            return Err(refused(
                field.to_owned(),
                "names a file, which is never read here: register with `occ cluster add \
                 --kubeconfig FILE` (it reads the files on your machine and sends their \
                 contents), or embed the contents (`*-data`, `token`)",
            ));
        }
    };
    let p = PathBuf::from(path);
    let full = match base {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    };
    read_bounded(field, &full)
}

/// Reads at most [`MAX_FILE_BYTES`] (one more to tell a larger file), so a device or a huge
/// file fails at once with the field and the path named.
fn read_bounded(field: &str, path: &Path) -> Result<Vec<u8>, KubeconfigError> {
    let unreadable = |reason: String| KubeconfigError::Unreadable {
        field: field.to_owned(),
        path: path.display().to_string(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| unreadable(e.kind().to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(e.kind().to_string()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(unreadable(format!(
            "larger than {} bytes (MAX_FILE_BYTES)",
            MAX_FILE_BYTES
        )));
    }
    Ok(bytes)
}

/// A token must fit an `Authorization: Bearer …` header: a newline or another control
/// character would otherwise fail (or panic) only later, when the client is built.
fn check_token(field: &str, token: &str) -> Result<String, KubeconfigError> {
    if http::HeaderValue::try_from(format!("Bearer {token}")).is_err() {
        return Err(refused(
            field.to_owned(),
            "holds a character an HTTP header cannot carry (a newline or another control \
             character); a token is one line of printable text",
        ));
    }
    Ok(token.to_owned())
}

fn pem_text(field: &str, bytes: Vec<u8>) -> Result<String, KubeconfigError> {
    String::from_utf8(bytes).map_err(|_| refused(field.to_owned(), "is not PEM text"))
}

fn check_pem(field: &str, data: &[u8], tags: &[&str]) -> Result<(), KubeconfigError> {
    let blocks =
        pem::parse_many(data).map_err(|_| refused(field.to_owned(), "is not valid PEM"))?;
    if blocks.is_empty() || !blocks.iter().any(|b| tags.contains(&b.tag())) {
        return Err(refused(
            field.to_owned(),
            format!("holds no PEM block of type {}", tags.join(" or ")),
        ));
    }
    Ok(())
}

fn check_ca(field: &str, data: &[u8]) -> Result<(), KubeconfigError> {
    check_pem(field, data, &["CERTIFICATE"])
}

fn ca_ders(data: &[u8]) -> Result<Vec<Vec<u8>>, pem::PemError> {
    Ok(pem::parse_many(data)?
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(pem::Pem::into_contents)
        .collect())
}
