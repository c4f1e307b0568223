//! An input's bytes, borrowed from the driver or in a buffer the driver lets the token
//! manager take: a message forwarded as it came then leaves in that very buffer instead of a
//! copy (`TokenManager::handle_input_owned`).

/// The bytes of one input.
pub(crate) enum Input<'a> {
    /// The driver keeps the buffer: what is forwarded is copied out.
    Borrowed(&'a [u8]),
    /// The driver's buffer: what is forwarded takes it, leaving it empty.
    Owned(&'a mut Vec<u8>),
}

impl Input<'_> {
    /// The input's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Borrowed(b) => b,
            Self::Owned(v) => v.as_slice(),
        }
    }

    /// The bytes in a buffer of their own: the driver's, taken, or a copy.
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            Self::Borrowed(b) => b.to_vec(),
            Self::Owned(v) => std::mem::take(v),
        }
    }
}
