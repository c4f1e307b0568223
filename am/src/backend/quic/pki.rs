//! The cluster's certificates for the QUIC backend: a CA ([`make_ca`]), node identities it
//! issues ([`make_node_identity`]), loading them from PEM ([`identity_from_pem`]) and checking
//! one before it is used ([`check_identity`]).

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

use std::sync::Arc;

use super::SERVER_NAME;
use crate::AmError;

/// A cluster certificate authority (what `isotach cert` would create).
pub struct CertAuthority {
    pub(super) params: CertificateParams,
    pub(super) key: KeyPair,
    pub(super) cert_der: Vec<u8>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority").finish_non_exhaustive()
    }
}

impl CertAuthority {
    /// The CA certificate (DER), which every node trusts.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }
}

pub(super) fn tls_err(e: impl std::fmt::Display) -> AmError {
    AmError::Backend(e.to_string())
}

/// Make a self-signed cluster CA.
pub fn make_ca(common_name: &str) -> Result<CertAuthority, AmError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().map_err(tls_err)?;
    let cert = params.self_signed(&key).map_err(tls_err)?;
    Ok(CertAuthority {
        cert_der: cert.der().to_vec(),
        params,
        key,
    })
}

/// What a node needs for QUIC: the CA it trusts, its certificate and its private key.
#[derive(Clone, Debug)]
pub struct QuicIdentity {
    /// DER of the cluster CA certificate.
    pub ca_der: Vec<u8>,
    /// DER of this node's certificate (signed by the CA).
    pub cert_der: Vec<u8>,
    /// PKCS#8 DER of this node's private key.
    pub key_der: Vec<u8>,
}

/// Issue a node certificate (SANs: [`SERVER_NAME`] and `node_name`) signed by `ca`.
pub fn make_node_identity(ca: &CertAuthority, node_name: &str) -> Result<QuicIdentity, AmError> {
    let mut params = CertificateParams::new(vec![SERVER_NAME.to_string(), node_name.to_string()])
        .map_err(tls_err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, node_name);
    let key = KeyPair::generate().map_err(tls_err)?;
    let issuer = Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).map_err(tls_err)?;
    Ok(QuicIdentity {
        ca_der: ca.cert_der.clone(),
        cert_der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    })
}

/// A node identity from PEM text, as `isotach cert` writes it: the cluster CA certificate
/// (`ca.pem`), this node's certificate (`NAME.pem`, the first certificate in it is used) and
/// its PKCS#8 private key (`NAME.key`). The node certificate is checked here, so a mismatch
/// is reported at startup rather than as a failed handshake: it must be signed by the CA,
/// be valid now and carry the SAN [`SERVER_NAME`].
pub fn identity_from_pem(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<QuicIdentity, AmError> {
    use rustls::pki_types::pem::PemObject;
    fn pem_err(what: &'static str) -> impl Fn(rustls::pki_types::pem::Error) -> AmError {
        move |e| AmError::Backend(format!("{what}: {e}"))
    }
    let ca = CertificateDer::from_pem_slice(ca_pem).map_err(pem_err("CA certificate"))?;
    let cert = CertificateDer::from_pem_slice(cert_pem).map_err(pem_err("node certificate"))?;
    let key = PrivatePkcs8KeyDer::from_pem_slice(key_pem).map_err(pem_err("node key (PKCS#8)"))?;
    let identity = QuicIdentity {
        ca_der: ca.to_vec(),
        cert_der: cert.to_vec(),
        key_der: key.secret_pkcs8_der().to_vec(),
    };
    check_identity(&identity)?;
    Ok(identity)
}

/// Checks that `identity`'s certificate chains to its CA, is valid now and names
/// [`SERVER_NAME`] — what every peer will check in the handshake.
pub fn check_identity(identity: &QuicIdentity) -> Result<(), AmError> {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(identity.ca_der.clone()))
        .map_err(|e| AmError::Backend(format!("CA certificate: {e}")))?;
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(tls_err)?;
    let name = ServerName::try_from(SERVER_NAME).map_err(tls_err)?;
    verifier
        .verify_server_cert(
            &CertificateDer::from(identity.cert_der.clone()),
            &[],
            &name,
            &[],
            UnixTime::now(),
        )
        .map_err(|e| AmError::Backend(format!("node certificate: {e}")))?;
    Ok(())
}
