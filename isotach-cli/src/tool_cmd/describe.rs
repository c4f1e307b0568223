//! How the tools print a packet: a line of text (`DIR KIND field=value …`) or one JSON object.

use isotach_proto::packet::{Packet, RmwOp, Sref};
use serde_json::{Value, json};
use std::io::Write;

use super::hex;

/// One packet as a line of text: `DIR KIND field=value …`.
pub(crate) fn describe(bytes: &[u8]) -> String {
    let p = match Packet::decode(bytes) {
        Ok(p) => p,
        Err(e) => return format!("undecodable ({e}) {}", hex(bytes)),
    };
    let bits = |flags: &[(&str, bool)]| -> String {
        flags
            .iter()
            .filter(|f| f.1)
            .map(|f| format!(" {}", f.0))
            .collect()
    };
    match p {
        Packet::Token(t) => format!(
            "token seq={} gen={} port={:#06x} barrier={:#04b} signals={:#04x}{}",
            t.seq,
            t.generation,
            t.source_port,
            t.barrier,
            t.signals,
            bits(&[
                ("repeat", t.repeat),
                ("reset", t.reset),
                ("end-of-epoch", t.end_of_epoch),
                ("restart", t.restart),
            ])
        ),
        Packet::StartOfIsochron(s) => format!(
            "soi iso={} channel={} set={} distance={} send-delta={} gap={}{}",
            s.iso_id,
            s.channel,
            s.seqset,
            s.distance,
            s.send_delta,
            s.gap,
            bits(&[("logged", s.logged), ("host-gap", s.host_gap)])
        ),
        Packet::IsotachMessage(m) => format!(
            "message ts={} source={} dest={} sequum={} {}",
            m.ts,
            m.source,
            m.dest,
            m.sequum,
            match &m.sref {
                Sref::Mem {
                    op,
                    width,
                    addr,
                    value,
                    ref_id,
                } => format!(
                    "{op:?} w{} addr={addr:#x} value={value} ref={ref_id}",
                    *width as u8 * 8
                ),
                Sref::Rmw(r) => format!(
                    "{:?} w{} addr={:#x} arg={} arg2={} ref={} answer={}",
                    r.op,
                    r.width as u8 * 8,
                    r.addr,
                    r.arg,
                    r.arg2,
                    r.ref_id,
                    r.answer
                ),
                Sref::Msg { handler, payload } =>
                    format!("msg handler={handler} payload={}", hex(payload)),
            }
        ),
        Packet::EndOfIsochron(e) => format!("eoi iso={}", e.iso_id),
        Packet::IsochronMarker(m) => format!(
            "marker iso={} source={} ts={} sequum={} crc-xor={:#010x}",
            m.iso_id, m.source, m.ts, m.sequum, m.crc_xor
        ),
        Packet::EopMarker(e) => format!(
            "eop ts={} count={} barrier={:#04b} signals={:#04x} token-kind={:#04x} token-crc={:#010x} sort={:?}{}",
            e.ts,
            e.count,
            e.barrier,
            e.signals,
            e.token_kind,
            e.token_crc,
            e.sort_vector,
            bits(&[
                ("repeat", e.repeat),
                ("reset", e.reset),
                ("end-of-epoch", e.end_of_epoch)
            ])
        ),
        Packet::BarrierSignalMarker(b) => format!(
            "barrier-signal barrier={:#04b} count={} signals={:#04x}{}",
            b.barrier,
            b.barrier_count,
            b.signals,
            bits(&[("reset", b.reset)])
        ),
        Packet::Plain(m) => format!(
            "plain source={} dest={} payload={}",
            m.source,
            m.dest,
            hex(&m.payload)
        ),
    }
}

/// One packet as a JSON object (`kind` plus its fields; `error` and `hex` if undecodable).
pub(crate) fn to_json(bytes: &[u8]) -> Value {
    let p = match Packet::decode(bytes) {
        Ok(p) => p,
        Err(e) => return json!({"kind": "undecodable", "error": e.to_string(), "hex": hex(bytes)}),
    };
    match p {
        Packet::Token(t) => json!({
            "kind": "token", "seq": t.seq.bits(), "generation": t.generation.get(),
            "source_port": t.source_port, "barrier": t.barrier, "signals": t.signals,
            "repeat": t.repeat, "reset": t.reset, "end_of_epoch": t.end_of_epoch,
            "restart": t.restart,
        }),
        Packet::StartOfIsochron(s) => json!({
            "kind": "soi", "iso_id": s.iso_id, "channel": s.channel, "seqset": s.seqset,
            "logged": s.logged, "host_gap": s.host_gap, "gap": s.gap,
            "send_delta": s.send_delta, "distance": s.distance,
        }),
        Packet::IsotachMessage(m) => {
            let sref = match &m.sref {
                Sref::Mem {
                    op,
                    width,
                    addr,
                    value,
                    ref_id,
                } => json!({"op": format!("{op:?}").to_lowercase(), "width_bits": *width as u8 * 8,
                    "addr": addr, "value": value, "ref_id": ref_id}),
                Sref::Rmw(r) => {
                    let func = if let RmwOp::Apply(f) = r.op {
                        Some(f)
                    } else {
                        None
                    };
                    json!({"op": format!("{:?}", r.op.op()).to_lowercase(), "func": func,
                        "width_bits": r.width as u8 * 8, "addr": r.addr, "arg": r.arg,
                        "arg2": r.arg2, "ref_id": r.ref_id, "answer": r.answer})
                }
                Sref::Msg { handler, payload } => {
                    json!({"op": "msg", "handler": handler, "payload": hex(payload)})
                }
            };
            json!({"kind": "message", "ts": m.ts.get(), "source": m.source, "dest": m.dest,
                "sequum": m.sequum, "sref": sref})
        }
        Packet::EndOfIsochron(e) => json!({"kind": "eoi", "iso_id": e.iso_id}),
        Packet::IsochronMarker(m) => json!({
            "kind": "marker", "iso_id": m.iso_id, "source": m.source, "ts": m.ts.get(),
            "sequum": m.sequum, "crc_xor": m.crc_xor,
        }),
        Packet::EopMarker(e) => json!({
            "kind": "eop", "ts": e.ts.get(), "count": e.count, "repeat": e.repeat, "reset": e.reset,
            "end_of_epoch": e.end_of_epoch, "signals": e.signals, "barrier": e.barrier,
            "token_kind": e.token_kind, "token_crc": e.token_crc, "sort_vector": e.sort_vector,
        }),
        Packet::BarrierSignalMarker(b) => json!({
            "kind": "barrier_signal", "barrier": b.barrier, "barrier_count": b.barrier_count,
            "signals": b.signals, "reset": b.reset,
        }),
        Packet::Plain(m) => json!({
            "kind": "plain", "source": m.source, "dest": m.dest, "payload": hex(&m.payload),
        }),
    }
}

/// Prints one packet; `dir` (`in`/`out`) prefixes text lines and is a `dir` key in JSON.
pub(super) fn print(
    out: &mut impl Write,
    dir: Option<&str>,
    bytes: &[u8],
    json: bool,
) -> std::io::Result<()> {
    if json {
        let mut v = to_json(bytes);
        if let (Some(d), Some(o)) = (dir, v.as_object_mut()) {
            o.insert("dir".into(), Value::from(d));
        }
        writeln!(out, "{v}")
    } else {
        match dir {
            Some(d) => writeln!(out, "{d:<3} {}", describe(bytes)),
            None => writeln!(out, "{}", describe(bytes)),
        }
    }
}

pub(super) fn is_token(bytes: &[u8]) -> bool {
    matches!(
        isotach_proto::packet::peek_kind(bytes),
        Ok(isotach_proto::packet::Kind::Token)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use isotach_proto::{Generation, WaveSeq};

    #[test]
    fn describes_and_jsons_a_token() {
        let t = isotach_proto::packet::Token {
            seq: WaveSeq::from_bits(2),
            repeat: true,
            generation: Generation::new(3),
            source_port: 0x8000,
            ..Default::default()
        };
        let b = t.to_bytes();
        let line = describe(&b);
        assert!(line.starts_with("token seq=2 gen=3 port=0x8000"), "{line}");
        assert!(line.ends_with(" repeat"), "{line}");
        let v = to_json(&b);
        assert_eq!(v["kind"], "token");
        assert_eq!(v["seq"], 2);
        assert_eq!(v["repeat"], true);
        assert_eq!(to_json(&[1, 2])["kind"], "undecodable");
    }
}
