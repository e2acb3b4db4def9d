//! The throwaway PKI of one TLS server, made with rcgen: a CA, the server's certificate for
//! 127.0.0.1 and `localhost` (so `sslmode=verify-full` passes against 127.0.0.1), and client
//! certificates whose common name is a role name (for the `cert` authentication method).

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub(crate) struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAndKey")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The CA, kept with its key so client certificates can be signed later.
pub(crate) struct Pki {
    pub ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("ca_pem", &self.ca_pem)
            .finish_non_exhaustive()
    }
}

fn pki_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Pki { what, source }
}

impl Pki {
    /// A fresh CA (ECDSA P-256) named for the run, so CAs of two runs never share a subject
    /// (a client given the wrong one then fails verification plainly).
    pub fn generate(run_id: &str) -> Result<Self> {
        let ca_key = KeyPair::generate().map_err(pki_err("CA key"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki_err("CA"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(
            DnType::CommonName,
            format!("clawfleet-pg-tests CA {run_id}"),
        );
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = params.self_signed(&ca_key).map_err(pki_err("CA"))?;
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            issuer: Issuer::new(params, ca_key),
        })
    }

    /// The server's certificate: `IP:127.0.0.1` and `DNS:localhost`.
    pub fn server_cert(&self) -> Result<CertAndKey> {
        self.leaf(
            "clawfleet-pg-tests server",
            vec!["localhost".to_string()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate whose common name is `role` (PostgreSQL's `cert` method compares it
    /// with the user name).
    pub fn client_cert(&self, role: &str) -> Result<CertAndKey> {
        self.leaf(role, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(
        &self,
        common_name: &str,
        dns_names: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<CertAndKey> {
        let server = usage == ExtendedKeyUsagePurpose::ServerAuth;
        let what = if server {
            "server certificate"
        } else {
            "client certificate"
        };
        let key = KeyPair::generate().map_err(pki_err(what))?;
        let mut params = CertificateParams::new(dns_names).map_err(pki_err(what))?;
        if server {
            params
                .subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(pki_err(what))?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_pem_material_without_printing_keys() {
        let pki = Pki::generate("1-ab").unwrap();
        assert!(pki.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let server = pki.server_cert().unwrap();
        assert!(server.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(server.key_pem.contains("PRIVATE KEY"));
        let client = pki.client_cert("alice").unwrap();
        assert_ne!(client.cert_pem, server.cert_pem);
        assert!(!format!("{client:?} {pki:?}").contains("PRIVATE KEY"));
    }
}
