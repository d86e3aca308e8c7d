//! serf's network coordinates: an agent's Vivaldi estimate (8 dimensions,
//! a height, an adjustment and an error, moved by each measured round trip
//! to a peer whose coordinate is known), and the coordinate's place in a
//! probe's ack (a version byte, then the coordinate as a msgpack map).

use std::time::Duration;

use agent_sim_proto::msgpack::Writer;

use crate::wire::WireError;
use crate::wire::read::Reader;

/// The ack payload's version byte.
pub const PING_VERSION: u8 = 1;

/// Dimensions of the Euclidean part.
pub const DIMENSIONS: usize = 8;
/// Most error an estimate may claim (a fresh one's).
const ERROR_MAX: f64 = 1.5;
/// How fast the error follows the measured one.
const CE: f64 = 0.25;
/// How far a sample moves the coordinate.
const CC: f64 = 0.25;
/// Samples averaged into the adjustment term.
const ADJUSTMENT_WINDOW: usize = 20;
/// Smallest height (seconds).
const HEIGHT_MIN: f64 = 10.0e-6;
/// Samples per peer whose median is used.
const LATENCY_FILTER: usize = 3;
/// Gravity's pull back to the origin (seconds).
const GRAVITY_RHO: f64 = 150.0;
/// Below this, a distance is zero.
const ZERO: f64 = 1.0e-6;

/// A network coordinate (all in seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Coord {
    /// The Euclidean part.
    pub vec: [f64; DIMENSIONS],
    /// How wrong it may be.
    pub error: f64,
    /// The adjustment term.
    pub adjustment: f64,
    /// The height (the access link).
    pub height: f64,
}

impl Default for Coord {
    fn default() -> Self {
        Coord {
            vec: [0.0; DIMENSIONS],
            error: ERROR_MAX,
            adjustment: 0.0,
            height: HEIGHT_MIN,
        }
    }
}

fn magnitude(v: &[f64; DIMENSIONS]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

impl Coord {
    /// Distance without the adjustment terms.
    fn raw_distance(&self, other: &Coord) -> f64 {
        let mut d = [0.0; DIMENSIONS];
        for (i, x) in d.iter_mut().enumerate() {
            *x = self.vec[i] - other.vec[i];
        }
        magnitude(&d) + self.height + other.height
    }

    /// The estimated round trip to `other` (seconds).
    pub fn distance(&self, other: &Coord) -> f64 {
        let d = self.raw_distance(other);
        let adjusted = d + self.adjustment + other.adjustment;
        if adjusted > 0.0 { adjusted } else { d }
    }

    /// Moves the coordinate by `force` along the line from `other`.
    fn apply_force(&mut self, force: f64, other: &Coord) {
        let mut unit = [0.0; DIMENSIONS];
        for (i, x) in unit.iter_mut().enumerate() {
            *x = self.vec[i] - other.vec[i];
        }
        let mag = magnitude(&unit);
        if mag > ZERO {
            unit.iter_mut().for_each(|x| *x /= mag);
        } else {
            // On top of each other: a random direction.
            unit.iter_mut().for_each(|x| *x = fastrand::f64() - 0.5);
            let m = magnitude(&unit);
            if m > ZERO {
                unit.iter_mut().for_each(|x| *x /= m);
            } else {
                unit = [0.0; DIMENSIONS];
                unit[0] = 1.0;
            }
        }
        for (v, u) in self.vec.iter_mut().zip(unit) {
            *v += u * force;
        }
        if mag > ZERO {
            self.height =
                ((self.height + other.height) * force / mag + self.height).max(HEIGHT_MIN);
        }
    }

    fn is_valid(&self) -> bool {
        self.vec.iter().all(|x| x.is_finite())
            && self.error.is_finite()
            && self.adjustment.is_finite()
            && self.height.is_finite()
    }
}

/// One agent's coordinate client.
#[derive(Debug, Clone)]
pub struct Vivaldi {
    coord: Coord,
    /// Recent round trips to the one peer (the median of these is used).
    latest: [f64; LATENCY_FILTER],
    seen: usize,
    /// Recent (measured − estimated) samples of the adjustment term.
    adjustments: [f64; ADJUSTMENT_WINDOW],
    next_adjustment: usize,
}

impl Default for Vivaldi {
    fn default() -> Self {
        Vivaldi {
            coord: Coord::default(),
            latest: [0.0; LATENCY_FILTER],
            seen: 0,
            adjustments: [0.0; ADJUSTMENT_WINDOW],
            next_adjustment: 0,
        }
    }
}

impl Vivaldi {
    /// The current estimate.
    pub fn coord(&self) -> &Coord {
        &self.coord
    }

    /// Moves the estimate by one round trip `rtt` to a peer at `other`.
    pub fn observe(&mut self, other: &Coord, rtt: Duration) {
        self.latest[self.seen % LATENCY_FILTER] = rtt.as_secs_f64();
        self.seen += 1;
        let n = self.seen.min(LATENCY_FILTER);
        let mut s = self.latest;
        s[..n].sort_by(f64::total_cmp);
        let rtt = s[n / 2].max(ZERO);

        // Vivaldi's step: the error follows how wrong the estimate was,
        // weighted by how sure each side is.
        let dist = self.coord.distance(other);
        let wrongness = (dist - rtt).abs() / rtt;
        let total = (self.coord.error + other.error).max(ZERO);
        let weight = self.coord.error / total;
        self.coord.error =
            (CE * weight * wrongness + self.coord.error * (1.0 - CE * weight)).min(ERROR_MAX);
        self.coord.apply_force(CC * weight * (rtt - dist), other);

        // The adjustment term: half the mean of recent residuals.
        let raw = self.coord.raw_distance(other);
        self.adjustments[self.next_adjustment] = rtt - raw;
        self.next_adjustment = (self.next_adjustment + 1) % ADJUSTMENT_WINDOW;
        self.coord.adjustment =
            self.adjustments.iter().sum::<f64>() / (2.0 * ADJUSTMENT_WINDOW as f64);

        // Gravity keeps the whole system near the origin.
        let origin = Coord {
            vec: [0.0; DIMENSIONS],
            error: ERROR_MAX,
            adjustment: 0.0,
            height: HEIGHT_MIN,
        };
        let pull = self.coord.distance(&origin) / GRAVITY_RHO;
        self.coord.apply_force(-(pull * pull), &origin);
        if !self.coord.is_valid() {
            *self = Vivaldi::default();
        }
    }
}

impl Coord {
    /// The payload of an ack: version byte and the coordinate (fields in
    /// sorted order, as a real agent's acks have them).
    pub fn ack_payload(&self, out: &mut Vec<u8>) {
        out.push(PING_VERSION);
        let mut w = Writer(out);
        w.map(4).str("Adjustment").f64(self.adjustment);
        w.str("Error").f64(self.error);
        w.str("Height").f64(self.height);
        w.str("Vec").array(DIMENSIONS as u32);
        for v in self.vec {
            w.f64(v);
        }
    }

    /// From an ack's payload.
    pub fn from_ack_payload(p: &[u8]) -> Result<Self, WireError> {
        let (&v, rest) = p.split_first().ok_or(WireError::Truncated)?;
        if v != PING_VERSION {
            return Err(WireError::Unknown(v));
        }
        let mut c = Coord::default();
        Reader::new(rest).fields(|k, r| {
            match k {
                "Vec" => {
                    let n = r.array()?;
                    for i in 0..n {
                        let x = r.float()?;
                        if let Some(slot) = c.vec.get_mut(i) {
                            *slot = x;
                        }
                    }
                }
                "Error" => c.error = r.float()?,
                "Adjustment" => c.adjustment = r.float()?,
                "Height" => c.height = r.float()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        if !c.is_valid() {
            return Err(WireError::Range);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_round_trip_is_learned() {
        let server = Coord::default();
        let mut v = Vivaldi::default();
        for _ in 0..200 {
            v.observe(&server, Duration::from_millis(2));
        }
        let est = v.coord().distance(&server);
        assert!((est - 0.002).abs() < 0.0005, "estimate {est}");
        assert!(v.coord().error < 0.5, "error {}", v.coord().error);
        assert!(v.coord().height >= HEIGHT_MIN);
    }

    #[test]
    fn the_ack_payload_reads_back() {
        let mut v = Vivaldi::default();
        v.observe(&Coord::default(), Duration::from_millis(3));
        let mut b = Vec::new();
        v.coord().ack_payload(&mut b);
        assert_eq!(b[0], PING_VERSION);
        assert_eq!(&Coord::from_ack_payload(&b).unwrap(), v.coord());
    }
}
