//! Reading a cluster config and the link a node of it uses: shared by the daemons
//! (`isotach tm|siu|philo`) and the wire tools (`isotach tool`).

use crate::UsageError;
use isotach_am::backend::quic::QuicIdentity;
use isotach_proto::config::{ClusterConfig, TransportKind};
use std::path::Path;

/// Loads the config.
pub(crate) fn load(path: &Path) -> Result<ClusterConfig, UsageError> {
    ClusterConfig::load(path).map_err(|e| UsageError(e.to_string()))
}

/// How a daemon or application of this config reaches its peers.
#[derive(Debug)]
pub(crate) enum Link {
    /// AM over UDP.
    Udp,
    /// AM over QUIC, presenting this identity.
    Quic(QuicIdentity),
}

impl Link {
    /// The link of node `name` (a switch or host of `cluster`, read from `config`): for QUIC
    /// its certificate files are read and checked now, so a bad file is a usage error naming
    /// the config's line and key, not a failed handshake later.
    pub(crate) fn of(
        cluster: &ClusterConfig,
        config: &Path,
        name: &str,
    ) -> Result<Self, UsageError> {
        match cluster.transport.kind {
            TransportKind::Udp => Ok(Self::Udp),
            TransportKind::Quic => crate::config_cmd::node_identity(cluster, config, name)
                .map(Self::Quic)
                .map_err(|e| UsageError(e.to_string())),
        }
    }
}
