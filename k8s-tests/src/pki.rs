//! The throwaway PKI of one control plane, made with rcgen (no openssl needed): a CA, the
//! apiserver's serving certificate, the service-account signing key, and on request more
//! serving certificates from the same CA (the fault-injection proxy's).

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// DNS names the apiserver's certificate carries besides 127.0.0.1.
pub const APISERVER_DNS_NAMES: &[&str] = &[
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertAndKey {
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

/// The CA, kept with its key so later certificates (a proxy's) chain to the same trust root.
pub struct Pki {
    pub ca: CertAndKey,
    pub apiserver: CertAndKey,
    /// ECDSA P-256 PKCS#8 private key signing service-account tokens.
    pub service_account_key_pem: String,
    /// Its public key (SubjectPublicKeyInfo PEM), for the apiserver's verification.
    pub service_account_pub_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("ca", &self.ca)
            .field("apiserver", &self.apiserver)
            .finish_non_exhaustive()
    }
}

fn pki_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Pki { what, source }
}

impl Pki {
    /// A fresh CA and the apiserver's certificate and service-account keys.
    pub fn generate() -> Result<Self> {
        let ca_key = KeyPair::generate().map_err(pki_err("CA key"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki_err("CA"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "clawfleet-k8s-tests CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = params.self_signed(&ca_key).map_err(pki_err("CA"))?;
        let ca = CertAndKey {
            cert_pem: ca_cert.pem(),
            key_pem: ca_key.serialize_pem(),
        };
        let issuer = Issuer::new(params, ca_key);
        let apiserver = serving_cert(&issuer, "kube-apiserver", APISERVER_DNS_NAMES, &[])?;
        let sa = KeyPair::generate().map_err(pki_err("service-account key"))?;
        Ok(Pki {
            ca,
            apiserver,
            service_account_key_pem: sa.serialize_pem(),
            service_account_pub_pem: sa.public_key_pem(),
            issuer,
        })
    }

    /// Another serving certificate for 127.0.0.1 (and `dns_names`) signed by this CA.
    pub fn serving_cert(&self, common_name: &str, dns_names: &[&str]) -> Result<CertAndKey> {
        serving_cert(&self.issuer, common_name, dns_names, &[])
    }

    /// [`Pki::serving_cert`] with more IP addresses (the real node's kubelet serves on its
    /// bridge address).
    pub fn serving_cert_with_ips(
        &self,
        common_name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<CertAndKey> {
        serving_cert(&self.issuer, common_name, dns_names, ips)
    }
}

fn serving_cert(
    issuer: &Issuer<'static, KeyPair>,
    common_name: &str,
    dns_names: &[&str],
    ips: &[IpAddr],
) -> Result<CertAndKey> {
    let key = KeyPair::generate().map_err(pki_err("serving key"))?;
    let names: Vec<String> = dns_names.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(names).map_err(pki_err("serving certificate"))?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .signed_by(&key, issuer)
        .map_err(pki_err("serving certificate"))?;
    Ok(CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_pem_material() {
        let pki = Pki::generate().unwrap();
        assert!(pki.ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(
            pki.apiserver
                .cert_pem
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        assert!(pki.apiserver.key_pem.contains("PRIVATE KEY"));
        assert!(pki.service_account_pub_pem.contains("PUBLIC KEY"));
        let other = pki.serving_cert("proxy", &["localhost"]).unwrap();
        assert_ne!(other.cert_pem, pki.apiserver.cert_pem);
        assert!(!format!("{pki:?}").contains("PRIVATE KEY"));
    }
}
