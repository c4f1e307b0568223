//! `isotach tool bounce`: the token manager's side of an SIU, played by the harness's
//! [`TokenBouncer`]: answers the SIU's tokens, optionally mixes in isotach messages.

use crate::UsageError;
use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::packet::{BARRIER_MASK, IsotachMessage, MSG_PAYLOAD_MAX, Sref, SrefOp, Width};
use isotach_proto::topology::HostId;
use isotach_tools::{TokenBits, TokenBouncer, XorShift};
use std::process::ExitCode;
use std::time::Duration;

use super::describe::{is_token, print};
use super::{
    BounceArgs, Plays, StartMode, ToolPort, deadline, flush, open_port, resolve, timed_out,
};

pub(super) fn bounce(a: BounceArgs) -> anyhow::Result<ExitCode> {
    let r = resolve(&a.target, Plays::Tm)?;
    if a.barrier & !BARRIER_MASK != 0 {
        return Err(UsageError(format!(
            "--barrier {:#b}: only bits 0 and 1 exist",
            a.barrier
        ))
        .into());
    }
    if a.payload_max > MSG_PAYLOAD_MAX {
        return Err(UsageError(format!("--payload-max is at most {MSG_PAYLOAD_MAX}")).into());
    }
    let host = a.host_id.or(r.host).unwrap_or(0);
    let switch = a.switch_id.or(r.switch).unwrap_or(0);
    let start = match a.start {
        StartMode::Auto => host != 0,
        StartMode::Yes => true,
        StartMode::No => false,
    };
    with_port!(&r, port => {
    let mut b = TokenBouncer::new(switch);
    if let Some(n) = a.pause_after {
        b.pause_after(n);
    }
    if let Some(k) = a.repeat_every {
        b.repeat_every(k);
    }
    if let Some(k) = a.early_every {
        b.early_every(k);
    }
    if let Some(e) = a.epoch_pulses {
        b.epoch_pulses(e);
    }
    b.echo_barriers(a.echo_barriers);
    let bits_every = a.bits_every.max(1);
    let bits = TokenBits {
        barrier: a.barrier,
        signals: a.signals,
        ..TokenBits::default()
    };
    let mut rng = XorShift::new(a.seed);
    let deadline = deadline(&a.target);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut started = false;
    let mut wave_seen = 0;
    let mut sequum = 0u64;
    loop {
        port.poll()?;
        if start && !started && port.is_up(0) {
            started = true;
            b.start(b.generation().next());
        }
        while let Some((_, bytes)) = port.recv() {
            if !(a.only_non_tokens && is_token(&bytes)) {
                print(&mut out, Some("in"), &bytes, a.target.json)?;
            }
            b.handle(&bytes);
        }
        // A new wave went out: bits for the next one, and messages of the current pulse.
        if b.waves_sent() != wave_seen {
            wave_seen = b.waves_sent();
            let next = wave_seen + 1;
            if (bits.barrier | bits.signals) != 0 && next.is_multiple_of(bits_every) {
                b.set_bits(next, bits);
            }
            for _ in 0..rng.range(0, a.messages_max) {
                sequum += 1;
                b.send_message(&random_message(
                    &mut rng,
                    host,
                    wave_seen,
                    sequum,
                    a.payload_max,
                ));
            }
        }
        while let Some(bytes) = b.poll() {
            if !(a.only_non_tokens && is_token(&bytes)) {
                print(&mut out, Some("out"), &bytes, a.target.json)?;
            }
            port.send(0, &bytes)?;
        }
        port.poll()?;
        if a.waves
            .is_some_and(|n| b.waves_sent() >= n && b.accepted() >= n)
        {
            flush(&mut port, deadline)?;
            return Ok(ExitCode::SUCCESS);
        }
        if timed_out(deadline) {
            eprintln!(
                "tool bounce: timed out after {} waves sent, {} tokens accepted",
                b.waves_sent(),
                b.accepted()
            );
            return Ok(ExitCode::from(crate::EXIT_FAILED));
        }
        port.wait(Duration::from_millis(5))?;
    }
    })
}

/// An isotach message for `dest` with TS `ts` from a random other host (a `msg` sref with a
/// random payload of 0..=`payload_max` bytes).
fn random_message(
    rng: &mut XorShift,
    dest: HostId,
    ts: u64,
    sequum: u64,
    payload_max: usize,
) -> IsotachMessage {
    let len = rng.range(0, payload_max as u64) as usize;
    let payload = (0..len).map(|_| rng.next_u64() as u8).collect();
    let source = (dest + 1 + rng.below(7) as u16) & 0x7fff;
    let sref = if len == 0 && rng.chance(1, 2) {
        Sref::Mem {
            op: SrefOp::Write,
            width: Width::W64,
            addr: sequum,
            value: ts,
            ref_id: 0,
        }
    } else {
        Sref::Msg {
            handler: rng.below(4) as u16,
            payload,
        }
    };
    IsotachMessage {
        ts: Pulse::new(ts),
        source,
        dest,
        sequum,
        // `TokenBouncer::send_message` stamps its generation.
        generation: Generation::new(0),
        sref,
    }
}
