//! `isotach tool plot-scale`: draws the scale curve of `isotach sim scale --json` as an SVG —
//! the pulse period and the isochron latency (p50 and p99, virtual µs, and p50 in pulses)
//! against the hosts, one line per topology, hosts on a log axis — so the growth rate shows
//! at a glance (`docs/scale.svg`).

use crate::UsageError;
use anyhow::Context;
use clap::Args;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Width and height of the picture, pixels.
const SIZE_PX: (u32, u32) = (1200, 420);
/// Colours of the topologies, in the order they first appear.
const COLOURS: [RGBColor; 6] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x8c, 0x56, 0x4b),
];
/// Most points a file may hold (`sim scale` makes at most 64).
const POINTS_MAX: usize = 256;

/// Draw the scale curve of a `sim scale --json` file.
#[derive(Debug, Args)]
pub(super) struct PlotScaleArgs {
    /// The JSON object `isotach sim scale --json` printed.
    input: PathBuf,
    /// Where the SVG goes.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
}

/// One point as the plot needs it.
#[derive(Debug, Clone, Copy)]
struct Point {
    hosts: u32,
    period_us: f64,
    p50_us: f64,
    p99_us: f64,
    p50_pulses: f64,
}

/// The points of each topology, by name, hosts ascending.
type Series = BTreeMap<String, Vec<Point>>;

/// A sweep: its points, and the line under the title saying how it ran.
#[derive(Debug)]
struct Sweep {
    series: Series,
    subtitle: String,
}

pub(super) fn run(a: &PlotScaleArgs) -> anyhow::Result<ExitCode> {
    let sweep = read(&a.input).map_err(|e| UsageError(format!("{}: {e}", a.input.display())))?;
    draw(&sweep, &a.output).with_context(|| format!("drawing {}", a.output.display()))?;
    let points: usize = sweep.series.values().map(Vec::len).sum();
    eprintln!(
        "tool plot-scale: {} topologies, {points} points → {}",
        sweep.series.len(),
        a.output.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Reads and checks the sweep: every point needs its topology, hosts and the plotted values.
fn read(path: &Path) -> Result<Sweep, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    let points = v["points"]
        .as_array()
        .ok_or("no `points` array (is it the output of `isotach sim scale --json`?)")?;
    if points.is_empty() || points.len() > POINTS_MAX {
        return Err(format!(
            "{} points: a plot needs 1..={POINTS_MAX}",
            points.len()
        ));
    }
    let mut series = Series::new();
    for (i, p) in points.iter().enumerate() {
        let num = |k: &str| {
            p[k].as_f64()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or(format!("point {i}: no non-negative number `{k}`"))
        };
        let topology = p["topology"]
            .as_str()
            .ok_or(format!("point {i}: no `topology`"))?;
        let hosts = p["hosts"]
            .as_u64()
            .and_then(|h| u32::try_from(h).ok())
            .filter(|&h| h >= 1)
            .ok_or(format!("point {i}: no host count `hosts` of at least 1"))?;
        series.entry(topology.to_string()).or_default().push(Point {
            hosts,
            period_us: num("pulse_period_us")?,
            p50_us: num("isochron_latency_p50_us")?,
            p99_us: num("isochron_latency_p99_us")?,
            p50_pulses: num("isochron_latency_p50_pulses")?,
        });
    }
    for s in series.values_mut() {
        s.sort_by_key(|p| p.hosts);
    }
    Ok(Sweep {
        series,
        subtitle: subtitle(&v),
    })
}

/// How the sweep ran, from its top-level keys (those it has).
fn subtitle(v: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(p) = v["pulses"].as_u64() {
        parts.push(format!("{p} pulses a point"));
    }
    if let Some(h) = v["hosts_per_leaf"].as_u64() {
        parts.push(format!("{h} hosts per leaf switch"));
    }
    if let Some(m) = v["line_switches_max"].as_u64() {
        parts.push(format!("lines of at most {m} switches"));
    }
    let faults: Vec<String> = ["loss", "dup", "reorder", "token_corrupt"]
        .iter()
        .filter_map(|k| {
            v[k].as_f64()
                .filter(|&p| p > 0.0)
                .map(|p| format!("{k} {p}"))
        })
        .collect();
    parts.push(if faults.is_empty() {
        "no faults".to_string()
    } else {
        faults.join(", ")
    });
    format!("isotach sim scale: {}", parts.join("; "))
}

/// Three panels side by side: pulse period, latency in µs (p50 solid, p99 thin), latency in
/// pulses (p50).
fn draw(sweep: &Sweep, out: &Path) -> anyhow::Result<()> {
    let series = &sweep.series;
    let root = SVGBackend::new(out, SIZE_PX).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(56);
    let title = title.titled(
        "Isotach simulator: how the pulse period and isochron latency grow with the hosts",
        ("sans-serif", 20),
    )?;
    let centre = (SIZE_PX.0 as i32 / 2, 4);
    let grey = BLACK.mix(0.7);
    let style = TextStyle::from(("sans-serif", 13).into_font())
        .color(&grey)
        .pos(Pos::new(HPos::Center, VPos::Top));
    title.draw_text(&sweep.subtitle, &style, centre)?;
    let panels = body.split_evenly((1, 3));
    let hosts = series.values().flatten().map(|p| p.hosts);
    let lo = hosts.clone().min().unwrap_or(1);
    let hi = hosts.max().unwrap_or(1).max(lo + 1);
    let max = |f: fn(&Point) -> f64| series.values().flatten().map(f).fold(1.0, f64::max) * 1.1;
    panel(
        &panels[0],
        series,
        (lo, hi),
        ("pulse period (virtual µs)", max(|p| p.period_us)),
        &[(|p: &Point| p.period_us, "")],
    )?;
    panel(
        &panels[1],
        series,
        (lo, hi),
        ("isochron latency (virtual µs)", max(|p| p.p99_us)),
        &[
            (|p: &Point| p.p50_us, " p50"),
            (|p: &Point| p.p99_us, " p99"),
        ],
    )?;
    panel(
        &panels[2],
        series,
        (lo, hi),
        ("isochron latency p50 (pulses)", max(|p| p.p50_pulses)),
        &[(|p: &Point| p.p50_pulses, "")],
    )?;
    root.present()?;
    Ok(())
}

/// A measure plotted against the hosts, with its legend suffix ("" or " p99").
type Measure<'a> = (fn(&Point) -> f64, &'a str);

/// One panel: each topology's points for each measure; the first measure drawn bold.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    series: &Series,
    (lo, hi): (u32, u32),
    (caption, y_max): (&str, f64),
    measures: &[Measure<'_>],
) -> anyhow::Result<()> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("hosts")
        .x_labels(8)
        .y_labels(8)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        for (m, &(value, suffix)) in measures.iter().enumerate() {
            let style = if m == 0 {
                colour.stroke_width(3)
            } else {
                colour.mix(0.55).stroke_width(1)
            };
            let xy: Vec<(u32, f64)> = points.iter().map(|p| (p.hosts, value(p))).collect();
            chart
                .draw_series(LineSeries::new(xy.iter().copied(), style))?
                .label(format!("{name}{suffix}"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
            chart.draw_series(xy.iter().map(|&c| Circle::new(c, 3, style.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("isotach-plot-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn bad_files_are_refused_with_what_is_wrong() {
        let cases = [
            ("not-json", "{", "not JSON"),
            ("no-points", "{}", "no `points`"),
            ("empty", r#"{"points":[]}"#, "0 points"),
            ("no-hosts", r#"{"points":[{"topology":"line"}]}"#, "`hosts`"),
            (
                "negative",
                r#"{"points":[{"topology":"line","hosts":16,"pulse_period_us":-1}]}"#,
                "pulse_period_us",
            ),
        ];
        for (name, text, want) in cases {
            let p = write(name, text);
            let e = read(&p).unwrap_err();
            assert!(e.contains(want), "{name}: {e}");
            std::fs::remove_file(p).unwrap();
        }
    }
}
