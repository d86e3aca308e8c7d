//! Histogram helpers every part of this crate shares: the compact text
//! form of an HDR histogram (base64 of the compressed V2 encoding, as
//! summaries and hlog lines carry it), exact adds, shifted adds (merging
//! shards whose clocks start apart) and the value at a rank. A leaf: it
//! knows no summary.

use base64::Engine as _;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};

use crate::{LATENCY_MAX_US, MetricsError, new_latency_histogram};

/// Base64 of the compressed V2 encoding of `h` (the form hlog lines use).
pub fn encode_histogram(h: &Histogram<u64>) -> Result<String, MetricsError> {
    let mut buf = Vec::new();
    V2DeflateSerializer::new()
        .serialize(h, &mut buf)
        .map_err(|e| MetricsError::Encoding(format!("{e:?}")))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(buf))
}

/// Inverse of [`encode_histogram`]; the result has the crate-wide bounds.
pub fn decode_histogram(b64: &str) -> Result<Histogram<u64>, MetricsError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(MetricsError::Base64)?;
    let decoded: Histogram<u64> = Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| MetricsError::Encoding(format!("{e:?}")))?;
    let mut out = new_latency_histogram();
    out.add(&decoded)
        .map_err(|e| MetricsError::Merge(format!("{e:?}")))?;
    Ok(out)
}

/// Adds `h` into `acc` (same bounds: an error only for corrupt input).
pub fn add_into(acc: &mut Histogram<u64>, h: &Histogram<u64>) -> Result<(), MetricsError> {
    acc.add(h)
        .map_err(|e| MetricsError::Merge(format!("{e:?}")))
}

/// The smallest recorded value by which `rank` samples had been seen, if
/// the histogram holds that many.
pub fn value_at_rank(h: &Histogram<u64>, rank: u64) -> Option<u64> {
    if rank == 0 || h.len() < rank {
        return None;
    }
    let mut seen = 0;
    for v in h.iter_recorded() {
        seen += v.count_at_value();
        if seen >= rank {
            return Some(v.value_iterated_to());
        }
    }
    None
}

/// Adds `h` into `acc` with every recorded value moved by `shift` µs (one
/// record per bucket, at the bucket's highest equivalent value, so a zero
/// shift is an exact add). Values below 0 become 0 and are counted in
/// `below_zero`; values above the histogram's range are clamped to it.
pub fn add_shifted(
    acc: &mut Histogram<u64>,
    h: &Histogram<u64>,
    shift: i128,
    below_zero: &mut u64,
) -> Result<(), MetricsError> {
    if shift == 0 {
        return add_into(acc, h);
    }
    for v in h.iter_recorded() {
        let n = v.count_at_value();
        let x = i128::from(v.value_iterated_to()) + shift;
        if x < 0 {
            *below_zero += n;
        }
        let x = x.clamp(0, i128::from(LATENCY_MAX_US)) as u64;
        acc.record_n(x, n)
            .map_err(|e| MetricsError::Merge(format!("{e:?}")))?;
    }
    Ok(())
}
