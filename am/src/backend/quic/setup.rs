//! Setting a QUIC node up: its TLS and transport configurations and its endpoint.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::pki::tls_err;
use super::wire_loss::{WireLoss, WireLossSocket};
use super::{ALPN, QuicConfig};
use crate::AmError;

/// The server and client configurations of a node with `cfg`'s identity: both ends present
/// a certificate of the cluster CA, TLS 1.3 only.
pub(super) fn configs(
    cfg: &QuicConfig,
) -> Result<(quinn::ServerConfig, quinn::ClientConfig), AmError> {
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
    let qs = quinn::crypto::rustls::QuicServerConfig::try_from(server).map_err(tls_err)?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(qs));
    sc.transport_config(transport.clone());
    let qc = quinn::crypto::rustls::QuicClientConfig::try_from(client).map_err(tls_err)?;
    let mut cc = quinn::ClientConfig::new(Arc::new(qc));
    cc.transport_config(transport);
    Ok((sc, cc))
}

/// A server-and-client endpoint on a socket bound to `cfg.bind`, losing what it sends as
/// `loss` draws if given (a test hook). Call inside the backend's runtime.
pub(super) fn endpoint(
    sc: quinn::ServerConfig,
    cfg: &QuicConfig,
    loss: Option<Arc<WireLoss>>,
) -> std::io::Result<quinn::Endpoint> {
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let mut socket = runtime.wrap_udp_socket(std::net::UdpSocket::bind(cfg.bind)?)?;
    if let Some(loss) = loss {
        socket = Arc::new(WireLossSocket::new(socket, loss));
    }
    quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some(sc),
        socket,
        runtime,
    )
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
fn ack_frequency() -> quinn::AckFrequencyConfig {
    let mut a = quinn::AckFrequencyConfig::default();
    a.ack_eliciting_threshold(quinn::VarInt::from_u32(ACK_ELICITING_THRESHOLD))
        .max_ack_delay(Some(MAX_ACK_DELAY));
    a
}

/// QUIC's transport settings for `cfg`.
pub(super) fn transport_config(cfg: &QuicConfig) -> Result<quinn::TransportConfig, AmError> {
    let mut transport = quinn::TransportConfig::default();
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
