//! HdrHistogram interval logs (`--hlog PATH`): every latency histogram of a run
//! written as tagged intervals in the standard format that HdrHistogram's own
//! tools (`HistogramLogProcessor`, `HistogramLogReader`, hdrhistogram-rs'
//! `IntervalLogIterator`) read, and read back for `report merge`.
//!
//! A log written by [`HlogWriter`] looks like this:
//!
//! ```text
//! #[agent-sim interval log: values in microseconds, Interval_Max in milliseconds]
//! #[Histogram log format version 1.3]
//! #[StartTime: 1795300844.250 (seconds since epoch), 2026-11-21T22:40:44.250Z]
//! #[BaseTime: 1795300844.250 (seconds since epoch)]
//! #[MaxValueDivisor: 1000.000]
//! "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
//! Tag=connect,0.000,10.000,12.431,HISTFAAAAC...
//! ```
//!
//! - Timestamps are seconds relative to `BaseTime` (= `StartTime`, the start
//!   of the run), as the Java writer does.
//! - Recorded values are **microseconds** (see [`crate::new_latency_histogram`]).
//!   `Interval_Max` is only for people reading the file: it is divided by
//!   [`MAX_VALUE_DIVISOR`] (1000) so it reads in milliseconds, the unit
//!   HdrHistogram's tools print by default. To get milliseconds out of
//!   `HistogramLogProcessor`, pass `-outputValueUnitRatio 1000`.
//! - The tag of an interval is the latency name (`connect`, `session_ready`, ...).
//! - The histogram is the compressed V2 encoding in base64, the same bytes as the
//!   `hdr` field of a summary latency ([`crate::histo::encode_histogram`]).
//!
//! Interval lines are produced by hdrhistogram's
//! `serialization::interval_log` writer, and parsed by its iterator; this
//! module adds the file header, the StartTime date, file handling and errors
//! that name the file. It does not interpret intervals beyond decoding them:
//! merging is [`HlogContents::merged_by_tag`] and [`crate::merge`].

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{
    IntervalLogIterator, IntervalLogWriterBuilder, LogEntry, LogIteratorError, Tag,
};

use crate::histo::decode_histogram;
use crate::units::rfc3339;
use crate::{MetricsError, new_latency_histogram};

/// `Interval_Max` is the interval's largest value (µs) divided by this, i.e.
/// milliseconds.
pub const MAX_VALUE_DIVISOR: f64 = 1000.0;

/// Key used by [`HlogContents::merged_by_tag`] for intervals without a tag
/// (logs written by other tools).
pub const UNTAGGED: &str = "untagged";

/// The legend line of the Java writer (readers skip it).
const LEGEND: &str =
    "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"";

fn hlog_err(path: &Path, what: impl std::fmt::Display) -> MetricsError {
    MetricsError::Hlog(format!("{}: {what}", path.display()))
}

fn epoch_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Writes an interval log, one line per (interval, latency name).
///
/// Typical use, from the reporter task every `--hlog-interval` (10 s):
///
/// ```no_run
/// # use agent_sim_metrics::{Metrics, MetricsSpec, hlog::HlogWriter};
/// # use std::time::{Duration, Instant, SystemTime};
/// # fn main() -> Result<(), agent_sim_metrics::MetricsError> {
/// # let metrics = Metrics::new(&MetricsSpec::default(), 1);
/// let started = Instant::now();
/// let mut log = HlogWriter::create("run.hlog".as_ref(), SystemTime::now())?;
/// let mut last = Duration::ZERO;
/// // ... every interval:
/// let now = started.elapsed();
/// log.write_collected(last, now - last, &metrics.collect())?;
/// last = now;
/// // ... at the end (also on SIGINT):
/// log.flush()?;
/// # Ok(()) }
/// ```
pub struct HlogWriter {
    path: PathBuf,
    out: BufWriter<File>,
    serializer: V2DeflateSerializer,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for HlogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HlogWriter")
            .field("path", &self.path)
            .finish()
    }
}

impl HlogWriter {
    /// Creates (truncates) `path` and writes the header; `start` is the
    /// wall-clock start of the run, written as `StartTime` and `BaseTime`.
    pub fn create(path: &Path, start: SystemTime) -> Result<Self, MetricsError> {
        let file = File::create(path).map_err(|e| hlog_err(path, e))?;
        let mut out = BufWriter::new(file);
        let secs = epoch_seconds(start);
        let header = format!(
            "#[agent-sim interval log: values in microseconds, Interval_Max in milliseconds]\n\
             #[Histogram log format version 1.3]\n\
             #[StartTime: {secs:.3} (seconds since epoch), {date}]\n\
             #[BaseTime: {secs:.3} (seconds since epoch)]\n\
             #[MaxValueDivisor: {MAX_VALUE_DIVISOR:.3}]\n\
             {LEGEND}\n",
            date = rfc3339(start),
        );
        out.write_all(header.as_bytes())
            .map_err(|e| hlog_err(path, e))?;
        Ok(HlogWriter {
            path: path.to_path_buf(),
            out,
            serializer: V2DeflateSerializer::new(),
            scratch: Vec::with_capacity(4096),
        })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one interval: `start_offset` from the start of the run,
    /// `length` long, tagged `tag` (a latency name: no `,`, space or newline).
    /// Empty histograms are skipped (nothing written, `Ok`).
    pub fn write_interval(
        &mut self,
        start_offset: Duration,
        length: Duration,
        tag: &str,
        h: &Histogram<u64>,
    ) -> Result<(), MetricsError> {
        if h.is_empty() {
            return Ok(());
        }
        let tag = match Tag::new(tag) {
            Some(t) if !tag.is_empty() => t,
            _ => {
                return Err(hlog_err(
                    &self.path,
                    format!("invalid tag {tag:?} (empty, or holds ',', space or newline)"),
                ));
            }
        };
        // The crate's writer borrows its output and serializer, so it is built
        // per interval over a scratch buffer. Building it with a divisor makes it
        // emit a `#[MaxValueDivisor]` comment first (already in our header):
        // only the interval line is copied to the file.
        self.scratch.clear();
        {
            let mut w = IntervalLogWriterBuilder::new()
                .with_max_value_divisor(MAX_VALUE_DIVISOR)
                .begin_log_with(&mut self.scratch, &mut self.serializer)
                .map_err(|e| hlog_err(&self.path, e))?;
            w.write_histogram(h, start_offset, length, Some(tag))
                .map_err(|e| hlog_err(&self.path, format!("{e:?}")))?;
        }
        let text = &self.scratch[..];
        let line = text
            .split_inclusive(|&b| b == b'\n')
            .find(|l| l.starts_with(b"Tag="))
            .ok_or_else(|| hlog_err(&self.path, "hdrhistogram wrote no interval line"))?;
        self.out
            .write_all(line)
            .map_err(|e| hlog_err(&self.path, e))
    }

    /// Writes every histogram returned by [`crate::Metrics::collect`] as one
    /// interval tagged with its name (empty ones are skipped).
    pub fn write_collected(
        &mut self,
        start_offset: Duration,
        length: Duration,
        hists: &[(&str, Histogram<u64>)],
    ) -> Result<(), MetricsError> {
        for (name, h) in hists {
            self.write_interval(start_offset, length, name, h)?;
        }
        Ok(())
    }

    /// Flushes buffered lines to the file.
    pub fn flush(&mut self) -> Result<(), MetricsError> {
        self.out.flush().map_err(|e| hlog_err(&self.path, e))
    }
}

/// One interval read from a log.
#[derive(Debug, Clone, PartialEq)]
pub struct HlogInterval {
    /// The interval's tag, if any.
    pub tag: Option<String>,
    /// Start of the interval in seconds: since the epoch when the log says how
    /// (a `BaseTime`, or a `StartTime` with relative timestamps, the Java
    /// reader's rule), else as written.
    pub start: f64,
    /// Length in seconds.
    pub length: f64,
    /// The decoded histogram, with the crate-wide bounds (µs).
    pub histogram: Histogram<u64>,
}

/// Everything read from one log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HlogContents {
    /// `StartTime` (seconds since the epoch), if present.
    pub start_time: Option<f64>,
    /// `BaseTime` (seconds since the epoch), if present.
    pub base_time: Option<f64>,
    /// Intervals in file order.
    pub intervals: Vec<HlogInterval>,
}

impl HlogContents {
    /// Sum of all intervals per tag (untagged intervals under [`UNTAGGED`]).
    pub fn merged_by_tag(&self) -> BTreeMap<String, Histogram<u64>> {
        let mut out: BTreeMap<String, Histogram<u64>> = BTreeMap::new();
        for i in &self.intervals {
            let key = i.tag.as_deref().unwrap_or(UNTAGGED);
            let acc = out
                .entry(key.to_owned())
                .or_insert_with(new_latency_histogram);
            // Every decoded histogram has the crate-wide bounds: cannot fail.
            let _ = acc.add(&i.histogram);
        }
        out
    }
}

/// Reads an interval log (ours or any tool's, as long as its values fit the
/// crate-wide bounds of 1 µs .. 1 h). Errors name the file and line.
pub fn read_hlog(path: &Path) -> Result<HlogContents, MetricsError> {
    let mut bytes = std::fs::read(path).map_err(|e| hlog_err(path, e))?;
    // The parser wants every line terminated.
    if !bytes.is_empty() && !bytes.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    let line_of = |offset: usize| {
        bytes[..offset.min(bytes.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    };
    let mut contents = HlogContents::default();
    let mut raw = Vec::new();
    let mut iter = IntervalLogIterator::new(&bytes);
    for entry in iter.by_ref() {
        match entry {
            Err(LogIteratorError::ParseError { offset }) => {
                return Err(hlog_err(
                    path,
                    format!(
                        "line {}: not an interval log line (expected `#` comment, legend or \
                         `[Tag=name,]start,length,max,base64`)",
                        line_of(offset)
                    ),
                ));
            }
            Ok(LogEntry::StartTime(d)) => contents.start_time = Some(d.as_secs_f64()),
            Ok(LogEntry::BaseTime(d)) => contents.base_time = Some(d.as_secs_f64()),
            Ok(LogEntry::Interval(i)) => raw.push((
                i.tag().map(|t| t.as_str().to_owned()),
                i.start_timestamp().as_secs_f64(),
                i.duration().as_secs_f64(),
                i.encoded_histogram(),
            )),
        }
    }
    const YEAR_S: f64 = 365.0 * 24.0 * 3600.0;
    for (n, (tag, ts, length, b64)) in raw.into_iter().enumerate() {
        let histogram = decode_histogram(b64).map_err(|e| {
            hlog_err(
                path,
                format!(
                    "interval #{} (tag {}): {e}",
                    n + 1,
                    tag.as_deref().unwrap_or("none")
                ),
            )
        })?;
        let start = match (contents.base_time, contents.start_time) {
            (Some(base), _) => base + ts,
            (None, Some(st)) if ts < st - YEAR_S => st + ts,
            _ => ts,
        };
        contents.intervals.push(HlogInterval {
            tag,
            start,
            length,
            histogram,
        });
    }
    Ok(contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path in a per-process temp dir, removed (with the dir, once empty) on drop.
    struct TmpPath(PathBuf);

    impl std::ops::Deref for TmpPath {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl AsRef<Path> for TmpPath {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TmpPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    fn tmp(name: &str) -> TmpPath {
        // A folder per test: one test's drop removes its folder while
        // another writes (a shared one went away under a write, 1 run in 5).
        let dir =
            std::env::temp_dir().join(format!("agent-sim-hlog-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TmpPath(dir.join(name))
    }

    fn hist(values: &[u64]) -> Histogram<u64> {
        let mut h = new_latency_histogram();
        for v in values {
            h.record(*v).unwrap();
        }
        h
    }

    const T0_MS: u64 = 1_795_300_844_250;

    #[test]
    fn writes_the_standard_header_and_tagged_lines() {
        let p = tmp("header.hlog");
        let start = UNIX_EPOCH + Duration::from_millis(T0_MS);
        let mut w = HlogWriter::create(&p, start).unwrap();
        w.write_interval(
            Duration::ZERO,
            Duration::from_secs(10),
            "connect",
            &hist(&[100, 12_431]),
        )
        .unwrap();
        w.write_interval(
            Duration::from_secs(10),
            Duration::from_secs(10),
            "empty",
            &new_latency_histogram(),
        )
        .unwrap();
        w.flush().unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "#[Histogram log format version 1.3]");
        assert_eq!(
            lines[2],
            "#[StartTime: 1795300844.250 (seconds since epoch), 2026-11-21T22:40:44.250Z]"
        );
        assert_eq!(
            lines[3],
            "#[BaseTime: 1795300844.250 (seconds since epoch)]"
        );
        assert_eq!(lines[5], LEGEND);
        assert_eq!(lines.len(), 7, "empty histogram must be skipped:\n{text}");
        // Interval_Max in milliseconds (12431 µs, at HDR precision).
        assert!(
            lines[6].starts_with("Tag=connect,0.000,10.000,12.43"),
            "{}",
            lines[6]
        );
        let b64 = lines[6].rsplit(',').next().unwrap();
        assert!(b64.starts_with("HISTF"), "compressed V2 cookie: {b64}");

        // hdrhistogram's own reader sees the same thing.
        let entries: Vec<_> = IntervalLogIterator::new(text.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(entries.len(), 3);
        match &entries[2] {
            LogEntry::Interval(i) => {
                assert_eq!(i.tag().unwrap().as_str(), "connect");
                assert_eq!(i.duration(), Duration::from_secs(10));
                assert!((i.max() - 12.431).abs() < 0.01, "{}", i.max());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn round_trips_intervals_with_absolute_starts() {
        let p = tmp("roundtrip.hlog");
        let start = UNIX_EPOCH + Duration::from_millis(T0_MS);
        let mut w = HlogWriter::create(&p, start).unwrap();
        let a = hist(&[1, 2, 3, 1_000_000]);
        let b = hist(&[50, 60]);
        let c = hist(&[7]);
        w.write_collected(
            Duration::ZERO,
            Duration::from_secs(10),
            &[("connect", a.clone()), ("rtt", b.clone())],
        )
        .unwrap();
        w.write_interval(
            Duration::from_secs(10),
            Duration::from_millis(2500),
            "connect",
            &c,
        )
        .unwrap();
        drop(w); // BufWriter flushes on drop too
        let r = read_hlog(&p).unwrap();
        assert_eq!(r.start_time, Some(1_795_300_844.25));
        assert_eq!(r.intervals.len(), 3);
        assert_eq!(r.intervals[0].tag.as_deref(), Some("connect"));
        assert_eq!(r.intervals[0].histogram, a);
        assert_eq!(r.intervals[1].histogram, b);
        assert!((r.intervals[2].start - 1_795_300_854.25).abs() < 1e-6);
        assert!((r.intervals[2].length - 2.5).abs() < 1e-9);
        let merged = r.merged_by_tag();
        let mut ac = a.clone();
        ac.add(&c).unwrap();
        assert_eq!(merged["connect"], ac);
        assert_eq!(merged["rtt"], b);
    }

    #[test]
    fn reads_foreign_untagged_logs_without_trailing_newline() {
        let p = tmp("foreign.hlog");
        let b64 = crate::histo::encode_histogram(&hist(&[42])).unwrap();
        std::fs::write(
            &p,
            format!(
                "#[StartTime: 1795300844.000 (seconds since epoch), Sat Nov 21]\n\
                 0.5,1.0,0.042,{b64}\n\
                 1795300845.000,1.0,0.042,{b64}"
            ),
        )
        .unwrap();
        let r = read_hlog(&p).unwrap();
        assert_eq!(r.intervals.len(), 2);
        assert_eq!(r.intervals[0].tag, None);
        // Relative to StartTime (the Java reader's rule) ...
        assert!((r.intervals[0].start - 1_795_300_844.5).abs() < 1e-6);
        // ... unless already absolute.
        assert!((r.intervals[1].start - 1_795_300_845.0).abs() < 1e-6);
        assert_eq!(r.merged_by_tag()[UNTAGGED].len(), 2);
        assert_eq!(r.merged_by_tag()[UNTAGGED].max(), 42);
    }

    #[test]
    fn bad_files_are_errors_naming_the_file() {
        let missing = tmp("does-not-exist.hlog");
        let e = read_hlog(&missing).unwrap_err().to_string();
        assert!(e.contains("does-not-exist.hlog"), "{e}");

        let p = tmp("garbage.hlog");
        std::fs::write(&p, "#comment\nthis is not a log\n").unwrap();
        let e = read_hlog(&p).unwrap_err().to_string();
        assert!(e.contains("garbage.hlog") && e.contains("line 2"), "{e}");

        let p = tmp("badb64.hlog");
        std::fs::write(&p, "Tag=x,0.000,1.000,1.000,HISTFnotbase64!!\n").unwrap();
        let e = read_hlog(&p).unwrap_err().to_string();
        assert!(e.contains("badb64.hlog") && e.contains("tag x"), "{e}");

        let p = tmp("badtag.hlog");
        let mut w = HlogWriter::create(&p, SystemTime::now()).unwrap();
        let e = w
            .write_interval(Duration::ZERO, Duration::ZERO, "a b", &hist(&[1]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("badtag.hlog") && e.contains("invalid tag"),
            "{e}"
        );
    }

    #[test]
    fn an_empty_file_has_no_intervals() {
        let p = tmp("empty.hlog");
        std::fs::write(&p, "").unwrap();
        assert_eq!(read_hlog(&p).unwrap(), HlogContents::default());
    }
}
