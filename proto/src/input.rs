//! An input's bytes, borrowed from the driver or in a buffer the driver lets a state machine
//! take: a packet sent on as it came (a message the token manager forwards, one the SIU
//! stamps in place or hands to its host) then leaves in that very buffer instead of a copy
//! (`TokenManager::handle_input_owned`, `Siu::handle_host_owned`, `Siu::handle_net_owned`).

/// The bytes of one input.
#[derive(Debug)]
pub enum Input<'a> {
    /// The driver keeps the buffer: what is forwarded is copied out.
    Borrowed(&'a [u8]),
    /// The driver's buffer: what is forwarded takes it, leaving it empty.
    Owned(&'a mut Vec<u8>),
}

impl Input<'_> {
    /// The input's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Self::Borrowed(b) => b,
            Self::Owned(v) => v.as_slice(),
        }
    }

    /// The bytes in a buffer of their own: the driver's, taken, or a copy.
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Self::Borrowed(b) => b.to_vec(),
            Self::Owned(v) => std::mem::take(v),
        }
    }
}
