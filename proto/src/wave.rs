//! Token sequence numbers and the lost-token buffer, shared by token managers and SIUs.
//!
//! Tokens on a link are numbered 1, 2, 3, … (the *wave number*); the wire carries the number
//! mod 4, so the first token carries `start` = 1 and a reply to `r` carries `(r + 1) mod 4`.
//! On any link the sender is at most two tokens ahead of what the receiver has accepted, and
//! repeats resend only the last two tokens, so the four sequence values are unambiguous: the
//! next one is in sequence, the two before it are duplicates, the one after it is early.

use crate::logical::{Generation, WaveSeq};
use crate::packet::Token;

/// How a token relates to what the receiver has accepted so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The next token: accept it.
    InSequence,
    /// One of the last two accepted tokens again (a repeat): ignore it.
    Duplicate,
    /// A token from beyond the next one (its predecessor was lost): drop it.
    Early,
}

/// Classifies a token with sequence number `seq` when `accepted` tokens were accepted.
pub fn classify(accepted: u64, seq: WaveSeq) -> Arrival {
    let next = WaveSeq::of_wave(accepted + 1);
    match seq.after(next) {
        0 => Arrival::InSequence,
        1 => Arrival::Early,
        _ => Arrival::Duplicate,
    }
}

/// The last two tokens sent on a link, resent (marked repeat) when the token timer elapses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LastTwo {
    older: Option<Token>,
    newer: Option<Token>,
}

impl LastTwo {
    /// Remembers a token just sent (repeats are not remembered again).
    pub fn remember(&mut self, token: Token) {
        debug_assert!(!token.repeat);
        self.older = self.newer.replace(token);
    }

    /// The tokens to resend, oldest first, each marked repeat.
    pub fn repeats(&self) -> impl Iterator<Item = Token> + '_ {
        [self.older, self.newer]
            .into_iter()
            .flatten()
            .map(|t| Token { repeat: true, ..t })
    }

    /// The token sent last (not marked repeat), if any.
    pub fn newest(&self) -> Option<Token> {
        self.newer
    }

    /// Forgets everything (a reset).
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

/// When a daemon starts a new logical-time generation after a broken link (see
/// `docs/operations.md`, "Peer loss and restarts").
///
/// A link breaks when the peer restarted or data to it was lost: the FIFO streams the token
/// protocol relies on have a hole, so the current generation cannot go on. When the peer is
/// back, one side starts generation `g + 1` — but only if logical time is still in the
/// generation `g` it was in when the link broke. If another node already restarted logical
/// time because of the same event, the restart wave got here first (links are FIFO, and a
/// restarted peer's hello precedes its data), and starting another would only cost a second
/// restart. Two nodes that start at once both start `g + 1`: the same wave.
#[derive(Debug, Clone, Default)]
pub struct Rejoin {
    /// Per peer: the generation in force when its link broke.
    broken_in: Vec<Option<Generation>>,
}

impl Rejoin {
    /// A tracker for `peers` peers.
    pub fn new(peers: usize) -> Self {
        Self {
            broken_in: vec![None; peers],
        }
    }

    /// The link to `peer` broke during `generation` (the first break counts until the peer
    /// is back).
    pub fn broken(&mut self, peer: usize, generation: Generation) {
        if let Some(slot) = self.broken_in.get_mut(peer) {
            slot.get_or_insert(generation);
        }
    }

    /// `peer` is back, logical time is in `generation`: should this node start a new one?
    pub fn back(&mut self, peer: usize, generation: Generation) -> bool {
        self.broken_in
            .get_mut(peer)
            .and_then(Option::take)
            .is_some_and(|g| g == generation)
    }

    /// The link to `peer` broke during `generation` and the peer is not back yet.
    pub fn broken_during(&self, peer: usize, generation: Generation) -> bool {
        self.broken_in.get(peer).copied().flatten() == Some(generation)
    }

    /// Peers whose link is broken.
    pub fn pending(&self) -> usize {
        self.broken_in.iter().filter(|g| g.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_covers_the_four_values() {
        // Accepted 5 tokens: 6 is next (seq 2); 5 and 4 are duplicates; 7 is early.
        let seq = WaveSeq::of_wave;
        assert_eq!(classify(5, seq(6)), Arrival::InSequence);
        assert_eq!(classify(5, seq(5)), Arrival::Duplicate);
        assert_eq!(classify(5, seq(4)), Arrival::Duplicate);
        assert_eq!(classify(5, seq(7)), Arrival::Early);
        assert_eq!(
            classify(0, WaveSeq::from_bits(1)),
            Arrival::InSequence,
            "start = 1"
        );
    }

    #[test]
    fn last_two_resends_oldest_first_marked_repeat() {
        let mut l = LastTwo::default();
        for wave in 1..=3 {
            l.remember(Token {
                seq: WaveSeq::of_wave(wave),
                ..Token::default()
            });
        }
        let r: Vec<_> = l.repeats().collect();
        assert_eq!(
            r.iter().map(|t| t.seq.bits()).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert!(r.iter().all(|t| t.repeat));
    }

    #[test]
    fn rejoin_starts_a_generation_only_if_none_started_since_the_break() {
        let g = Generation::new;
        let mut r = Rejoin::new(3);
        assert!(
            !r.back(0, g(5)),
            "a peer coming up the first time starts nothing"
        );
        r.broken(1, g(5));
        r.broken(1, g(6));
        assert_eq!(r.pending(), 1);
        assert!(r.back(1, g(5)), "still in the generation of the break");
        assert!(!r.back(1, g(5)), "once per break");
        r.broken(2, g(5));
        assert!(
            !r.back(2, g(6)),
            "somebody else restarted logical time already"
        );
        r.broken(9, g(1));
        assert!(!r.back(9, g(1)), "unknown peers are ignored");
        assert_eq!(r.pending(), 0);
    }
}
