//! The observer's figures while the run goes on: each target's baseline
//! and samples so far, and what they say over a window of the run
//! ([`LiveView::window`]), for a stepped run to judge each step by.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use agent_sim_metrics::server::{ServerSample, ServerSummary};

use crate::figures;

/// Each target's baseline and samples so far, with its latencies' units.
#[derive(Debug, Default)]
pub(crate) struct LiveStore {
    targets: Mutex<Vec<Live>>,
}

/// One target as the run goes on.
#[derive(Debug)]
struct Live {
    /// Its summary as the baseline left it (no samples).
    head: ServerSummary,
    units: BTreeMap<String, &'static str>,
    /// Each sample with the time its interval began (the scrape before
    /// it, or the baseline), kept as it was published: thinning the list
    /// later does not move it.
    // Bound: figures::MAX_SAMPLES.
    samples: Vec<(f64, ServerSample)>,
}

impl LiveStore {
    /// Starts over with the targets as their baselines left them.
    pub(crate) fn start<'a>(
        &self,
        tracks: impl Iterator<Item = (&'a ServerSummary, &'a BTreeMap<String, &'static str>)>,
    ) {
        *lock(&self.targets) = tracks
            .map(|(out, units)| Live {
                head: ServerSummary {
                    samples: Vec::new(),
                    storm: None,
                    gossip: None,
                    ..out.clone()
                },
                units: units.clone(),
                samples: Vec::new(),
            })
            .collect();
    }

    /// Target `i`'s newest sample (kept once), its kind and its units.
    pub(crate) fn publish(
        &self,
        i: usize,
        newest: Option<&ServerSample>,
        kind: &str,
        units: &BTreeMap<String, &'static str>,
    ) {
        let mut targets = lock(&self.targets);
        let Some(t) = targets.get_mut(i) else {
            return;
        };
        let before = t.samples.last().map_or(t.head.baseline.t_s, |(_, x)| x.t_s);
        if let Some(last) = newest
            && t.samples.last().is_none_or(|(_, h)| h.t_s < last.t_s)
        {
            t.samples.push((before, last.clone()));
            figures::bound(&mut t.samples);
        }
        t.head.kind = kind.to_owned();
        t.units.clone_from(units);
    }
}

/// The observer's figures while the run goes on ([`crate::Observer::live`]).
#[derive(Debug, Clone)]
pub struct LiveView {
    store: Arc<LiveStore>,
}

impl LiveView {
    pub(crate) fn new(store: Arc<LiveStore>) -> Self {
        LiveView { store }
    }

    /// What each target did between `from_s` and `to_s` (seconds of the
    /// run), while the run goes on: its baseline, the samples whose whole
    /// interval lies inside the window (all taken as steady state) and the
    /// figures of those alone. A sample's rates and latencies cover the
    /// time since the scrape before it (the baseline's for the first), so
    /// a scrape just inside the window whose interval began before it
    /// (a step's ramp, a scrape that failed) is left out.
    pub fn window(&self, from_s: f64, to_s: f64) -> Vec<ServerSummary> {
        lock(&self.store.targets)
            .iter()
            .map(|t| {
                let mut s = t.head.clone();
                s.samples = t
                    .samples
                    .iter()
                    .filter(|(began, x)| *began >= from_s && x.t_s <= to_s)
                    .map(|(_, x)| ServerSample {
                        steady: true,
                        ..x.clone()
                    })
                    .collect();
                s.notes.clear();
                figures::summarize(&mut s, &t.units);
                s
            })
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_s: f64, cpu: f64) -> ServerSample {
        ServerSample {
            t_s,
            agents: 10,
            cpu_cores: Some(cpu),
            ..ServerSample::default()
        }
    }

    #[test]
    fn a_window_takes_only_its_own_scrapes_as_steady_state() {
        let store = Arc::new(LiveStore::default());
        let out = ServerSummary {
            target: "consul".into(),
            baseline: ServerSample {
                cpu_cores: Some(0.1),
                ..ServerSample::default()
            },
            ..ServerSummary::default()
        };
        let units = BTreeMap::new();
        store.start(std::iter::once((&out, &units)));
        for (t, cpu) in [(5.0, 0.5), (10.0, 1.5), (15.0, 2.5)] {
            store.publish(0, Some(&sample(t, cpu)), "consul", &units);
        }
        // The same sample published twice is kept once.
        store.publish(0, Some(&sample(15.0, 2.5)), "consul", &units);
        let w = LiveView::new(store.clone()).window(5.0, 15.0);
        assert_eq!(w[0].samples.len(), 2);
        assert_eq!(w[0].sizing.cpu_cores.mean, Some(2.0));
        assert_eq!(w[0].sizing.cpu_cores.baseline, Some(0.1));
        let per = w[0].sizing.cores_per_1000_agents.unwrap();
        assert!((per - 190.0).abs() < 1e-9, "{per}");
        // A window opened at 4 s: the scrape at 5 s covers 0-5 s (from
        // the baseline), so it is not the window's.
        let w = LiveView::new(store.clone()).window(4.0, 15.0);
        assert_eq!(w[0].samples.len(), 2);
        assert_eq!(w[0].sizing.cpu_cores.mean, Some(2.0));
        let w = LiveView::new(store).window(0.0, 15.0);
        assert_eq!(w[0].samples.len(), 3);
    }

    #[test]
    fn a_thinned_list_keeps_each_samples_own_interval() {
        let store = Arc::new(LiveStore::default());
        let out = ServerSummary::default();
        let units = BTreeMap::new();
        store.start(std::iter::once((&out, &units)));
        // One scrape a second, past the bound: the list is thinned.
        let n = figures::MAX_SAMPLES + 1;
        for t in 1..=n {
            store.publish(0, Some(&sample(t as f64, 1.0)), "consul", &units);
        }
        let kept: Vec<f64> = lock(&store.targets)[0]
            .samples
            .iter()
            .map(|(_, x)| x.t_s)
            .collect();
        assert!(kept.len() < n, "thinned: {}", kept.len());
        // Each kept scrape's interval is the second before it, however
        // far apart its neighbours in the list now are.
        let from = (n - 9) as f64;
        let inside = kept.iter().filter(|&&t| t - 1.0 >= from).count();
        assert!(inside >= 5, "{kept:?}");
        let w = LiveView::new(store).window(from, n as f64);
        assert_eq!(w[0].samples.len(), inside);
    }
}
