//! TLS to PostgreSQL as libpq's `sslmode` means it, through rustls (ring):
//! `verify-full` checks the chain and the host name, `verify-ca` the chain only, `require` and
//! `prefer` encrypt without checking unless `sslrootcert` is given (then as `verify-ca`, like
//! libpq); `sslcert`/`sslkey` present a client certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::database::{PostgresSettings, TlsMode};
use crate::{Result, StoreError};

fn config_err(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("database {what} {}: {e}", path.display()))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client configuration for these settings (`None` for `sslmode=disable`).
pub(super) fn client_config(s: &PostgresSettings) -> Result<Option<ClientConfig>> {
    if s.tls == TlsMode::Disable {
        return Ok(None);
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Config(format!("database TLS: {e}")))?;
    let roots = match &s.root_cert {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| config_err("sslrootcert", path, e))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| config_err("sslrootcert", path, e))?;
            if certs.is_empty() {
                return Err(config_err("sslrootcert", path, "holds no certificate"));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| config_err("sslrootcert", path, e))?;
            }
            Some(Arc::new(roots))
        }
        None => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (s.tls, roots) {
        (TlsMode::VerifyFull, Some(roots)) => {
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| StoreError::Config(format!("database TLS: {e}")))?
        }
        (_, Some(roots)) => Arc::new(ChainOnly(
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| StoreError::Config(format!("database TLS: {e}")))?,
        )),
        (TlsMode::VerifyFull | TlsMode::VerifyCa, None) => {
            return Err(StoreError::Config(
                "database sslmode verify-ca and verify-full need sslrootcert".to_owned(),
            ));
        }
        (_, None) => Arc::new(Unverified(provider())),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &s.client_cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|e| config_err("sslcert", cert, e))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| config_err("sslcert", cert, e))?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| config_err("sslkey", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| StoreError::Config(format!("database sslcert/sslkey: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Some(config))
}

/// `verify-ca`: the chain must lead to the CA; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require`/`prefer` without `sslrootcert`: encrypted, the server not authenticated (libpq's
/// meaning of those modes). Signatures are still checked, so the session key is the server's.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
