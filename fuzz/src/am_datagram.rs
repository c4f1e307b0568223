//! The AM datagram decoder: a datagram holds one frame or several back to back
//! (`isotach_am_proto::frame::frames`).

use isotach_am_proto::frame::{self, FrameError, HEADER_LEN, TRAILER_LEN};

/// Fuzzes `frame::frames` on `data` as given (so the CRC checks are fuzzed) and with the CRC
/// of every frame its header delimits repaired (so the fuzzer reaches the field checks of the
/// frames behind the first). Each time: no panic; the frames come out in order up to at most
/// one error, then nothing; re-encoding the frames accepted gives back exactly the bytes they
/// came from; without an error they cover the whole datagram; `frame::decode` accepts the
/// datagram exactly when it is one whole frame.
pub fn check_am_datagram(data: &[u8]) {
    check_once(data);
    check_once(&with_frame_crcs(data));
}

fn check_once(data: &[u8]) {
    let mut it = frame::frames(data);
    let (mut used, mut accepted, mut error) = (0, 0usize, None);
    for item in it.by_ref() {
        match item {
            Ok(f) => {
                let mut again = Vec::new();
                frame::append(
                    &f.h,
                    &f.args[..usize::from(f.h.nargs)],
                    f.payload,
                    &mut again,
                );
                let len = again.len();
                assert_eq!(
                    &data[used..used + len],
                    &again[..],
                    "frame {accepted} re-encodes to other bytes"
                );
                used += len;
                accepted += 1;
            }
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    assert!(it.next().is_none(), "nothing after an error or the end");
    match error {
        None => assert_eq!(used, data.len(), "a clean end is the end of the datagram"),
        Some(FrameError::TooShort(n)) => {
            assert_eq!(n, data.len() - used);
            assert!(n < HEADER_LEN + TRAILER_LEN);
        }
        Some(FrameError::LengthMismatch { expected, actual }) => {
            assert_eq!(actual, data.len() - used);
            assert!(expected > actual, "a frame is refused only when cut short");
        }
        // Any other refusal reads a whole header and trailer first.
        Some(e) => assert!(data.len() - used >= HEADER_LEN + TRAILER_LEN, "{e:?}"),
    }
    let whole = frame::decode(data);
    assert_eq!(whole.is_ok(), error.is_none() && accepted == 1);
}

/// `data` with the CRC trailer of each frame its header delimits (72 + 8 × nargs + payload
/// length + 4 bytes, from byte 6 and bytes 68–69) set right, as long as the frames fit.
pub fn with_frame_crcs(data: &[u8]) -> Vec<u8> {
    let mut d = data.to_vec();
    let mut at = 0;
    while let Some(h) = d.get(at..at + HEADER_LEN) {
        let len = HEADER_LEN
            + 8 * usize::from(h[6])
            + usize::from(u16::from_le_bytes([h[68], h[69]]))
            + TRAILER_LEN;
        let Some(f) = d.get_mut(at..at + len) else {
            break;
        };
        let crc = crc32fast::hash(&f[..len - TRAILER_LEN]);
        f[len - TRAILER_LEN..].copy_from_slice(&crc.to_le_bytes());
        at += len;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use isotach_am_proto::Class;
    use isotach_am_proto::frame::{Header, Kind};

    /// Two frames and a cut one: the repaired datagram gives both frames, then the cut.
    #[test]
    fn the_check_reaches_several_frames_and_a_cut_one() {
        let mut d = Vec::new();
        let mut h = Header::new(Kind::Request, Class::Medium);
        h.nargs = 1;
        h.total_len = 3;
        h.frag_len = 3;
        frame::append(&h, &[9], b"abc", &mut d);
        frame::append(&Header::new(Kind::Ack, Class::Short), &[], &[], &mut d);
        assert_eq!(frame::frames(&d).filter(Result::is_ok).count(), 2);
        check_am_datagram(&d);
        let mut spoilt = d.clone();
        let n = spoilt.len();
        spoilt[n - 1] ^= 1; // the second CRC
        assert_eq!(with_frame_crcs(&spoilt), d, "repair restores the CRC");
        d.extend_from_slice(&d.clone()[..50]);
        assert!(matches!(
            frame::frames(&d).nth(2),
            Some(Err(FrameError::TooShort(50)))
        ));
        check_am_datagram(&d);
    }
}
