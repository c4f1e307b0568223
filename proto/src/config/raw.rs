//! The config's TOML side: the schema as written (every table refuses unknown keys) and the
//! helpers that turn it into a [`ClusterConfig`](super::ClusterConfig) — tags, transport,
//! timing and limits against their bounds, duplicate addresses, and where an error is (line,
//! column, key).

use super::bounds::{SPIN_US_DEFAULT, TAG_MAX, TAG_MIN, bound, out_of_range, range_for};
use super::{DEFAULT_TAG, Limits, Span, Timing, TransportConfig, TransportKind};
use crate::topology::Topology;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use toml::Spanned;

/// A tag as written: an integer, or a string holding a decimal or `0x` hexadecimal number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum TagValue {
    Int(i64),
    Str(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawTransport {
    #[serde(default)]
    pub(super) kind: TransportKind,
    #[serde(default)]
    pub(super) tag: Option<Spanned<TagValue>>,
    #[serde(default)]
    pub(super) ca: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) certs: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) spin_us: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct SwitchEntry {
    pub(super) name: Spanned<String>,
    #[serde(default)]
    pub(super) listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) admin: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct HostEntry {
    pub(super) name: Spanned<String>,
    pub(super) switch: Spanned<String>,
    #[serde(default)]
    pub(super) siu: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) app: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) admin: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct TrunkEntry {
    pub(super) between: Spanned<[String; 2]>,
}

/// `[timing]` as written: each number with where it is, checked against its bounds before it
/// is narrowed to its type (so `-1` or `300` for a `u8` get the same range error as any other
/// out-of-bounds value).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawTiming {
    #[serde(default)]
    pub(super) token_timeout_us: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) epoch_pulses: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) idle_pace_us: Option<Spanned<i64>>,
}

/// `[limits]` as written (see [`RawTiming`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawLimits {
    #[serde(default)]
    pub(super) channels: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) isochron_messages_max: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) pulses_ahead_max: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) queue_packets_max: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) isochron_open_us_max: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) map: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) transport: RawTransport,
    #[serde(default)]
    pub(super) timing: RawTiming,
    #[serde(default)]
    pub(super) limits: RawLimits,
    #[serde(default, rename = "switch")]
    pub(super) switches: Vec<SwitchEntry>,
    #[serde(default, rename = "host")]
    pub(super) hosts: Vec<HostEntry>,
    #[serde(default, rename = "trunk")]
    pub(super) trunks: Vec<TrunkEntry>,
}

/// Why `node`'s `key` should not be the unspecified address `addr`, if it is one.
pub(super) fn unspecified(node: &str, key: &str, addr: SocketAddr) -> Option<String> {
    if !addr.ip().is_unspecified() {
        return None;
    }
    let (kind, what) = key.split_once('.').unwrap_or(("", key));
    Some(if what == "admin" {
        format!(
            "{kind} `{node}` would serve its admin service on every interface ({addr}): it has \
             no authentication (anyone who reaches it can stop the daemon); keep it on loopback"
        )
    } else {
        format!(
            "{kind} `{node}` would listen on every interface ({addr}): peers send to the \
             configured address and drop packets that come from any other, so name the \
             address peers reach it at"
        )
    })
}

/// No two daemons or applications may be configured to listen on the same address.
pub(super) fn check_unique_addrs(
    raw: &RawConfig,
    switch_listen: &[Option<SocketAddr>],
    host_siu: &[Option<SocketAddr>],
    host_app: &[Option<SocketAddr>],
) -> Result<(), (Span, &'static str, String)> {
    let mut seen: HashMap<SocketAddr, ()> = HashMap::new();
    let switches = raw.switches.iter().zip(switch_listen);
    let entries = switches
        .filter_map(|(s, a)| Some((s.listen.as_ref()?.span(), "switch.listen", (*a)?)))
        .chain(
            raw.hosts
                .iter()
                .zip(host_siu)
                .filter_map(|(h, a)| Some((h.siu.as_ref()?.span(), "host.siu", (*a)?))),
        )
        .chain(
            raw.hosts
                .iter()
                .zip(host_app)
                .filter_map(|(h, a)| Some((h.app.as_ref()?.span(), "host.app", (*a)?))),
        );
    for (span, key, a) in entries {
        if a.port() != 0 && seen.insert(a, ()).is_some() {
            return Err((span, key, format!("address {a} is used twice")));
        }
    }
    Ok(())
}

/// No two daemons may be configured to serve the admin service on the same address (TCP; the
/// link addresses are UDP, so an admin address may equal one of them).
pub(super) fn check_unique_admin(
    raw: &RawConfig,
    switch_admin: &[Option<SocketAddr>],
    host_admin: &[Option<SocketAddr>],
) -> Result<(), (Span, &'static str, String)> {
    let mut seen: HashMap<SocketAddr, ()> = HashMap::new();
    let entries = raw
        .switches
        .iter()
        .zip(switch_admin)
        .filter_map(|(s, a)| Some((s.admin.as_ref()?.span(), "switch.admin", (*a)?)))
        .chain(
            raw.hosts
                .iter()
                .zip(host_admin)
                .filter_map(|(h, a)| Some((h.admin.as_ref()?.span(), "host.admin", (*a)?))),
        );
    for (span, key, a) in entries {
        if a.port() != 0 && seen.insert(a, ()).is_some() {
            return Err((span, key, format!("admin address {a} is used twice")));
        }
    }
    Ok(())
}

/// Parses a tag: an integer, or a string with a decimal or `0x` hexadecimal number (`_`
/// between digits allowed).
pub(super) fn parse_tag(v: &TagValue) -> Result<u64, String> {
    let n = match v {
        TagValue::Int(i) => {
            u64::try_from(*i).map_err(|_| out_of_range(i, TAG_MIN, TAG_MAX, "negative"))?
        }
        TagValue::Str(s) => {
            let t = s.trim().replace('_', "");
            let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => t.parse::<u64>(),
            };
            parsed.map_err(|_| {
                format!("`{s}` is not a 64-bit number (decimal, or hexadecimal with 0x)")
            })?
        }
    };
    match n {
        TAG_MIN..=TAG_MAX => Ok(n),
        0 => Err(out_of_range(n, TAG_MIN, TAG_MAX, "0 matches no message")),
        _ => Err(out_of_range(
            format_args!("{n:#x}"),
            TAG_MIN,
            TAG_MAX,
            "0xffffffffffffffff matches every tag",
        )),
    }
}

/// The `[transport]` table, checked.
pub(super) fn transport(
    raw: &RawTransport,
) -> Result<TransportConfig, (Span, &'static str, String)> {
    let tag = match &raw.tag {
        None => DEFAULT_TAG,
        Some(t) => parse_tag(t.get_ref()).map_err(|m| (t.span(), "transport.tag", m))?,
    };
    let path = |v: &Option<Spanned<String>>, key: &'static str| match v {
        Some(p) if p.get_ref().trim().is_empty() => Err((p.span(), key, "empty path".into())),
        Some(p) if p.get_ref().starts_with('~') => Err((
            p.span(),
            key,
            "`~` is not expanded: write an absolute path or one relative to this config file"
                .into(),
        )),
        Some(p) => Ok(Some(PathBuf::from(p.get_ref()))),
        None => Ok(None),
    };
    let spin_us = bounded(&raw.spin_us, "transport.spin-us", SPIN_US_DEFAULT, |_| {
        let b = bound("transport.spin-us");
        (b.min, b.max, String::new())
    })?;
    Ok(TransportConfig {
        kind: raw.kind,
        tag,
        spin_us,
        ca: path(&raw.ca, "transport.ca")?,
        certs: path(&raw.certs, "transport.certs")?,
    })
}

/// The number `v` of `key` as written, or `default` when not written; `range` gives its bounds
/// and what sets them (see [`range_for`]).
fn bounded(
    v: &Option<Spanned<i64>>,
    key: &'static str,
    default: u64,
    range: impl FnOnce(&str) -> (u64, u64, String),
) -> Result<u64, (Span, &'static str, String)> {
    let Some(v) = v else { return Ok(default) };
    let (min, max, why) = range(key);
    u64::try_from(*v.get_ref())
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| (v.span(), key, out_of_range(v.get_ref(), min, max, &why)))
}

/// The numbers of `[timing]` and `[limits]` as written, each within its range for `topology`
/// (see [`check_bounds`]; defaults for those not given, which [`check_bounds`] then checks).
/// `Err` gives where the value is, its key and what is wrong.
pub(super) fn timing_limits(
    raw: &RawConfig,
    topology: &Topology,
) -> Result<(Timing, Limits), (Span, &'static str, String)> {
    let get = |v: &Option<Spanned<i64>>, key: &'static str, default: u64| {
        bounded(v, key, default, |key| range_for(key, topology))
    };
    // Every bound fits its field's type.
    fn narrow<T: TryFrom<u64>>(n: u64) -> T {
        T::try_from(n).unwrap_or_else(|_| unreachable!("bounds fit their types"))
    }
    let (t, l, dt, dl) = (
        &raw.timing,
        &raw.limits,
        Timing::sized_for(topology),
        Limits::sized_for(topology),
    );
    let timing = Timing {
        token_timeout_us: get(
            &t.token_timeout_us,
            "timing.token-timeout-us",
            dt.token_timeout_us,
        )?,
        epoch_pulses: narrow(get(
            &t.epoch_pulses,
            "timing.epoch-pulses",
            dt.epoch_pulses.into(),
        )?),
        idle_pace_us: 0,
    };
    let timing = Timing {
        idle_pace_us: get(
            &t.idle_pace_us,
            "timing.idle-pace-us",
            Timing::default_idle_pace_us(timing.token_timeout_us),
        )?,
        ..timing
    };
    let limits = Limits {
        channels: narrow(get(&l.channels, "limits.channels", dl.channels.into())?),
        isochron_messages_max: narrow(get(
            &l.isochron_messages_max,
            "limits.isochron-messages-max",
            dl.isochron_messages_max.into(),
        )?),
        pulses_ahead_max: narrow(get(
            &l.pulses_ahead_max,
            "limits.pulses-ahead-max",
            dl.pulses_ahead_max.into(),
        )?),
        queue_packets_max: narrow(get(
            &l.queue_packets_max,
            "limits.queue-packets-max",
            dl.queue_packets_max as u64,
        )?),
        isochron_open_us_max: get(
            &l.isochron_open_us_max,
            "limits.isochron-open-us-max",
            dl.isochron_open_us_max,
        )?,
    };
    Ok((timing, limits))
}

/// Where `key` (of `[timing]` or `[limits]`) is written, if it is.
pub(super) fn span_of(raw: &RawConfig, key: &str) -> Option<Span> {
    let (t, l) = (&raw.timing, &raw.limits);
    let v = match key {
        "timing.token-timeout-us" => &t.token_timeout_us,
        "timing.epoch-pulses" => &t.epoch_pulses,
        "timing.idle-pace-us" => &t.idle_pace_us,
        "limits.channels" => &l.channels,
        "limits.isochron-messages-max" => &l.isochron_messages_max,
        "limits.pulses-ahead-max" => &l.pulses_ahead_max,
        "limits.queue-packets-max" => &l.queue_packets_max,
        "limits.isochron-open-us-max" => &l.isochron_open_us_max,
        _ => return None,
    };
    v.as_ref().map(Spanned::span)
}

/// 1-based line and column of byte `offset` in `text`.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    (line, column)
}

/// The dotted key a deserialization error is about: the path of tables (and arrays of
/// tables) toml was in, plus the field an "unknown field `X`" or "missing field `X`" message
/// names (`switch.lisen`, `transport.kind`, `host.name`); `-` when the error is not about a
/// key (a syntax error).
pub(super) fn key_of(e: &toml::de::Error) -> String {
    // toml keeps the path private and prints it as a last line "in `a.b`" when it has no
    // input to quote.
    let mut bare = e.clone();
    bare.set_input(None);
    let shown = bare.to_string();
    let path = shown
        .lines()
        .next_back()
        .and_then(|l| l.strip_prefix("in `")?.strip_suffix('`'))
        .unwrap_or("");
    let message = e.message();
    let field = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|p| message.strip_prefix(p)?.split('`').next());
    match (path, field.map(toml_key)) {
        ("", Some(f)) => f,
        (p, Some(f)) => format!("{p}.{f}"),
        ("", None) => "-".to_string(),
        (p, None) => p.to_string(),
    }
}

/// `key` as TOML spells it: bare when it can be, else quoted (an empty key is `""`, so an
/// error about it still names a key).
fn toml_key(key: &str) -> String {
    let bare = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !key.is_empty() && key.chars().all(bare) {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}
