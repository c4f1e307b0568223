//! The cursor the state-machine and link harnesses read their scripts with.

/// A cursor over the fuzz input.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }
    /// Nothing left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    /// Next `n` bytes, or what is left.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (a, b) = self.data.split_at(n);
        self.data = b;
        a
    }
    /// Next byte, or `None` at the end.
    pub fn byte(&mut self) -> Option<u8> {
        self.take(1).first().copied()
    }
    /// Next byte, 0 past the end.
    pub fn u8(&mut self) -> u8 {
        self.byte().unwrap_or(0)
    }
    /// Next big-endian u16, zero-padded past the end.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    /// Next big-endian u32, zero-padded past the end.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }
    /// Next big-endian u64, zero-padded past the end.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) << 32 | u64::from(self.u32())
    }
    /// A length-prefixed byte string (prefix: u16 modulo `max + 1`).
    pub fn blob(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u16()) % (max + 1);
        self.take(n)
    }
}
