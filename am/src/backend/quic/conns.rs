//! The connections of one endpoint: one in use per peer address, and the rule that makes both
//! ends of a pair send on the same one.
//!
//! Two nodes that start together both open a connection to each other (a simultaneous open).
//! If each end sent on the connection the other opened, every connection would carry
//! datagrams one way only, so none of QUIC's acknowledgements could ride in a datagram going
//! back: each would be a packet of its own and a wake-up of the peer's thread. So when a node
//! holds one connection it opened and one it accepted, both ends keep the one with the
//! smaller *choice tag* — a TLS exporter value, the same at both ends of a connection — and
//! the node that opened the other closes it after [`DUPLICATE_GRACE`].
//!
//! A peer that restarted opens a new connection while we may still send on a dead one. If we
//! had accepted the dead one, the new one (the peer's again) replaces it at once. If we had
//! opened it, the tags decide as above; if the dead one wins, the first datagram we send on it
//! draws a stateless reset from the restarted peer (its reset key is derived from its node
//! key, so it survives the restart: see `setup::reset_key`), the dead connection closes, and
//! the new one, kept as the spare, takes over.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::Counters;

/// How long the losing connection of a simultaneous open stays open, so that what was sent on
/// it before both ends chose still arrives.
pub(super) const DUPLICATE_GRACE: Duration = Duration::from_secs(1);
/// TLS exporter label of the choice tag.
const CHOICE_LABEL: &[u8] = b"isotach-am/1 connection choice";

pub(super) enum Conn {
    Connecting(VecDeque<Bytes>),
    Ready(Link),
    Failed(Instant),
}

/// The connection datagrams to one peer go on.
pub(super) struct Link {
    pub(super) conn: quinn::Connection,
    /// This node opened it (rather than accepted it).
    ours: bool,
    /// The other connection of a simultaneous open, or the peer's newer one that lost to a
    /// connection we opened: it takes over if `conn` closes.
    spare: Option<(quinn::Connection, bool)>,
}

impl Link {
    fn new(conn: quinn::Connection, ours: bool) -> Self {
        Self {
            conn,
            ours,
            spare: None,
        }
    }

    /// `conn` closed: a live spare takes over (`true`), or there is none (`false`).
    pub(super) fn replace_closed(&mut self) -> bool {
        match self.spare.take() {
            Some((spare, ours)) if spare.close_reason().is_none() => {
                self.conn = spare;
                self.ours = ours;
                true
            }
            _ => false,
        }
    }
}

pub(super) struct Shared {
    conns: Mutex<HashMap<SocketAddr, Conn>>,
    pub(super) counters: Arc<Counters>,
}

impl Shared {
    pub(super) fn new() -> Self {
        Self {
            conns: Mutex::new(HashMap::new()),
            counters: Arc::default(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<SocketAddr, Conn>> {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The choice tag of `conn` (`None` if its handshake keys cannot give one, which a connection
/// that completed its handshake always can).
pub(super) fn choice_tag(conn: &quinn::Connection) -> Option<[u8; 16]> {
    let mut tag = [0u8; 16];
    conn.export_keying_material(&mut tag, CHOICE_LABEL, b"")
        .ok()
        .map(|()| tag)
}

/// Of two connections to one peer, one opened by each end, does `a` (opened by us if
/// `a_ours`) have the smaller choice tag? Both ends answer alike. (Without tags, which a
/// connection that completed its handshake always has, the one the peer opened.)
fn smaller_tag(a: &quinn::Connection, a_ours: bool, b: &quinn::Connection) -> bool {
    match (choice_tag(a), choice_tag(b)) {
        (Some(a), Some(b)) => a < b,
        _ => !a_ours,
    }
}

/// Register a ready connection (`ours`: we opened it) and pump its datagrams into `tx`.
pub(super) fn adopt(
    shared: &Arc<Shared>,
    tx: &mpsc::Sender<(SocketAddr, Bytes)>,
    conn: quinn::Connection,
    ours: bool,
) {
    let addr = conn.remote_address();
    let mut loser = None;
    {
        let mut conns = shared.lock();
        let link = match conns.remove(&addr) {
            Some(Conn::Ready(cur)) if cur.conn.close_reason().is_none() && cur.ours != ours => {
                // One connection opened by each end: both keep the one with the smaller tag;
                // the other is the spare, closed after the grace by the end that opened it.
                let new = (conn.clone(), ours);
                let old = (cur.conn, cur.ours);
                let (keep, spare) = if smaller_tag(&new.0, new.1, &old.0) {
                    (new, old)
                } else {
                    (old, new)
                };
                if spare.1 {
                    loser = Some(spare.0.clone());
                }
                Link {
                    conn: keep.0,
                    ours: keep.1,
                    spare: Some(spare),
                }
            }
            Some(Conn::Connecting(q)) => {
                for b in q {
                    super::send_ready(&shared.counters, &conn, b);
                }
                Link::new(conn.clone(), ours)
            }
            // None, a closed one, one that failed, or the peer's previous one (it opened
            // another: it restarted, and the old one is dead).
            _ => Link::new(conn.clone(), ours),
        };
        conns.insert(addr, Conn::Ready(link));
    }
    if let Some(loser) = loser {
        retire_later(shared.clone(), addr, loser);
    }
    let (shared, tx) = (shared.clone(), tx.clone());
    tokio::spawn(async move {
        // Never wait for the bundle: quinn would then discard datagrams uncounted.
        loop {
            let b = match conn.read_datagram().await {
                Ok(b) => b,
                Err(e) => {
                    shared.counters.ended(&e);
                    break;
                }
            };
            match tx.try_send((addr, b)) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    Counters::add(&shared.counters.recv_dropped, 1);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => break,
            }
        }
        forget(&shared, addr, &conn);
    });
}

/// Close `loser`, a connection we opened that lost a simultaneous open, after
/// [`DUPLICATE_GRACE`] — unless it took over meanwhile (the winner closed).
fn retire_later(shared: Arc<Shared>, addr: SocketAddr, loser: quinn::Connection) {
    tokio::spawn(async move {
        tokio::time::sleep(DUPLICATE_GRACE).await;
        let in_use = matches!(shared.lock().get(&addr),
            Some(Conn::Ready(l)) if l.conn.stable_id() == loser.stable_id());
        if !in_use {
            loser.close(0u32.into(), b"duplicate connection");
        }
    });
}

/// `conn`, to `addr`, closed: forget it, and let its spare take over if it was in use.
fn forget(shared: &Shared, addr: SocketAddr, conn: &quinn::Connection) {
    let mut conns = shared.lock();
    let Some(Conn::Ready(link)) = conns.get_mut(&addr) else {
        return;
    };
    let id = conn.stable_id();
    if link
        .spare
        .as_ref()
        .is_some_and(|(s, _)| s.stable_id() == id)
    {
        link.spare = None;
    } else if link.conn.stable_id() == id && !link.replace_closed() {
        conns.remove(&addr);
    }
}

/// The choice tag of the connection datagrams to `addr` go on, and whether a spare is held
/// (a test hook: both ends of a pair must report the same tag).
#[cfg(test)]
pub(super) fn in_use(shared: &Shared, addr: SocketAddr) -> Option<([u8; 16], bool)> {
    match shared.lock().get(&addr) {
        Some(Conn::Ready(l)) => Some((choice_tag(&l.conn)?, l.spare.is_some())),
        _ => None,
    }
}
