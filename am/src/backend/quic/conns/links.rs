//! Which connection carries the datagrams to one peer address ([`Link`]), and the rule that
//! makes both ends of a pair send on the same one.
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

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quinn_proto::{Connection, ConnectionError, ConnectionHandle};

use super::Conns;
use crate::backend::quic::Counters;

/// How long the losing connection of a simultaneous open stays open, so that what was sent on
/// it before both ends chose still arrives.
pub(in crate::backend::quic) const DUPLICATE_GRACE: Duration = Duration::from_secs(1);
/// TLS exporter label of the choice tag.
const CHOICE_LABEL: &[u8] = b"isotach-am/1 connection choice";

/// Where datagrams to one peer address go.
pub(super) enum Link {
    /// Our connection `ch` is being established; datagrams wait (at most [`CONNECT_QUEUE`]).
    Connecting {
        ch: ConnectionHandle,
        queue: VecDeque<Bytes>,
    },
    /// On connection `ch`; `spare` is the other one of a simultaneous open, or the peer's
    /// newer one that lost to a connection we opened: it takes over if `ch` closes.
    Ready {
        ch: ConnectionHandle,
        spare: Option<ConnectionHandle>,
    },
    /// The last attempt failed then.
    Failed(Instant),
}

impl Conns {
    /// Connection `ch` completed its handshake: it carries the datagrams to its peer, unless
    /// a simultaneous open's other connection wins the tags.
    pub(super) fn adopt(&mut self, ch: ConnectionHandle, now: Instant) {
        let Some(e) = self.entries.get_mut(&ch) else {
            return;
        };
        e.connected = true;
        let (addr, ours) = (e.conn.remote_address(), e.ours);
        let link = match self.links.remove(&addr) {
            Some(Link::Ready { ch: cur, .. })
                if cur != ch && self.is_open(cur) && self.ours(cur) != ours =>
            {
                // One connection opened by each end: both keep the one with the smaller tag;
                // the other is the spare, closed after the grace by the end that opened it.
                let (keep, spare) = if self.smaller_tag(ch, cur) {
                    (ch, cur)
                } else {
                    (cur, ch)
                };
                if let Some(s) = self.entries.get_mut(&spare)
                    && s.ours
                {
                    s.retire_at = Some(now + DUPLICATE_GRACE);
                }
                Link::Ready {
                    ch: keep,
                    spare: Some(spare),
                }
            }
            Some(Link::Connecting { queue, .. }) => {
                for b in queue {
                    if self.send_on(ch, b) {
                        self.stats.sent += 1;
                    }
                }
                Link::Ready { ch, spare: None }
            }
            // None, one that failed, or the peer's previous one (it opened another: it
            // restarted, and the old one is dead).
            _ => Link::Ready { ch, spare: None },
        };
        self.links.insert(addr, link);
    }

    /// Connection `ch` was lost (`reason`): counted, and forgotten.
    pub(super) fn lost(&mut self, ch: ConnectionHandle, reason: &ConnectionError, now: Instant) {
        let Some(e) = self.entries.get(&ch) else {
            return;
        };
        let (addr, ours, connected) = (e.conn.remote_address(), e.ours, e.connected);
        let c = &self.counters;
        c.ended(reason);
        if !connected && ours {
            c.failed(
                &c.connects_failed,
                format!("connection to {addr}: {reason}"),
            );
        } else if !connected {
            c.failed(&c.refused, format!("handshake from {addr}: {reason}"));
        }
        self.forget(addr, ch, now);
    }

    /// `ch`, to `addr`, is closed (or gone): if datagrams waited for it they are lost and the
    /// address is marked failed; if it was in use its spare takes over (or the link goes); if
    /// it was the spare, there is none. (A connection that lost to the peer's own stays out of
    /// the link, which the peer's keeps.)
    pub(super) fn forget(&mut self, addr: SocketAddr, ch: ConnectionHandle, now: Instant) {
        let (cur, spare) = match self.links.get(&addr) {
            Some(Link::Connecting { ch: c, queue }) if *c == ch => {
                Counters::add(&self.counters.send_dropped, queue.len());
                self.links.insert(addr, Link::Failed(now));
                return;
            }
            Some(Link::Ready { ch: cur, spare }) => (*cur, *spare),
            _ => return,
        };
        if spare == Some(ch) {
            self.links.insert(
                addr,
                Link::Ready {
                    ch: cur,
                    spare: None,
                },
            );
        } else if cur == ch {
            match spare.filter(|&s| self.is_open(s)) {
                Some(s) => self.links.insert(addr, Link::Ready { ch: s, spare: None }),
                None => self.links.remove(&addr),
            };
        }
    }

    /// Closes `ch`, a connection we opened that lost a simultaneous open — unless it took
    /// over meanwhile (the winner closed).
    pub(super) fn retire(&mut self, ch: ConnectionHandle, now: Instant) {
        let Some(e) = self.entries.get_mut(&ch) else {
            return;
        };
        let addr = e.conn.remote_address();
        let in_use =
            matches!(self.links.get(&addr), Some(Link::Ready { ch: cur, .. }) if *cur == ch);
        if !in_use {
            e.conn.close(
                now,
                0u32.into(),
                Bytes::from_static(b"duplicate connection"),
            );
            self.forget(addr, ch, now);
        }
    }

    pub(super) fn is_open(&self, ch: ConnectionHandle) -> bool {
        self.entries.get(&ch).is_some_and(|e| !e.conn.is_closed())
    }

    fn ours(&self, ch: ConnectionHandle) -> bool {
        self.entries.get(&ch).is_some_and(|e| e.ours)
    }

    fn choice_tag(&self, ch: ConnectionHandle) -> Option<[u8; 16]> {
        choice_tag(&self.entries.get(&ch)?.conn)
    }

    /// Of two connections to one peer, one opened by each end, does `a` have the smaller
    /// choice tag? Both ends answer alike. (Without tags, which a connection that completed
    /// its handshake always has, the one the peer opened.)
    fn smaller_tag(&self, a: ConnectionHandle, b: ConnectionHandle) -> bool {
        match (self.choice_tag(a), self.choice_tag(b)) {
            (Some(a), Some(b)) => a < b,
            _ => !self.ours(a),
        }
    }

    /// The choice tag of the connection datagrams to `addr` go on, and whether a spare is
    /// held (a test hook: both ends of a pair must report the same tag).
    #[cfg(test)]
    pub(in crate::backend::quic) fn in_use(&self, addr: SocketAddr) -> Option<([u8; 16], bool)> {
        match self.links.get(&addr) {
            Some(Link::Ready { ch, spare }) => Some((self.choice_tag(*ch)?, spare.is_some())),
            _ => None,
        }
    }
}

/// The choice tag of `conn` (`None` if its handshake keys cannot give one, which a connection
/// that completed its handshake always can).
fn choice_tag(conn: &Connection) -> Option<[u8; 16]> {
    let mut tag = [0u8; 16];
    conn.crypto_session()
        .export_keying_material(&mut tag, CHOICE_LABEL, b"")
        .ok()
        .map(|()| tag)
}
