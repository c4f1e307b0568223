//! The byte generator: builds host-side packets as bytes.

use crate::bouncer::TokenBits;
use isotach_proto::Generation;
use isotach_proto::WaveSeq;
use isotach_proto::packet::{
    BarrierSignalMarker, CRC_LEN, EndOfIsochron, IsotachMessage, PlainMessage, Sref, SrefOp,
    StartOfIsochron, Token, Width,
};
use isotach_proto::topology::{HostId, Topology};
use std::collections::VecDeque;

/// Plays the host: the seed report's "byte generator".
///
/// Every builder returns the encoded packet and remembers it, so
/// [`ByteGenerator::resend_previous`] can send it again. In host mode it also runs the host's
/// side of the token protocol: it numbers its tokens and keeps the last two for repeats.
#[derive(Debug)]
pub struct ByteGenerator {
    host: HostId,
    generation: Generation,
    tokens_sent: u64,
    last_two: VecDeque<Token>,
    previous: Option<Vec<u8>>,
}

impl ByteGenerator {
    /// A generator for `host`.
    pub fn new(host: HostId) -> Self {
        Self {
            host,
            generation: Generation::NONE,
            tokens_sent: 0,
            last_two: VecDeque::new(),
            previous: None,
        }
    }

    fn keep(&mut self, bytes: Vec<u8>) -> Vec<u8> {
        self.previous = Some(bytes.clone());
        bytes
    }

    /// The host it plays.
    pub fn host(&self) -> HostId {
        self.host
    }

    /// A start of isochron: logged, channel 0, set 0, no send delta.
    pub fn soi(&mut self, iso_id: u32, distance: u16) -> Vec<u8> {
        self.soi_with(StartOfIsochron {
            iso_id,
            logged: true,
            distance,
            ..StartOfIsochron::default()
        })
    }

    /// A start of isochron with every field given.
    pub fn soi_with(&mut self, soi: StartOfIsochron) -> Vec<u8> {
        let mut v = Vec::new();
        soi.encode(&mut v);
        self.keep(v)
    }

    /// An isotach message carrying a 64-bit `write` of `value` to `addr` at `dest`. The TS,
    /// source, sequum and generation fields are zero: the SIU stamps them.
    pub fn write(&mut self, dest: HostId, addr: u64, value: u64) -> Vec<u8> {
        self.message(
            dest,
            Sref::Mem {
                op: SrefOp::Write,
                width: Width::W64,
                addr,
                value,
                ref_id: 0,
            },
        )
    }

    /// An isotach message carrying any sref.
    pub fn message(&mut self, dest: HostId, sref: Sref) -> Vec<u8> {
        let m = IsotachMessage::unstamped(dest, sref);
        let mut v = Vec::with_capacity(m.encoded_len());
        m.encode(&mut v);
        self.keep(v)
    }

    /// An end of isochron.
    pub fn eoi(&mut self, iso_id: u32) -> Vec<u8> {
        let mut v = Vec::new();
        EndOfIsochron { iso_id }.encode(&mut v);
        self.keep(v)
    }

    /// A whole isochron: `soi`, one write per `(dest, value)` (address = value), end.
    pub fn isochron(&mut self, soi: StartOfIsochron, writes: &[(HostId, u64)]) -> Vec<Vec<u8>> {
        let mut out = vec![self.soi_with(soi)];
        for &(dest, value) in writes {
            out.push(self.write(dest, value, value));
        }
        out.push(self.eoi(soi.iso_id));
        out
    }

    /// A barrier/signal marker.
    pub fn barrier_marker(&mut self, marker: BarrierSignalMarker) -> Vec<u8> {
        let mut v = Vec::new();
        marker.encode(&mut v);
        self.keep(v)
    }

    /// A non-isotach message from this host to `dest`.
    pub fn plain(&mut self, dest: HostId, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        PlainMessage {
            source: self.host,
            dest,
            payload: payload.to_vec(),
        }
        .encode(&mut v);
        self.keep(v)
    }

    // ---------------------------------------------------------------------------------------
    // Host mode tokens

    fn token(&self, seq: u8, bits: TokenBits) -> Token {
        Token {
            seq: WaveSeq::from_bits(seq),
            repeat: false,
            reset: bits.reset,
            end_of_epoch: bits.end_of_epoch,
            restart: false,
            busy: false,
            barrier: bits.barrier,
            signals: bits.signals,
            source_port: Topology::host_port(self.host),
            generation: self.generation,
        }
    }

    /// Host mode: adopts `generation` (after the SIU reported a reset) and numbers tokens from 1.
    pub fn adopt_generation(&mut self, generation: Generation) {
        self.generation = generation;
        self.tokens_sent = 0;
        self.last_two.clear();
    }

    /// Host mode: a reset token starting `generation`.
    pub fn reset_token(&mut self, generation: Generation) -> Vec<u8> {
        self.adopt_generation(generation);
        let t = Token {
            restart: true,
            ..self.token(0, TokenBits::default())
        };
        self.keep(t.to_bytes().to_vec())
    }

    /// Host mode: the next normal token.
    pub fn host_token(&mut self, bits: TokenBits) -> Vec<u8> {
        self.tokens_sent += 1;
        let t = self.token((WaveSeq::of_wave(self.tokens_sent)).bits(), bits);
        if self.last_two.len() == 2 {
            self.last_two.pop_front();
        }
        self.last_two.push_back(t);
        self.keep(t.to_bytes().to_vec())
    }

    /// Host mode: an early token (the sequence number after the next one); not remembered.
    pub fn early_token(&mut self) -> Vec<u8> {
        let t = self.token(
            (WaveSeq::of_wave(self.tokens_sent + 2)).bits(),
            TokenBits::default(),
        );
        self.keep(t.to_bytes().to_vec())
    }

    /// Host mode: the last two tokens again, oldest first, marked repeat (the lost-token
    /// algorithm).
    pub fn repeats(&mut self) -> Vec<Vec<u8>> {
        let v: Vec<Vec<u8>> = self
            .last_two
            .iter()
            .map(|t| Token { repeat: true, ..*t }.to_bytes().to_vec())
            .collect();
        if let Some(last) = v.last() {
            self.previous = Some(last.clone());
        }
        v
    }

    /// Host mode: normal tokens built in this generation.
    pub fn tokens_sent(&self) -> u64 {
        self.tokens_sent
    }

    // ---------------------------------------------------------------------------------------
    // Faults

    /// The previous packet again, byte for byte.
    pub fn resend_previous(&self) -> Option<Vec<u8>> {
        self.previous.clone()
    }

    /// `bytes` with one bit of the trailing CRC flipped.
    pub fn corrupt_crc(bytes: &[u8]) -> Vec<u8> {
        let mut v = bytes.to_vec();
        if let Some(at) = v.len().checked_sub(CRC_LEN) {
            v[at] ^= 0x01;
        }
        v
    }
}
