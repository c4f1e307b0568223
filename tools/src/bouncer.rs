//! The token bouncer: plays the token manager on one SIU link.

use isotach_proto::Generation;
use isotach_proto::WaveSeq;
use isotach_proto::packet::{BARRIER_MASK, DecodeError, IsotachMessage, Packet, Token};
use isotach_proto::topology::{SwitchId, Topology};
use isotach_proto::wave::{Arrival, classify};
use std::collections::{BTreeMap, VecDeque};

/// Flag bits a token carries besides its sequence number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenBits {
    /// Barrier bits.
    pub barrier: u8,
    /// Signal bits.
    pub signals: u8,
    /// End-of-epoch flag.
    pub end_of_epoch: bool,
    /// Reset signal (same generation: a signal, not a restart).
    pub reset: bool,
}

/// Why the bouncer sent a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRole {
    /// A reset token starting a generation (sequence number 0).
    Reset,
    /// Normal token of this wave number (1, 2, 3, …).
    Wave(u64),
    /// A resend of this wave's token, marked repeat (the lost-token algorithm).
    Repeat(u64),
    /// A deliberately early token: the sequence number after the next one.
    Early,
}

/// A token the bouncer sent, with its exact bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentToken {
    /// The token.
    pub token: Token,
    /// Its encoding (the SIU copies the kind byte and CRC into EOP markers).
    pub bytes: Vec<u8>,
    /// Why it was sent.
    pub role: TokenRole,
}

/// Plays the token manager for one SIU: the seed report's "token bouncer".
///
/// It follows the wave rule of a token manager with a single neighbour: wave 1 is free after a
/// reset, wave `k + 1` goes out once the SIU's token `k` arrived (so the reply to sequence number
/// `r` carries `(r + 1) mod 4`), and wave 1 carries both barrier bits (the initial credit).
/// Everything queued with [`TokenBouncer::send`] goes out before the next token.
#[derive(Debug)]
pub struct TokenBouncer {
    port: u16,
    generation: Generation,
    started: bool,
    waves_sent: u64,
    accepted: u64,
    /// Most waves it may send (`None`: no pause).
    limit: Option<u64>,
    early_every: Option<u64>,
    repeat_every: Option<u64>,
    epoch_pulses: Option<u64>,
    echo_barriers: bool,
    barrier_echo_pending: u8,
    bits: BTreeMap<u64, TokenBits>,
    last_two: VecDeque<(u64, Token)>,
    out: VecDeque<Vec<u8>>,
    sent: Vec<SentToken>,
    received: Vec<Packet>,
    undecodable: Vec<(Vec<u8>, DecodeError)>,
    heard_tokens: Vec<(Token, Option<Arrival>)>,
}

impl TokenBouncer {
    /// A bouncer speaking as the token manager of `switch` (source port `0x8000 | switch`).
    pub fn new(switch: SwitchId) -> Self {
        Self {
            port: Topology::switch_port(switch),
            generation: Generation::NONE,
            started: false,
            waves_sent: 0,
            accepted: 0,
            limit: None,
            early_every: None,
            repeat_every: None,
            epoch_pulses: None,
            echo_barriers: false,
            barrier_echo_pending: 0,
            bits: BTreeMap::new(),
            last_two: VecDeque::new(),
            out: VecDeque::new(),
            sent: Vec::new(),
            received: Vec::new(),
            undecodable: Vec::new(),
            heard_tokens: Vec::new(),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Knobs

    /// Sends no wave beyond `waves` until [`TokenBouncer::release`] or [`TokenBouncer::resume`].
    pub fn pause_after(&mut self, waves: u64) {
        self.limit = Some(waves);
    }

    /// Allows `waves` more waves than the current pause allows, and sends what is due.
    pub fn release(&mut self, waves: u64) {
        if let Some(limit) = self.limit.as_mut() {
            *limit = (*limit).max(self.waves_sent) + waves;
        }
        self.try_send();
    }

    /// Lifts the pause.
    pub fn resume(&mut self) {
        self.limit = None;
        self.try_send();
    }

    /// Before every `k`-th wave, also send an early token (the sequence number after it).
    pub fn early_every(&mut self, k: u64) {
        self.early_every = Some(k.max(1));
    }

    /// After every `k`-th wave, resend the last two tokens marked repeat.
    pub fn repeat_every(&mut self, k: u64) {
        self.repeat_every = Some(k.max(1));
    }

    /// Marks every wave that is a multiple of `pulses` as the end of an epoch.
    pub fn epoch_pulses(&mut self, pulses: u64) {
        self.epoch_pulses = Some(pulses.max(1));
    }

    /// Behaves like a token manager with one host: a barrier bit on the SIU's token (after its
    /// first) is answered with that bit on the next wave.
    pub fn echo_barriers(&mut self, on: bool) {
        self.echo_barriers = on;
    }

    /// Bits for the token of wave `wave` (ORed with the credit, the echo and the epoch flag).
    pub fn set_bits(&mut self, wave: u64, bits: TokenBits) {
        self.bits.insert(wave, bits);
    }

    /// Bits for the next wave.
    pub fn set_next_bits(&mut self, bits: TokenBits) {
        self.set_bits(self.waves_sent + 1, bits);
    }

    // ---------------------------------------------------------------------------------------
    // Sending

    /// Starts `generation` (must be newer than the current one): a reset token, then wave 1.
    pub fn start(&mut self, generation: Generation) {
        assert!(
            generation.newer_than(self.generation),
            "a reset needs a newer generation"
        );
        self.restart(generation);
    }

    /// Queues any packet; it goes out before the next token.
    pub fn send(&mut self, bytes: Vec<u8>) {
        self.out.push_back(bytes);
    }

    /// Queues an isotach message (as if forwarded from another host) before the next token,
    /// in the bouncer's generation whatever `message.generation` says (as its source SIU
    /// would have stamped it). [`TokenBouncer::send`] sends any bytes as they are.
    pub fn send_message(&mut self, message: &IsotachMessage) {
        let message = IsotachMessage {
            generation: self.generation,
            ..message.clone()
        };
        let mut bytes = Vec::with_capacity(message.encoded_len());
        message.encode(&mut bytes);
        self.send(bytes);
    }

    /// The token timer elapsed: resend the last two tokens, oldest first, marked repeat.
    pub fn fire_timer(&mut self) {
        let repeats: Vec<(u64, Token)> = self.last_two.iter().copied().collect();
        for (wave, t) in repeats {
            self.push(Token { repeat: true, ..t }, TokenRole::Repeat(wave));
        }
    }

    /// Next packet for the SIU.
    pub fn poll(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    // ---------------------------------------------------------------------------------------
    // Receiving

    /// Handles one packet from the SIU's network side.
    pub fn handle(&mut self, bytes: &[u8]) {
        match Packet::decode(bytes) {
            Ok(packet) => {
                if let Packet::Token(t) = packet {
                    self.token(t);
                }
                self.received.push(packet);
            }
            Err(e) => self.undecodable.push((bytes.to_vec(), e)),
        }
    }

    fn token(&mut self, t: Token) {
        if t.restart {
            // The SIU initiated a restart: echo it and start the generation, as a TM does. A
            // repeat of a restart already taken changes nothing.
            self.heard_tokens.push((t, None));
            if t.generation.newer_than(self.generation) {
                self.restart(t.generation);
            }
            return;
        }
        if !self.started || t.generation != self.generation {
            self.heard_tokens.push((t, None));
            return;
        }
        let arrival = classify(self.accepted, t.seq);
        self.heard_tokens.push((t, Some(arrival)));
        if arrival == Arrival::InSequence {
            self.accepted += 1;
            if self.echo_barriers && self.accepted > 1 {
                self.barrier_echo_pending |= t.barrier;
            }
            self.try_send();
        }
    }

    fn restart(&mut self, generation: Generation) {
        self.generation = generation;
        self.started = true;
        self.waves_sent = 0;
        self.accepted = 0;
        self.last_two.clear();
        self.barrier_echo_pending = 0;
        let reset = Token {
            restart: true,
            source_port: self.port,
            generation,
            ..Token::default()
        };
        self.push(reset, TokenRole::Reset);
        self.try_send();
    }

    fn try_send(&mut self) {
        while self.started
            && self.accepted >= self.waves_sent
            && self.limit.is_none_or(|l| self.waves_sent < l)
        {
            self.send_wave();
        }
    }

    fn send_wave(&mut self) {
        let wave = self.waves_sent + 1;
        let base = Token {
            source_port: self.port,
            generation: self.generation,
            ..Token::default()
        };
        if self.early_every.is_some_and(|k| wave.is_multiple_of(k)) {
            let early = Token {
                seq: WaveSeq::of_wave(wave + 1),
                ..base
            };
            self.push(early, TokenRole::Early);
        }
        let bits = self.bits.remove(&wave).unwrap_or_default();
        let mut barrier = bits.barrier | std::mem::take(&mut self.barrier_echo_pending);
        if wave == 1 {
            barrier |= BARRIER_MASK;
        }
        let token = Token {
            seq: WaveSeq::of_wave(wave),
            barrier: barrier & BARRIER_MASK,
            signals: bits.signals,
            reset: bits.reset,
            end_of_epoch: bits.end_of_epoch
                || self.epoch_pulses.is_some_and(|e| wave.is_multiple_of(e)),
            ..base
        };
        self.push(token, TokenRole::Wave(wave));
        if self.last_two.len() == 2 {
            self.last_two.pop_front();
        }
        self.last_two.push_back((wave, token));
        self.waves_sent = wave;
        if self.repeat_every.is_some_and(|k| wave.is_multiple_of(k)) {
            self.fire_timer();
        }
    }

    fn push(&mut self, token: Token, role: TokenRole) {
        let bytes = token.to_bytes().to_vec();
        self.out.push_back(bytes.clone());
        self.sent.push(SentToken { token, bytes, role });
    }

    // ---------------------------------------------------------------------------------------
    // Observers

    /// Its token source port.
    pub fn port(&self) -> u16 {
        self.port
    }
    /// The generation it runs.
    pub fn generation(&self) -> Generation {
        self.generation
    }
    /// Normal tokens (waves) sent in this generation.
    pub fn waves_sent(&self) -> u64 {
        self.waves_sent
    }
    /// In-sequence tokens accepted from the SIU in this generation: the SIU's sendclock as the
    /// wire shows it.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }
    /// Tokens from the SIU it dropped as duplicates (repeats).
    pub fn duplicates(&self) -> usize {
        self.count_heard(Arrival::Duplicate)
    }
    /// Tokens from the SIU it dropped as early.
    pub fn early(&self) -> usize {
        self.count_heard(Arrival::Early)
    }
    fn count_heard(&self, arrival: Arrival) -> usize {
        self.heard_tokens
            .iter()
            .filter(|(_, a)| *a == Some(arrival))
            .count()
    }
    /// Every token it sent, in order.
    pub fn sent(&self) -> &[SentToken] {
        &self.sent
    }
    /// The normal token of `wave` in the current generation (the last one sent with that role).
    pub fn wave_token(&self, wave: u64) -> Option<&SentToken> {
        self.sent
            .iter()
            .rev()
            .find(|s| s.role == TokenRole::Wave(wave))
    }
    /// Every packet it heard from the SIU, in order.
    pub fn received(&self) -> &[Packet] {
        &self.received
    }
    /// Bytes it could not decode, with the reason.
    pub fn undecodable(&self) -> &[(Vec<u8>, DecodeError)] {
        &self.undecodable
    }
    /// Tokens it heard, in order.
    pub fn tokens_received(&self) -> impl Iterator<Item = &Token> {
        self.received.iter().filter_map(|p| match p {
            Packet::Token(t) => Some(t),
            _ => None,
        })
    }
    /// Tokens it heard, each with how it classified it (`None`: a reset token of a new
    /// generation, or a token of another generation).
    pub fn heard_tokens(&self) -> &[(Token, Option<Arrival>)] {
        &self.heard_tokens
    }
    /// Tokens it accepted in sequence (in this and earlier generations), in order.
    pub fn accepted_tokens(&self) -> impl Iterator<Item = &Token> {
        self.heard_tokens
            .iter()
            .filter(|(_, a)| *a == Some(Arrival::InSequence))
            .map(|(t, _)| t)
    }
    /// Isotach messages it heard, in order.
    pub fn messages_received(&self) -> impl Iterator<Item = &IsotachMessage> {
        self.received.iter().filter_map(|p| match p {
            Packet::IsotachMessage(m) => Some(m),
            _ => None,
        })
    }
}
