//! A small SVG chart writer for the report page: line series, histogram
//! bars and marked values over linear or logarithmic axes.
//!
//! Why our own and not plotters' SVG backend: the page needs a handful of
//! chart shapes, and this writer (a few hundred lines) gives exactly them:
//! - **Log axes as people read latency**: ticks at 1-2-5 of each decade in
//!   µs/ms/s; values of 0 drawn at the axis floor rather than dropped.
//! - **Small output**: one `<polyline>` per series with one-decimal
//!   coordinates, styling in the page's CSS once instead of attributes on
//!   every element; a chart of 2,000 points is about 25 KB.
//! - **Checkable**: each chart states its axes (`data-x-scale`,
//!   `data-x-min`, ..., `data-plot`), each bar its count and each mark its
//!   value, so tests can map every point back to the data it came from.
//! - **Print-proof styles**: every series differs by dash pattern and marker
//!   shape as well as by colour ([`STYLES`]), so a greyscale print keeps
//!   them apart.
//! - Nothing to compile but this file (plotters brings a font stack and
//!   several crates; its text and axis layout would still need our own code).
//!
//! It knows nothing of runs: [`super`] turns a summary into [`Chart`]s.

use std::fmt::Write as _;

use super::esc;

/// Chart width in SVG units (the page scales it to its column).
pub const WIDTH: f64 = 960.0;
/// Chart height in SVG units.
pub const HEIGHT: f64 = 300.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 46.0;

/// How a value maps onto an axis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// Linear from `min` to `max`.
    Linear {
        /// Value at the axis start.
        min: f64,
        /// Value at the axis end.
        max: f64,
    },
    /// Logarithmic (base 10) from `min` (> 0) to `max`; values at or below
    /// `min` sit on the axis start.
    Log {
        /// Value at the axis start.
        min: f64,
        /// Value at the axis end.
        max: f64,
    },
}

impl Scale {
    /// A linear scale from 0 (or `lo` when negative) to a little above `hi`,
    /// on a round number.
    pub fn linear_from_zero(hi: f64) -> Scale {
        let hi = if hi > 0.0 { hi } else { 1.0 };
        Scale::Linear {
            min: 0.0,
            max: nice_ceil(hi * 1.05),
        }
    }

    /// A log scale covering `lo..=hi`, framed on 1-2-5 multiples of powers
    /// of ten (`2ms..50ms`, `100µs..1s`).
    pub fn log_covering(lo: f64, hi: f64) -> Scale {
        let lo = lo.max(1.0);
        let hi = hi.max(lo);
        let below = |v: f64| {
            let d = 10f64.powf(v.log10().floor());
            [5.0, 2.0, 1.0]
                .iter()
                .map(|m| m * d)
                .find(|x| *x <= v * 1.000_001)
                .unwrap_or(d)
        };
        let above = |v: f64| {
            let d = 10f64.powf(v.log10().floor());
            [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * d)
                .find(|x| *x >= v * 0.999_999)
                .unwrap_or(10.0 * d)
        };
        let min = below(lo);
        let mut max = above(hi);
        if max <= min {
            max = above(min * 1.5);
        }
        Scale::Log { min, max }
    }

    /// Where `v` falls, 0 at the start of the axis and 1 at its end
    /// (clamped).
    pub fn frac(&self, v: f64) -> f64 {
        let f = match *self {
            Scale::Linear { min, max } => (v - min) / (max - min),
            Scale::Log { min, max } => {
                if v <= min {
                    0.0
                } else {
                    (v.log10() - min.log10()) / (max.log10() - min.log10())
                }
            }
        };
        if f.is_finite() {
            f.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// The value at `f` (0..1) along the axis (inverse of [`Scale::frac`]).
    pub fn value_at(&self, f: f64) -> f64 {
        match *self {
            Scale::Linear { min, max } => min + f * (max - min),
            Scale::Log { min, max } => 10f64.powf(min.log10() + f * (max.log10() - min.log10())),
        }
    }

    fn bounds(&self) -> (f64, f64) {
        match *self {
            Scale::Linear { min, max } | Scale::Log { min, max } => (min, max),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Scale::Linear { .. } => "linear",
            Scale::Log { .. } => "log",
        }
    }

    /// Tick values: round steps on a linear axis, 1-2-5 per decade on a log
    /// axis (1 per decade when it spans more than 5 decades).
    pub fn ticks(&self) -> Vec<f64> {
        match *self {
            Scale::Linear { min, max } => {
                let step = nice_step((max - min) / 6.0);
                let mut v = (min / step).ceil() * step;
                let mut out = Vec::new();
                while v <= max + step * 1e-9 {
                    out.push(v);
                    v += step;
                }
                out
            }
            Scale::Log { min, max } => {
                let decades = (max / min).log10();
                let mults: &[f64] = if decades > 5.0 {
                    &[1.0]
                } else if decades > 2.5 {
                    &[1.0, 3.0]
                } else {
                    &[1.0, 2.0, 5.0]
                };
                let mut out = Vec::new();
                let mut d = 10f64.powf(min.log10().floor());
                while d <= max * 1.0001 {
                    for m in mults {
                        let v = d * m;
                        if v >= min * 0.9999 && v <= max * 1.0001 {
                            out.push(v);
                        }
                    }
                    d *= 10.0;
                }
                out
            }
        }
    }
}

/// The smallest 1-2-5 × 10^k at or above `v`.
fn nice_step(v: f64) -> f64 {
    let v = if v > 0.0 && v.is_finite() { v } else { 1.0 };
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|x| *x >= v * 0.9999)
        .unwrap_or(10.0 * p)
}

/// A round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k) at or above `v`.
fn nice_ceil(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|x| *x >= v * 0.9999)
        .unwrap_or(10.0 * p)
}

/// How tick labels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Microseconds shown as `250µs`, `12ms`, `1.5s`.
    Micros,
    /// Seconds of the run shown as `45s`, `2m`, `1h30m`.
    RunTime,
    /// Seconds shown as `0.5s`, `12s`.
    Seconds,
    /// Counts shown as `950`, `12k`, `1.2M`.
    Count,
    /// Bytes shown as `512 KiB`, `12 MiB`.
    Bytes,
    /// Values already divided by 1024^k, shown with that unit (`12 MiB`
    /// for k = 2), so linear ticks fall on round numbers of it.
    ScaledBytes(u8),
    /// A fraction shown as a percentage.
    Percent,
    /// CPU cores.
    Cores,
}

/// One tick or value label in `unit`.
pub fn label(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Micros => {
            if v < 1_000.0 {
                format!("{}µs", trim(v))
            } else if v < 1e6 {
                format!("{}ms", trim(v / 1e3))
            } else {
                format!("{}s", trim(v / 1e6))
            }
        }
        Unit::RunTime => {
            let s = v.round() as u64;
            match s {
                0..60 => format!("{s}s"),
                60..3_600 if s.is_multiple_of(60) => format!("{}m", s / 60),
                60..3_600 => format!("{}m{}s", s / 60, s % 60),
                _ if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
                _ => format!("{}h{}m", s / 3_600, (s % 3_600) / 60),
            }
        }
        Unit::Seconds => format!("{}s", trim(v)),
        Unit::Count => {
            if v.abs() >= 1e6 {
                format!("{}M", trim(v / 1e6))
            } else if v.abs() >= 1e4 {
                format!("{}k", trim(v / 1e3))
            } else {
                trim(v)
            }
        }
        Unit::Bytes => {
            if v >= 1024.0 * 1024.0 * 1024.0 {
                format!("{} GiB", trim(v / (1024.0 * 1024.0 * 1024.0)))
            } else if v >= 1024.0 * 1024.0 {
                format!("{} MiB", trim(v / (1024.0 * 1024.0)))
            } else if v >= 1024.0 {
                format!("{} KiB", trim(v / 1024.0))
            } else {
                format!("{} B", trim(v))
            }
        }
        Unit::ScaledBytes(k) => format!(
            "{} {}",
            trim(v),
            ["B", "KiB", "MiB", "GiB", "TiB"][usize::from(k.min(4))]
        ),
        Unit::Percent => format!("{}%", trim(v * 100.0)),
        Unit::Cores => trim(v),
    }
}

/// At most 3 significant figures, no trailing zeros.
fn trim(v: f64) -> String {
    let a = v.abs();
    let s = if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// An axis: its scale, what it measures and how its ticks read.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// Value mapping.
    pub scale: Scale,
    /// Tick label format.
    pub unit: Unit,
    /// Axis title.
    pub title: String,
}

/// A line style that survives greyscale: colour, dash pattern and marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Stroke colour (dark enough to differ in grey from its neighbours).
    pub colour: &'static str,
    /// `stroke-dasharray` (empty: solid).
    pub dash: &'static str,
    /// Marker shape drawn along the line.
    pub marker: Marker,
}

/// Marker shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// ●
    Circle,
    /// ■
    Square,
    /// ▲
    Triangle,
    /// ◆
    Diamond,
    /// ✕
    Cross,
    /// ○ (hollow)
    Ring,
}

/// Series styles in order of use.
pub const STYLES: [Style; 6] = [
    Style {
        colour: "#1c4e9d",
        dash: "",
        marker: Marker::Circle,
    },
    Style {
        colour: "#c8430b",
        dash: "8 4",
        marker: Marker::Square,
    },
    Style {
        colour: "#2d7d3a",
        dash: "2 3",
        marker: Marker::Triangle,
    },
    Style {
        colour: "#6b3fa0",
        dash: "10 3 2 3",
        marker: Marker::Diamond,
    },
    Style {
        colour: "#6e5a00",
        dash: "14 5",
        marker: Marker::Cross,
    },
    Style {
        colour: "#333333",
        dash: "4 2",
        marker: Marker::Ring,
    },
];

/// A line through points, in data units.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend name.
    pub name: String,
    /// `(x, y)` points in order.
    pub points: Vec<(f64, f64)>,
    /// Draw as steps (the value holds until the next point), as a CDF is.
    pub steps: bool,
}

/// A histogram bar over `lo..hi` (data units on x).
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// Left edge.
    pub lo: f64,
    /// Right edge.
    pub hi: f64,
    /// Height (a count).
    pub count: u64,
}

/// A marked value on the x axis (a vertical rule with a label), e.g. p99.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// Where, in data units.
    pub x: f64,
    /// Short label (`p99 12ms`).
    pub label: String,
}

/// One chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Accessible name (`aria-label`).
    pub title: String,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis.
    pub y: Axis,
    /// Lines, styled by [`STYLES`] in order.
    pub series: Vec<Series>,
    /// Histogram bars.
    pub bars: Vec<Bar>,
    /// Vertical marks.
    pub marks: Vec<Mark>,
    /// A horizontal reference line (value, label), e.g. agents requested.
    pub reference: Option<(f64, String)>,
}

/// Drawing area: left, top, width, height.
fn plot_area() -> (f64, f64, f64, f64) {
    (LEFT, TOP, WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM)
}

fn num(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

fn marker_svg(out: &mut String, m: Marker, x: f64, y: f64) {
    let (x, y) = (num(x), num(y));
    let _ = match m {
        Marker::Circle => write!(out, r#"<circle cx="{x}" cy="{y}" r="3.5"/>"#),
        Marker::Ring => write!(out, r#"<circle class="hollow" cx="{x}" cy="{y}" r="3.5"/>"#),
        Marker::Square => write!(out, r#"<path d="M{x} {y}m-3.2-3.2h6.4v6.4h-6.4z"/>"#),
        Marker::Triangle => write!(out, r#"<path d="M{x} {y}m0-4.2l4 7h-8z"/>"#),
        Marker::Diamond => write!(
            out,
            r#"<path d="M{x} {y}m0-4.5l4.5 4.5-4.5 4.5-4.5-4.5z"/>"#
        ),
        Marker::Cross => write!(
            out,
            r#"<path class="stroke" d="M{x} {y}m-3.5-3.5l7 7m0-7l-7 7"/>"#
        ),
    };
}

impl Chart {
    /// Maps a data point to SVG coordinates.
    pub fn to_px(&self, x: f64, y: f64) -> (f64, f64) {
        let (l, t, w, h) = plot_area();
        (
            l + self.x.scale.frac(x) * w,
            t + (1.0 - self.y.scale.frac(y)) * h,
        )
    }

    /// The chart as an inline `<svg>` element.
    pub fn render(&self) -> String {
        let (l, t, w, h) = plot_area();
        let (xmin, xmax) = self.x.scale.bounds();
        let (ymin, ymax) = self.y.scale.bounds();
        let mut o = String::with_capacity(4096);
        let _ = write!(
            o,
            r#"<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{}" data-x-scale="{}" data-x-min="{xmin}" data-x-max="{xmax}" data-y-scale="{}" data-y-min="{ymin}" data-y-max="{ymax}" data-plot="{l} {t} {w} {h}">"#,
            esc(&self.title),
            self.x.scale.name(),
            self.y.scale.name(),
        );
        let _ = write!(o, "<title>{}</title>", esc(&self.title));
        self.grid(&mut o);
        self.draw_bars(&mut o);
        if let Some((v, label)) = &self.reference {
            let (_, y) = self.to_px(xmin, *v);
            let _ = write!(
                o,
                r#"<g class="reference" data-y="{v}"><line x1="{l}" x2="{}" y1="{y}" y2="{y}"/><text x="{}" y="{}" text-anchor="end">{}</text></g>"#,
                num(l + w),
                num(l + w - 4.0),
                num(y - 4.0),
                esc(label)
            );
        }
        self.draw_marks(&mut o);
        for (i, s) in self.series.iter().enumerate() {
            self.draw_series(&mut o, s, STYLES[i % STYLES.len()], i);
        }
        self.legend(&mut o);
        o.push_str("</svg>");
        o
    }

    fn grid(&self, o: &mut String) {
        let (l, t, w, h) = plot_area();
        o.push_str(r#"<g class="grid">"#);
        for v in self.y.scale.ticks() {
            let (_, y) = self.to_px(0.0, v);
            let _ = write!(
                o,
                r#"<line x1="{l}" x2="{}" y1="{y}" y2="{y}"/><text class="tick" x="{}" y="{}" text-anchor="end">{}</text>"#,
                num(l + w),
                num(l - 6.0),
                num(y + 4.0),
                esc(&label(self.y.unit, v)),
                y = num(y),
            );
        }
        for v in self.x.scale.ticks() {
            let (x, _) = self.to_px(v, 0.0);
            let _ = write!(
                o,
                r#"<line x1="{x}" x2="{x}" y1="{t}" y2="{}"/><text class="tick" x="{x}" y="{}" text-anchor="middle">{}</text>"#,
                num(t + h),
                num(t + h + 16.0),
                esc(&label(self.x.unit, v)),
                x = num(x),
            );
        }
        o.push_str("</g>");
        let _ = write!(
            o,
            r#"<rect class="frame" x="{l}" y="{t}" width="{w}" height="{h}"/><text class="axis-title" x="{}" y="{}" text-anchor="middle">{}</text><text class="axis-title" transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            num(l + w / 2.0),
            num(HEIGHT - 6.0),
            esc(&self.x.title),
            num(t + h / 2.0),
            esc(&self.y.title),
        );
    }

    fn draw_bars(&self, o: &mut String) {
        if self.bars.is_empty() {
            return;
        }
        o.push_str(r#"<g class="bars">"#);
        for b in &self.bars {
            let (x0, y0) = self.to_px(b.lo, b.count as f64);
            let (x1, base) = self.to_px(b.hi, self.y.scale.bounds().0);
            let _ = write!(
                o,
                r#"<rect class="bar" data-count="{}" data-lo="{}" data-hi="{}" x="{}" y="{}" width="{}" height="{}"><title>{} – {}: {}</title></rect>"#,
                b.count,
                b.lo,
                b.hi,
                num(x0),
                num(y0),
                num((x1 - x0).max(0.5)),
                num((base - y0).max(0.0)),
                esc(&label(self.x.unit, b.lo)),
                esc(&label(self.x.unit, b.hi)),
                b.count
            );
        }
        o.push_str("</g>");
    }

    fn draw_marks(&self, o: &mut String) {
        let (l, t, w, h) = plot_area();
        // Labels go on the first of four rows where they overlap no other
        // label, right of their rule (left of it near the right edge).
        let mut rows: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 4];
        let mut order: Vec<usize> = (0..self.marks.len()).collect();
        order.sort_by(|a, b| self.marks[*a].x.total_cmp(&self.marks[*b].x));
        for (n, i) in order.into_iter().enumerate() {
            let m = &self.marks[i];
            let (x, _) = self.to_px(m.x, 0.0);
            let width = 7.0 * m.label.chars().count() as f64;
            let (anchor, span) = if x + 3.0 + width > l + w {
                ("end", (x - 3.0 - width, x))
            } else {
                ("start", (x, x + 3.0 + width))
            };
            let row = rows
                .iter()
                .position(|r| r.iter().all(|(a, b)| span.1 < *a || span.0 > *b))
                .unwrap_or(n % rows.len());
            rows[row].push(span);
            let dx = if anchor == "end" { -3.0 } else { 3.0 };
            let _ = write!(
                o,
                r#"<g class="mark" data-x="{}" data-label="{}"><line x1="{x}" x2="{x}" y1="{t}" y2="{}"/><text x="{}" y="{}" text-anchor="{anchor}">{}</text></g>"#,
                m.x,
                esc(&m.label),
                num(t + h),
                num(x + dx),
                num(t + 12.0 + row as f64 * 13.0),
                esc(&m.label),
                x = num(x),
            );
        }
    }

    fn draw_series(&self, o: &mut String, s: &Series, style: Style, i: usize) {
        let mut pts = String::with_capacity(s.points.len() * 12);
        let mut px_points: Vec<(f64, f64)> =
            s.points.iter().map(|&(x, y)| self.to_px(x, y)).collect();
        if s.steps {
            // Steps within half a pixel of each other: only the last counts.
            px_points.dedup_by(|next, kept| {
                if (next.0 - kept.0).abs() < 0.5 {
                    kept.1 = next.1;
                    true
                } else {
                    false
                }
            });
        }
        let mut prev: Option<(f64, f64)> = None;
        for &(px, py) in &px_points {
            if s.steps
                && let Some((_, qy)) = prev
            {
                let _ = write!(pts, "{},{} ", num(px), num(qy));
            }
            let _ = write!(pts, "{},{} ", num(px), num(py));
            prev = Some((px, py));
        }
        let dash = if style.dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{}""#, style.dash)
        };
        let _ = write!(
            o,
            r#"<g class="line s{i}" data-name="{}" data-points="{}" style="color:{}"><polyline points="{}"{dash}/>"#,
            esc(&s.name),
            s.points.len(),
            style.colour,
            pts.trim_end(),
        );
        // A few markers along the line, offset per series.
        let n = s.points.len();
        if n > 0 {
            let every = n.div_ceil(8).max(1);
            let offset = (i * every / STYLES.len()).min(n - 1);
            let mut k = offset;
            while k < n {
                let (px, py) = self.to_px(s.points[k].0, s.points[k].1);
                marker_svg(o, style.marker, px, py);
                k += every;
            }
        }
        o.push_str("</g>");
    }

    fn legend(&self, o: &mut String) {
        if self.series.len() < 2 && self.reference.is_none() {
            return;
        }
        let mut x = LEFT;
        o.push_str(r#"<g class="legend">"#);
        for (i, s) in self.series.iter().enumerate() {
            let st = STYLES[i % STYLES.len()];
            let dash = if st.dash.is_empty() {
                String::new()
            } else {
                format!(r#" stroke-dasharray="{}""#, st.dash)
            };
            let _ = write!(
                o,
                r#"<g class="line s{i}" style="color:{}"><line x1="{}" x2="{}" y1="14" y2="14"{dash}/>"#,
                st.colour,
                num(x),
                num(x + 30.0),
            );
            marker_svg(o, st.marker, x + 15.0, 14.0);
            let _ = write!(
                o,
                r#"<text x="{}" y="18">{}</text></g>"#,
                num(x + 36.0),
                esc(&s.name)
            );
            x += 52.0 + 7.0 * s.name.chars().count() as f64;
        }
        o.push_str("</g>");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr<'a>(svg: &'a str, name: &str) -> &'a str {
        let start = svg.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        &svg[start..start + svg[start..].find('"').unwrap()]
    }

    #[test]
    fn scales_map_and_invert() {
        let lin = Scale::Linear {
            min: 0.0,
            max: 200.0,
        };
        assert_eq!(lin.frac(50.0), 0.25);
        assert_eq!(lin.frac(-5.0), 0.0);
        assert_eq!(lin.value_at(0.25), 50.0);
        let log = Scale::Log {
            min: 10.0,
            max: 1e5,
        };
        assert!((log.frac(1_000.0) - 0.5).abs() < 1e-12);
        assert_eq!(log.frac(0.0), 0.0, "0 sits on the floor");
        assert!((log.value_at(0.5) - 1_000.0).abs() < 1e-9);
    }

    #[test]
    fn log_scales_are_framed_on_1_2_5() {
        let f = |lo, hi| match Scale::log_covering(lo, hi) {
            Scale::Log { min, max } => (min, max),
            other => panic!("{other:?}"),
        };
        assert_eq!(f(150.0, 42_000.0), (100.0, 50_000.0));
        assert_eq!(f(0.0, 0.0), (1.0, 2.0));
        assert_eq!(f(2_100.0, 4_800.0), (2_000.0, 5_000.0));
        assert_eq!(f(1_000.0, 1_000.0), (1_000.0, 2_000.0));
        assert_eq!(f(5_000.0, 10_000.0), (5_000.0, 10_000.0));
        let t = Scale::Log {
            min: 100.0,
            max: 1e4,
        }
        .ticks();
        assert_eq!(t, vec![100.0, 200.0, 500.0, 1e3, 2e3, 5e3, 1e4]);
        let wide = Scale::Log { min: 1.0, max: 1e9 }.ticks();
        assert_eq!(wide.len(), 10);
    }

    #[test]
    fn linear_ticks_are_round() {
        assert_eq!(
            Scale::linear_from_zero(1_930.0),
            Scale::Linear {
                min: 0.0,
                max: 2_500.0
            }
        );
        let t = Scale::Linear {
            min: 0.0,
            max: 2_500.0,
        }
        .ticks();
        assert_eq!(t, vec![0.0, 500.0, 1_000.0, 1_500.0, 2_000.0, 2_500.0]);
        assert_eq!(nice_step(0.37), 0.5);
        assert_eq!(nice_ceil(0.0021), 0.0025);
    }

    #[test]
    fn labels_read_in_units() {
        assert_eq!(label(Unit::Micros, 500.0), "500µs");
        assert_eq!(label(Unit::Micros, 2_000.0), "2ms");
        assert_eq!(label(Unit::Micros, 1_500_000.0), "1.5s");
        assert_eq!(label(Unit::RunTime, 90.0), "1m30s");
        assert_eq!(label(Unit::RunTime, 7_200.0), "2h");
        assert_eq!(label(Unit::Count, 12_000.0), "12k");
        assert_eq!(label(Unit::Bytes, 3.0 * 1024.0 * 1024.0), "3 MiB");
        assert_eq!(label(Unit::Percent, 0.995), "99.5%");
    }

    #[test]
    fn a_chart_draws_every_point_bar_and_mark_where_the_data_says() {
        let c = Chart {
            title: "t <&>".into(),
            x: Axis {
                scale: Scale::Log {
                    min: 100.0,
                    max: 1e5,
                },
                unit: Unit::Micros,
                title: "x".into(),
            },
            y: Axis {
                scale: Scale::Linear {
                    min: 0.0,
                    max: 10.0,
                },
                unit: Unit::Count,
                title: "y".into(),
            },
            series: vec![Series {
                name: "a".into(),
                points: vec![(100.0, 0.0), (1_000.0, 5.0), (1e5, 10.0)],
                steps: false,
            }],
            bars: vec![Bar {
                lo: 100.0,
                hi: 1_000.0,
                count: 4,
            }],
            marks: vec![Mark {
                x: 1e4,
                label: "p99".into(),
            }],
            reference: Some((8.0, "requested".into())),
        };
        let svg = c.render();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("aria-label=\"t &lt;&amp;&gt;\""));
        assert_eq!(attr(&svg, "data-x-scale"), "log");
        let pts = attr(&svg, "points");
        let (l, t, w, h) = plot_area();
        assert_eq!(
            pts,
            format!(
                "{},{} {},{} {},{}",
                num(l),
                num(t + h),
                num(l + w / 3.0),
                num(t + h / 2.0),
                num(l + w),
                num(t)
            )
        );
        assert_eq!(attr(&svg, "data-count"), "4");
        assert_eq!(attr(&svg, "data-x"), "10000");
        assert!(svg.contains("class=\"reference\" data-y=\"8\""));
        assert!(svg.contains(">1ms<"), "log ticks labelled in ms");
    }

    #[test]
    fn steps_hold_the_value_until_the_next_point() {
        let c = Chart {
            title: "cdf".into(),
            x: Axis {
                scale: Scale::Linear {
                    min: 0.0,
                    max: 10.0,
                },
                unit: Unit::Count,
                title: String::new(),
            },
            y: Axis {
                scale: Scale::Linear { min: 0.0, max: 1.0 },
                unit: Unit::Percent,
                title: String::new(),
            },
            series: vec![Series {
                name: "cdf".into(),
                points: vec![(0.0, 0.5), (10.0, 1.0)],
                steps: true,
            }],
            bars: vec![],
            marks: vec![],
            reference: None,
        };
        let svg = c.render();
        assert_eq!(attr(&svg, "data-points"), "2");
        assert_eq!(attr(&svg, "points").split(' ').count(), 3);
    }
}
