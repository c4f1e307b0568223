//! Setting a QUIC node up: its TLS and transport configurations and its endpoint.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::pki::tls_err;
use super::{ALPN, QuicConfig};
use crate::AmError;

/// The server and client configurations of a node with `cfg`'s identity: both ends present
/// a certificate of the cluster CA, TLS 1.3 only.
pub(super) fn configs(
    cfg: &QuicConfig,
) -> Result<(quinn_proto::ServerConfig, quinn_proto::ClientConfig), AmError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(cfg.identity.ca_der.clone()))
        .map_err(tls_err)?;
    let roots = Arc::new(roots);
    let cert = vec![CertificateDer::from(cfg.identity.cert_der.clone())];
    let key = || PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cfg.identity.key_der.clone()));
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .map_err(tls_err)?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(cert.clone(), key())
        .map_err(tls_err)?;
    server.alpn_protocols = vec![ALPN.to_vec()];
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_root_certificates(roots)
        .with_client_auth_cert(cert, key())
        .map_err(tls_err)?;
    client.alpn_protocols = vec![ALPN.to_vec()];

    let transport = Arc::new(transport_config(cfg)?);
    let qs = quinn_proto::crypto::rustls::QuicServerConfig::try_from(server).map_err(tls_err)?;
    let mut sc = quinn_proto::ServerConfig::with_crypto(Arc::new(qs));
    sc.transport_config(transport.clone());
    let qc = quinn_proto::crypto::rustls::QuicClientConfig::try_from(client).map_err(tls_err)?;
    let mut cc = quinn_proto::ClientConfig::new(Arc::new(qc));
    cc.transport_config(transport);
    Ok((sc, cc))
}

/// A server-and-client endpoint with `cfg`'s identity and server configuration `sc`;
/// `allow_mtud` unless the socket lets the kernel fragment what it sends.
pub(super) fn endpoint(
    sc: quinn_proto::ServerConfig,
    cfg: &QuicConfig,
    allow_mtud: bool,
) -> quinn_proto::Endpoint {
    quinn_proto::Endpoint::new(
        Arc::new(endpoint_config(cfg)),
        Some(Arc::new(sc)),
        allow_mtud,
        None,
    )
}

/// A secret of the node's own for `purpose`, derived from its private key (`key_der`) so that
/// it survives a restart.
fn node_secret(key_der: &[u8], purpose: &[u8]) -> ring::digest::Digest {
    let mut seed = ring::digest::Context::new(&ring::digest::SHA256);
    seed.update(b"isotach-am/1 ");
    seed.update(purpose);
    seed.update(key_der);
    seed.finish()
}

/// The key of a node's stateless resets (the reset token of a connection ID is an HMAC of it
/// under this key). The same after a restart, so a peer still sending on a connection to the
/// node's previous process draws a reset it accepts, and that connection closes at once
/// instead of at its idle timeout. Secret as the node key is: nobody else can forge resets.
pub(super) fn reset_key(key_der: &[u8]) -> Arc<dyn quinn_proto::crypto::HmacKey> {
    let secret = node_secret(key_der, b"stateless reset key");
    Arc::new(ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        secret.as_ref(),
    ))
}

/// The endpoint settings of a node with `cfg`'s identity: its reset key, and connection IDs
/// it recognises as its own after a restart too (an endpoint answers a packet for an unknown
/// connection with a reset only if the ID passes its generator's check).
pub(super) fn endpoint_config(cfg: &QuicConfig) -> quinn_proto::EndpointConfig {
    let key_der = &cfg.identity.key_der;
    let mut ec = quinn_proto::EndpointConfig::new(reset_key(key_der));
    let cid_key = node_secret(key_der, b"connection id key");
    let cid_key = u64::from_le_bytes(cid_key.as_ref()[..8].try_into().expect("a SHA-256 digest"));
    ec.cid_generator(move || Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key)));
    ec
}

/// Ack-eliciting packets a peer may take before it must acknowledge (QUIC's ACK-frequency
/// extension; quinn's default is 1: an ACK for every second packet).
const ACK_ELICITING_THRESHOLD: u32 = 16;
/// How long a peer may hold an acknowledgement meanwhile.
const MAX_ACK_DELAY: Duration = Duration::from_millis(5);

/// Fewer acknowledgement-only packets: AM traffic is a ping-pong (a token, a wave), so QUIC's
/// acknowledgements nearly always ride in the next datagram the other way, and one sent on
/// its own would wake the peer's thread for nothing. QUIC datagrams are never retransmitted
/// by QUIC (AM does that), so a later acknowledgement only slows its congestion control's
/// reaction by at most [`MAX_ACK_DELAY`].
fn ack_frequency() -> quinn_proto::AckFrequencyConfig {
    let mut a = quinn_proto::AckFrequencyConfig::default();
    a.ack_eliciting_threshold(quinn_proto::VarInt::from_u32(ACK_ELICITING_THRESHOLD))
        .max_ack_delay(Some(MAX_ACK_DELAY));
    a
}

/// QUIC's transport settings for `cfg`.
pub(super) fn transport_config(cfg: &QuicConfig) -> Result<quinn_proto::TransportConfig, AmError> {
    let mut transport = quinn_proto::TransportConfig::default();
    transport
        .initial_mtu(cfg.initial_mtu)
        // The path MTU never drops below the one AM frames are sized for: on loss that looks
        // like a black hole quinn would fall back to 1200 bytes, refuse every full-size
        // fragment and let only a bulk message's short tail through, so the message would
        // never complete however often it is sent again.
        .min_mtu(cfg.initial_mtu)
        .ack_frequency_config(Some(ack_frequency()))
        .datagram_receive_buffer_size(Some(8 << 20))
        .datagram_send_buffer_size(8 << 20)
        .keep_alive_interval(Some(cfg.idle_timeout / 3))
        .max_idle_timeout(Some(cfg.idle_timeout.try_into().map_err(tls_err)?));
    Ok(transport)
}
