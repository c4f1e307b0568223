//! Input dispatch: decides which handler a host or network packet goes to, and whether the
//! output queues have room for everything it can produce — checked before anything is
//! consumed, so a refusal with back-pressure leaves the SIU unchanged. Non-isotach traffic is
//! passed through here at once, FIFO, never waiting on logical time (requirements 20, 22), and
//! needs room only on the side it goes to.

use super::Siu;
use crate::{Mode, Route, Side, SiuError, Transmit};
use isotach_proto::Input;
use isotach_proto::packet::{
    self, BarrierSignalMarker, EndOfIsochron, Kind, PlainMessage, StartOfIsochron, Token,
};

/// Network-bound packets one isotach packet from the host can yield: one message, a token
/// forward (host mode), or after an end-of-isochron the tokens requirement 26 held back.
const HOST_INPUT_NET_PACKETS_MAX: usize = 2;
/// Host-bound packets one isotach packet from the host can yield: an isochron marker.
const HOST_INPUT_HOST_PACKETS_MAX: usize = 1;
/// Network-bound packets one isotach packet from the network can yield: the next token.
const NET_INPUT_NET_PACKETS_MAX: usize = 1;
/// Host-bound packets one isotach packet from the network can yield: a message, or an EOP
/// and (on a reset) one more EOP.
const NET_INPUT_HOST_PACKETS_MAX: usize = 2;

impl Siu {
    /// Handles one packet from the host.
    pub fn handle_host(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), SiuError> {
        let r = self.host_input(now_us, Input::Borrowed(bytes));
        self.count_error(r)
    }

    /// [`Siu::handle_host`] for a driver that owns the packet's buffer: an isotach message is
    /// stamped in place and sent on in `buf` itself (taken, `buf` left empty), with no copy
    /// and no allocation. A packet refused or not consumed leaves `buf` as it was.
    pub fn handle_host_owned(&mut self, now_us: u64, buf: &mut Vec<u8>) -> Result<(), SiuError> {
        let r = self.host_input(now_us, Input::Owned(buf));
        self.count_error(r)
    }

    /// Handles one packet from the network side.
    pub fn handle_net(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), SiuError> {
        let r = self.net_input(now_us, Input::Borrowed(bytes));
        self.count_error(r)
    }

    /// [`Siu::handle_net`] for a driver that owns the packet's buffer: a message for the host
    /// is handed over in `buf` itself (taken, `buf` left empty). A packet refused or not
    /// consumed leaves `buf` as it was.
    pub fn handle_net_owned(&mut self, now_us: u64, buf: &mut Vec<u8>) -> Result<(), SiuError> {
        let r = self.net_input(now_us, Input::Owned(buf));
        self.count_error(r)
    }

    fn count_error(&mut self, r: Result<(), SiuError>) -> Result<(), SiuError> {
        if r.is_err() {
            self.stats.errors += 1;
        }
        r
    }

    /// Refuses with back-pressure unless the `side`-bound queue can take `needed` more packets.
    pub(super) fn room(&self, side: Side, needed: usize) -> Result<(), SiuError> {
        let limit = self.cfg.limits.queue_packets_max;
        let len = match side {
            Side::Host => self.to_host.len(),
            Side::Net => self.to_net.len(),
        };
        if len + needed > limit {
            return Err(SiuError::Backpressure { side, limit });
        }
        Ok(())
    }

    fn host_input(&mut self, now_us: u64, inp: Input<'_>) -> Result<(), SiuError> {
        let bytes = inp.bytes();
        let decode = |e| SiuError::Decode {
            side: Side::Host,
            error: e,
        };
        let kind = packet::peek_kind(bytes).map_err(decode)?;
        // Non-isotach traffic needs room only where it goes: a full host-bound queue must not
        // hold it up (requirement 20).
        if kind == Kind::Plain {
            self.room(Side::Net, 1)?;
            return self.plain_from_host(inp);
        }
        // Check room for everything an isotach packet can yield first, so a refusal consumes
        // nothing.
        self.room(Side::Net, HOST_INPUT_NET_PACKETS_MAX)?;
        self.room(Side::Host, HOST_INPUT_HOST_PACKETS_MAX)?;
        if kind == Kind::Token {
            if self.cfg.mode != Mode::Host {
                return Err(SiuError::WrongMode {
                    kind,
                    mode: self.cfg.mode,
                });
            }
            return self.token_from_host(now_us, bytes);
        }
        if !self.started {
            packet::Packet::decode(bytes).map_err(decode)?;
            return Err(SiuError::NotStarted);
        }
        if self.host_session_ended {
            packet::Packet::decode(bytes).map_err(decode)?;
            self.stats.host_refused_after_reset += 1;
            return Err(SiuError::SessionEnded);
        }
        // Idle pacing: the host has work, so the next token says BUSY, and if the last one
        // went out idle, a wake-up asks the token manager for speed once the packet is taken.
        self.host_work();
        let taken = match kind {
            Kind::StartOfIsochron => {
                let soi = StartOfIsochron::decode(bytes).map_err(decode)?;
                self.start_isochron(now_us, soi)
            }
            Kind::IsotachMessage => self.message_from_host(inp),
            Kind::EndOfIsochron => {
                let eoi = EndOfIsochron::decode(bytes).map_err(decode)?;
                self.end_isochron(now_us, eoi)
            }
            Kind::BarrierSignalMarker => {
                let m = BarrierSignalMarker::decode(bytes).map_err(decode)?;
                self.barrier_signal_marker(now_us, m)
            }
            Kind::IsochronMarker | Kind::EopMarker | Kind::Token | Kind::Plain => {
                packet::Packet::decode(bytes).map_err(decode)?;
                Err(SiuError::UnexpectedKind {
                    side: Side::Host,
                    kind,
                })
            }
        };
        if taken.is_ok() {
            self.wake();
        }
        taken
    }

    fn net_input(&mut self, now_us: u64, inp: Input<'_>) -> Result<(), SiuError> {
        let bytes = inp.bytes();
        let decode = |e| SiuError::Decode {
            side: Side::Net,
            error: e,
        };
        let kind = match packet::peek_kind(bytes) {
            Ok(k) => k,
            Err(e) => return Err(decode(e)),
        };
        // Non-isotach traffic needs room only on the host side (requirement 20).
        if kind == Kind::Plain {
            self.room(Side::Host, 1)?;
            PlainMessage::parse(bytes).map_err(decode)?;
            self.stats.plain_to_host += 1;
            self.to_host.push_back(inp.into_vec());
            self.host_fed_plain |= self.cfg.host_turns;
            return Ok(());
        }
        self.room(Side::Net, NET_INPUT_NET_PACKETS_MAX)?;
        self.room(Side::Host, NET_INPUT_HOST_PACKETS_MAX)?;
        match kind {
            Kind::Token => match Token::decode(bytes) {
                Ok(t) => self.token_from_net(now_us, t, bytes),
                Err(e) => {
                    self.stats.tokens_bad += 1;
                    Err(decode(e))
                }
            },
            Kind::IsotachMessage => self.message_from_net(inp),
            _ => {
                packet::Packet::decode(bytes).map_err(decode)?;
                Err(SiuError::UnexpectedKind {
                    side: Side::Net,
                    kind,
                })
            }
        }
    }

    /// A non-isotach packet from the host goes straight to its destination host.
    fn plain_from_host(&mut self, inp: Input<'_>) -> Result<(), SiuError> {
        let m = PlainMessage::parse(inp.bytes()).map_err(|e| SiuError::Decode {
            side: Side::Host,
            error: e,
        })?;
        let dest = m.dest;
        if usize::from(dest) >= self.cfg.topology.host_count() {
            return Err(SiuError::NoSuchHost(dest));
        }
        self.stats.plain_to_net += 1;
        self.to_net.push_back(Transmit {
            route: Route::Host(dest),
            // The host's buffer when the driver handed it over (`handle_host_owned`).
            bytes: inp.into_vec(),
        });
        Ok(())
    }
}
