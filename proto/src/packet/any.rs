//! Any packet: the [`Packet`] enum, decoded by its kind byte.

use super::{
    BarrierSignalMarker, DecodeError, EndOfIsochron, EopMarker, IsochronMarker, IsotachMessage,
    Kind, PlainMessage, StartOfIsochron, Token, peek_kind,
};

/// Any data-plane packet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Packet {
    /// See [`Token`].
    Token(Token),
    /// See [`StartOfIsochron`].
    StartOfIsochron(StartOfIsochron),
    /// See [`IsotachMessage`].
    IsotachMessage(IsotachMessage),
    /// See [`EndOfIsochron`].
    EndOfIsochron(EndOfIsochron),
    /// See [`IsochronMarker`].
    IsochronMarker(IsochronMarker),
    /// See [`EopMarker`].
    EopMarker(EopMarker),
    /// See [`BarrierSignalMarker`].
    BarrierSignalMarker(BarrierSignalMarker),
    /// See [`PlainMessage`].
    Plain(PlainMessage),
}

impl Packet {
    /// The packet's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Token(_) => Kind::Token,
            Self::StartOfIsochron(_) => Kind::StartOfIsochron,
            Self::IsotachMessage(_) => Kind::IsotachMessage,
            Self::EndOfIsochron(_) => Kind::EndOfIsochron,
            Self::IsochronMarker(_) => Kind::IsochronMarker,
            Self::EopMarker(_) => Kind::EopMarker,
            Self::BarrierSignalMarker(_) => Kind::BarrierSignalMarker,
            Self::Plain(_) => Kind::Plain,
        }
    }

    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        match self {
            Self::Token(p) => p.encode(out),
            Self::StartOfIsochron(p) => p.encode(out),
            Self::IsotachMessage(p) => p.encode(out),
            Self::EndOfIsochron(p) => p.encode(out),
            Self::IsochronMarker(p) => p.encode(out),
            Self::EopMarker(p) => p.encode(out),
            Self::BarrierSignalMarker(p) => p.encode(out),
            Self::Plain(p) => p.encode(out),
        }
    }

    /// Encodes into a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }

    /// Decodes any packet.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Ok(match peek_kind(bytes)? {
            Kind::Token => Self::Token(Token::decode(bytes)?),
            Kind::StartOfIsochron => Self::StartOfIsochron(StartOfIsochron::decode(bytes)?),
            Kind::IsotachMessage => Self::IsotachMessage(IsotachMessage::decode(bytes)?),
            Kind::EndOfIsochron => Self::EndOfIsochron(EndOfIsochron::decode(bytes)?),
            Kind::IsochronMarker => Self::IsochronMarker(IsochronMarker::decode(bytes)?),
            Kind::EopMarker => Self::EopMarker(EopMarker::decode(bytes)?),
            Kind::BarrierSignalMarker => {
                Self::BarrierSignalMarker(BarrierSignalMarker::decode(bytes)?)
            }
            Kind::Plain => Self::Plain(PlainMessage::decode(bytes)?),
        })
    }
}
