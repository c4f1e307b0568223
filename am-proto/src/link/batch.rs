//! The payload of a batch message ([`H_BATCH`](super::H_BATCH)), pure: one or more whole
//! packets, each prefixed by its length (`u16`, little-endian), filling at most one medium
//! payload ([`FRAGMENT_MAX`] bytes). The format's version travels in the message's arguments
//! ([`BATCH_VERSION`]), not in the payload.
//!
//! Encoding appends to a buffer the caller owns and reuses; decoding walks slices of the
//! payload ([`packets`]): it never allocates and never panics, and after the first error it
//! yields nothing more, so a receiver gets exactly the valid packets before a bad one.

use super::FRAGMENT_MAX;

/// The batch format this link writes and reads (argument 0 of [`H_BATCH`](super::H_BATCH)).
pub const BATCH_VERSION: u64 = 1;
/// Bytes of a packet's length prefix.
pub const LEN_PREFIX: usize = 2;
/// Largest packet a batch carries: a medium payload less one length prefix. A longer packet
/// travels as data fragments.
pub const BATCH_PACKET_MAX: usize = FRAGMENT_MAX - LEN_PREFIX;
/// Most packets in one batch. It bounds the packets one window slot carries, and so the
/// receiver's inbox (`peers × WINDOW_MAX × BATCH_PACKETS_MAX` packets): 64 × 18 bytes (a
/// token and its prefix) is about one medium payload. A sender stops a batch there; a
/// receiver takes the first this many and treats the rest as a bad batch.
pub const BATCH_PACKETS_MAX: usize = 64;
/// Fewest packets a sender puts in a batch: a single packet goes as a data fragment (the same
/// message without the prefix). A receiver accepts a batch of one.
pub const BATCH_PACKETS_MIN: usize = 2;

// A prefix can state every packet a batch carries, and a batch can hold more than one.
const _: () = {
    assert!(BATCH_PACKET_MAX <= u16::MAX as usize);
    assert!(BATCH_PACKETS_MIN >= 2 && BATCH_PACKETS_MIN <= BATCH_PACKETS_MAX);
    assert!(BATCH_PACKETS_MIN * LEN_PREFIX <= FRAGMENT_MAX);
};

/// Bytes a packet of `len` bytes takes in a batch.
pub fn entry_len(len: usize) -> usize {
    LEN_PREFIX + len
}

/// Can a packet of `len` bytes join a batch that holds `packets` packets in `used` bytes?
pub fn fits(used: usize, packets: usize, len: usize) -> bool {
    packets < BATCH_PACKETS_MAX && len <= BATCH_PACKET_MAX && used + entry_len(len) <= FRAGMENT_MAX
}

/// Appends `packet` and its length prefix to the batch in `buf` if it fits the payload;
/// false (and `buf` unchanged) otherwise. Counting packets against [`BATCH_PACKETS_MAX`] is
/// the caller's ([`fits`]).
pub fn push(buf: &mut Vec<u8>, packet: &[u8]) -> bool {
    let Ok(len) = u16::try_from(packet.len()) else {
        return false;
    };
    if buf.len() + entry_len(packet.len()) > FRAGMENT_MAX {
        return false;
    }
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(packet);
    debug_assert!(
        buf.len() <= FRAGMENT_MAX,
        "a batch fills one medium payload"
    );
    true
}

/// Is `version` a batch format this link reads?
pub fn version_known(version: u64) -> bool {
    version == BATCH_VERSION
}

/// Why a batch's packets end before its payload does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchError {
    /// The payload holds no packet at all.
    Empty,
    /// A length prefix, or the packet it announces, runs past the payload's end.
    Truncated,
    /// More than [`BATCH_PACKETS_MAX`] packets.
    TooMany,
}

/// The packets of a batch payload, in order: each as a slice of `payload`, then at most one
/// error, then nothing.
pub fn packets(payload: &[u8]) -> Packets<'_> {
    Packets {
        rest: payload,
        taken: 0,
        done: false,
    }
}

/// Iterator of [`packets`].
#[derive(Debug, Clone)]
pub struct Packets<'a> {
    /// The payload after the packets taken so far.
    rest: &'a [u8],
    /// Packets taken so far.
    taken: usize,
    /// An error was yielded, or the payload ended.
    done: bool,
}

impl<'a> Iterator for Packets<'a> {
    type Item = Result<&'a [u8], BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.step();
        self.done = !matches!(item, Some(Ok(_)));
        item
    }
}

impl<'a> Packets<'a> {
    /// The next packet or the error that ends the batch (`None`: the payload ended well).
    fn step(&mut self) -> Option<Result<&'a [u8], BatchError>> {
        if self.rest.is_empty() {
            return (self.taken == 0).then_some(Err(BatchError::Empty));
        }
        if self.taken == BATCH_PACKETS_MAX {
            return Some(Err(BatchError::TooMany));
        }
        let Some((packet, rest)) = split_packet(self.rest) else {
            return Some(Err(BatchError::Truncated));
        };
        self.rest = rest;
        self.taken += 1;
        debug_assert!(self.taken <= BATCH_PACKETS_MAX);
        Some(Ok(packet))
    }
}

/// The packet at the start of `bytes` and what follows it; `None` when its prefix or its
/// bytes run past the end.
fn split_packet(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (prefix, rest) = bytes.split_first_chunk::<LEN_PREFIX>()?;
    let len = usize::from(u16::from_le_bytes(*prefix));
    (len <= rest.len()).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(packets: &[&[u8]]) -> Vec<u8> {
        let mut buf = Vec::new();
        for p in packets {
            assert!(push(&mut buf, p));
        }
        buf
    }

    #[test]
    fn packets_come_back_in_order_with_their_prefixes() {
        let buf = encode(&[b"token", b"", b"message"]);
        assert_eq!(&buf[..7], &[5, 0, b't', b'o', b'k', b'e', b'n']);
        let got: Vec<_> = packets(&buf).collect();
        assert_eq!(got, [Ok(&b"token"[..]), Ok(&b""[..]), Ok(&b"message"[..])]);
    }

    #[test]
    fn a_full_payload_takes_no_more() {
        let mut buf = Vec::new();
        assert!(push(&mut buf, &[7; BATCH_PACKET_MAX]));
        assert_eq!(buf.len(), FRAGMENT_MAX);
        assert!(!push(&mut buf, b""), "not even an empty packet");
        assert_eq!(buf.len(), FRAGMENT_MAX, "unchanged");
        assert!(!push(&mut Vec::new(), &[0; BATCH_PACKET_MAX + 1]));
        assert!(fits(0, 0, BATCH_PACKET_MAX));
        assert!(!fits(0, 0, BATCH_PACKET_MAX + 1));
        assert!(
            !fits(0, BATCH_PACKETS_MAX, 0),
            "the packet count bounds a batch"
        );
        assert!(!fits(FRAGMENT_MAX - 2, 1, 1));
        assert!(fits(FRAGMENT_MAX - 2, 1, 0));
    }

    #[test]
    fn a_bad_batch_gives_the_valid_packets_then_one_error() {
        let mut buf = encode(&[b"one", b"two"]);
        buf.extend_from_slice(&[9, 0, b'x']); // announces 9 bytes, holds 1
        let got: Vec<_> = packets(&buf).collect();
        assert_eq!(
            got,
            [Ok(&b"one"[..]), Ok(&b"two"[..]), Err(BatchError::Truncated)]
        );
        // Half a prefix.
        let got: Vec<_> = packets(&[3, 0, 1, 2, 3, 4]).collect();
        assert_eq!(got, [Ok(&[1, 2, 3][..]), Err(BatchError::Truncated)]);
        assert_eq!(packets(&[]).collect::<Vec<_>>(), [Err(BatchError::Empty)]);
        let many = vec![0u8; LEN_PREFIX * (BATCH_PACKETS_MAX + 1)];
        let got: Vec<_> = packets(&many).collect();
        assert_eq!(got.len(), BATCH_PACKETS_MAX + 1);
        assert!(got[..BATCH_PACKETS_MAX].iter().all(|p| *p == Ok(&[][..])));
        assert_eq!(got[BATCH_PACKETS_MAX], Err(BatchError::TooMany));
    }

    #[test]
    fn versions() {
        assert!(version_known(BATCH_VERSION));
        assert!(!version_known(0) && !version_known(2) && !version_known(u64::MAX));
    }
}
