//! The charts of the report page, built from run data: a probe's arrival
//! histogram and CDF (from its exact HDR histogram), and series over the
//! run's time (from the timeline and latency windows).
//!
//! Every function returns a [`Chart`] (or `None` when there is nothing to
//! draw); [`super::sections`] places them on the page.

use hdrhistogram::Histogram;

use super::svg::{Axis, Bar, Chart, Mark, Scale, Series, Unit};
use crate::summary::{LatencySummary, TimelineSample};
use crate::timeline::LatencyWindow;

/// Most bars of an arrival histogram.
pub const MAX_BARS: usize = 60;

/// `(value, count)` of every recorded bucket: the bucket's highest
/// equivalent value, so the last one is the histogram's max.
fn recorded(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

/// p50, p90, p99 and max as marks, the figures of the summary's tables
/// (none when it has no samples).
pub fn percentile_marks(l: &LatencySummary) -> Vec<Mark> {
    if l.count == 0 {
        return Vec::new();
    }
    let us = |v: u64| super::svg::label(Unit::Micros, v as f64);
    [
        ("p50", l.p50),
        ("p90", l.p90),
        ("p99", l.p99),
        ("max", l.max),
    ]
    .iter()
    .map(|(n, v)| Mark {
        x: *v as f64,
        label: format!("{n} {}", us(*v)),
    })
    .collect()
}

/// The bars of a histogram of arrival times on a log axis: up to
/// [`MAX_BARS`] bins of equal width in log space from the smallest to the
/// largest recorded value (values below 1 µs fall in the first bin). The
/// bars' counts add up to the histogram's count.
pub fn log_bins(h: &Histogram<u64>) -> Vec<Bar> {
    let rec = recorded(h);
    let (Some(first), Some(last)) = (rec.first(), rec.last()) else {
        return Vec::new();
    };
    let lo = (first.0 as f64).max(1.0);
    let hi = (last.0 as f64).max(lo);
    if hi / lo < 1.01 {
        return vec![Bar {
            lo: lo / 1.05,
            hi: hi * 1.05,
            count: h.len(),
        }];
    }
    let decades = (hi / lo).log10();
    let n = ((decades * 25.0).ceil() as usize).clamp(12, MAX_BARS);
    let (llo, lhi) = (lo.log10(), hi.log10() + 1e-9);
    let width = (lhi - llo) / n as f64;
    let mut counts = vec![0u64; n];
    for (v, c) in rec {
        let lv = (v as f64).max(1.0).log10();
        let i = (((lv - llo) / width).floor().max(0.0) as usize).min(n - 1);
        counts[i] += c;
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, count)| Bar {
            lo: 10f64.powf(llo + i as f64 * width),
            hi: 10f64.powf(llo + (i + 1) as f64 * width),
            count,
        })
        .collect()
}

/// The histogram of a probe's arrival times over the fleet.
pub fn arrival_histogram(
    title: &str,
    h: &Histogram<u64>,
    figures: &LatencySummary,
    x_title: &str,
) -> Option<Chart> {
    let bars = log_bins(h);
    let top = bars.iter().map(|b| b.count).max()?;
    let lo = bars.first()?.lo;
    let hi = bars.last()?.hi;
    Some(Chart {
        title: title.to_string(),
        x: Axis {
            scale: Scale::log_covering(lo, hi),
            unit: Unit::Micros,
            title: x_title.to_string(),
        },
        y: Axis {
            scale: Scale::linear_from_zero(top as f64),
            unit: Unit::Count,
            title: "agents".into(),
        },
        series: Vec::new(),
        bars,
        marks: percentile_marks(figures),
        reference: None,
    })
}

/// The CDF of arrival times as a share of `expected` (its last point is at
/// the largest arrival and `count / expected`, so what never arrived shows
/// as the gap to 100 %).
pub fn arrival_cdf(
    title: &str,
    h: &Histogram<u64>,
    figures: &LatencySummary,
    expected: u64,
    x_title: &str,
) -> Option<Chart> {
    let rec = recorded(h);
    let first = rec.first()?;
    let last = rec.last()?;
    // A bucket's value is its upper edge, up to one bucket width (0.1 %)
    // past the largest arrival, which the summary has exactly: the line
    // ends there.
    let top = if figures.count > 0 {
        figures.max
    } else {
        u64::MAX
    };
    let total = expected.max(h.len()).max(1) as f64;
    let scale = Scale::log_covering(first.0.min(top) as f64, last.0.min(top) as f64);
    let floor = match scale {
        Scale::Log { min, .. } | Scale::Linear { min, .. } => min,
    };
    let mut points = Vec::with_capacity(rec.len() + 1);
    points.push((floor, 0.0));
    let mut seen = 0u64;
    for (v, c) in rec {
        seen += c;
        points.push((v.min(top) as f64, seen as f64 / total));
    }
    Some(Chart {
        title: title.to_string(),
        x: Axis {
            scale,
            unit: Unit::Micros,
            title: x_title.to_string(),
        },
        y: Axis {
            scale: Scale::Linear { min: 0.0, max: 1.0 },
            unit: Unit::Percent,
            title: "share of expected".into(),
        },
        series: vec![Series {
            name: "arrived".into(),
            points,
            steps: true,
        }],
        bars: Vec::new(),
        marks: percentile_marks(figures),
        reference: Some((1.0, format!("{expected} expected"))),
    })
}

/// A time axis over the run.
pub fn run_time_axis(duration_s: f64) -> Axis {
    Axis {
        scale: Scale::Linear {
            min: 0.0,
            max: duration_s.max(1.0),
        },
        unit: Unit::RunTime,
        title: "time since start".into(),
    }
}

/// Per-second rate of each increment between samples: `(t, Δ / Δt)`.
pub fn rate_points(
    timeline: &[TimelineSample],
    mut value: impl FnMut(&TimelineSample) -> f64,
) -> Vec<(f64, f64)> {
    let mut prev_t = 0.0;
    timeline
        .iter()
        .map(|s| {
            let dt = (s.t_s - prev_t).max(1e-3);
            prev_t = s.t_s;
            (s.t_s, value(s) / dt)
        })
        .collect()
}

/// Lines over the run's time with a linear y axis from 0.
pub fn over_time(
    title: &str,
    duration_s: f64,
    y_unit: Unit,
    y_title: &str,
    series: Vec<Series>,
) -> Option<Chart> {
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    if series.iter().all(|s| s.points.is_empty()) {
        return None;
    }
    // Bytes: in the binary unit of the largest value, so ticks are round.
    let (series, top, y_unit) = match y_unit {
        Unit::Bytes => {
            let k = (0..4u8)
                .rev()
                .find(|k| top >= 1024f64.powi(i32::from(*k)))
                .unwrap_or(0);
            let d = 1024f64.powi(i32::from(k));
            let series = series
                .into_iter()
                .map(|s| Series {
                    points: s.points.iter().map(|(x, y)| (*x, y / d)).collect(),
                    ..s
                })
                .collect();
            (series, top / d, Unit::ScaledBytes(k))
        }
        u => (series, top, u),
    };
    // Merged shards that started apart reach past the longest duration.
    let end = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(duration_s, f64::max);
    Some(Chart {
        title: title.to_string(),
        x: run_time_axis(end),
        y: Axis {
            scale: Scale::linear_from_zero(top),
            unit: y_unit,
            title: y_title.to_string(),
        },
        series,
        bars: Vec::new(),
        marks: Vec::new(),
        reference: None,
    })
}

/// p50/p90/p99/max of one latency per window, on a log axis; points at
/// the end of each window.
pub fn latency_over_time(name: &str, duration_s: f64, windows: &[&LatencyWindow]) -> Option<Chart> {
    if windows.is_empty() {
        return None;
    }
    let lo = windows.iter().map(|w| w.p50).min()? as f64;
    let hi = windows.iter().map(|w| w.max).max()? as f64;
    let line = |label: &str, f: fn(&LatencyWindow) -> u64| Series {
        name: label.into(),
        points: windows
            .iter()
            .map(|w| (w.start_s + w.length_s, f(w) as f64))
            .collect(),
        steps: false,
    };
    let end = windows
        .iter()
        .map(|w| w.start_s + w.length_s)
        .fold(duration_s, f64::max);
    Some(Chart {
        title: format!("{name}: latency percentiles per interval"),
        x: run_time_axis(end),
        y: Axis {
            scale: Scale::log_covering(lo, hi),
            unit: Unit::Micros,
            title: "latency".into(),
        },
        series: vec![
            line("p50", |w| w.p50),
            line("p90", |w| w.p90),
            line("p99", |w| w.p99),
            line("max", |w| w.max),
        ],
        bars: Vec::new(),
        marks: Vec::new(),
        reference: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::new_latency_histogram;

    fn hist(values: impl IntoIterator<Item = u64>) -> Histogram<u64> {
        let mut h = new_latency_histogram();
        for v in values {
            h.record(v).unwrap();
        }
        h
    }

    #[test]
    fn bins_hold_every_sample_and_span_min_to_max() {
        let h = hist((1..=10_000u64).map(|i| 500 + i * i / 50));
        let bars = log_bins(&h);
        assert!(bars.len() <= MAX_BARS && bars.len() >= 12, "{}", bars.len());
        assert_eq!(bars.iter().map(|b| b.count).sum::<u64>(), 10_000);
        assert!(bars[0].lo <= h.min() as f64);
        assert!(bars.last().unwrap().hi >= h.max() as f64);
        assert!(
            bars.windows(2)
                .all(|w| (w[0].hi - w[1].lo).abs() < 1e-6 * w[1].lo)
        );
        // One value: one bar.
        let one = log_bins(&hist([42, 42, 42]));
        assert_eq!((one.len(), one[0].count), (1, 3));
        assert!(log_bins(&new_latency_histogram()).is_empty());
        // A 0 (merged arrivals before T0) lands in the first bin.
        let mut z = hist([1_000, 9_000]);
        z.record(0).unwrap();
        let mut with_zero = new_latency_histogram();
        with_zero.add(&z).unwrap();
        assert_eq!(
            log_bins(&with_zero).iter().map(|b| b.count).sum::<u64>(),
            with_zero.len()
        );
    }

    #[test]
    fn the_cdf_ends_at_the_largest_arrival_and_the_delivered_share() {
        let h = hist((1..=99u64).map(|i| i * 1_000));
        let c = arrival_cdf(
            "p",
            &h,
            &LatencySummary::from_histogram(&h),
            100,
            "after T0",
        )
        .unwrap();
        let pts = &c.series[0].points;
        assert_eq!(pts[0].1, 0.0);
        let last = pts.last().unwrap();
        assert_eq!(last.0, h.max() as f64);
        assert!((last.1 - 0.99).abs() < 1e-12);
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        let marks: Vec<&str> = c.marks.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(marks.len(), 4);
        assert!(marks[3].starts_with("max "), "{marks:?}");
        assert_eq!(c.marks[3].x, h.max() as f64);
        // A probe's summary has its exact max, below the upper edge of the
        // histogram bucket that holds it: the line ends at the max.
        let h = hist([1_000, 8_336]);
        assert!(recorded(&h).last().unwrap().0 > 8_336, "a bucket edge");
        let exact = LatencySummary {
            max: 8_336,
            ..LatencySummary::from_histogram(&h)
        };
        let c = arrival_cdf("p", &h, &exact, 2, "after T0").unwrap();
        assert_eq!(c.series[0].points.last().unwrap().0, 8_336.0);
    }

    #[test]
    fn rates_divide_increments_by_the_time_between_samples() {
        let s = |t_s: f64, k: u64| TimelineSample {
            t_s,
            counters: [("k".to_string(), k)].into(),
            ..Default::default()
        };
        let t = vec![s(10.0, 100), s(20.0, 50), s(25.0, 50)];
        let r = rate_points(&t, |x| x.counters.get("k").copied().unwrap_or(0) as f64);
        assert_eq!(r, vec![(10.0, 10.0), (20.0, 5.0), (25.0, 10.0)]);
    }
}
