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
    // Bound: each target's samples kept to figures::MAX_SAMPLES.
    targets: Mutex<Vec<(ServerSummary, BTreeMap<String, &'static str>)>>,
}

impl LiveStore {
    /// Starts over with the targets as their baselines left them.
    pub(crate) fn start<'a>(
        &self,
        tracks: impl Iterator<Item = (&'a ServerSummary, &'a BTreeMap<String, &'static str>)>,
    ) {
        *lock(&self.targets) = tracks
            .map(|(out, units)| {
                let head = ServerSummary {
                    samples: Vec::new(),
                    storm: None,
                    gossip: None,
                    ..out.clone()
                };
                (head, units.clone())
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
        let Some((head, u)) = targets.get_mut(i) else {
            return;
        };
        if let Some(last) = newest
            && head.samples.last().is_none_or(|h| h.t_s < last.t_s)
        {
            head.samples.push(last.clone());
            figures::bound(&mut head.samples);
        }
        head.kind = kind.to_owned();
        u.clone_from(units);
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
            .map(|(head, units)| {
                let mut s = head.clone();
                let starts =
                    std::iter::once(head.baseline.t_s).chain(head.samples.iter().map(|x| x.t_s));
                s.samples = head
                    .samples
                    .iter()
                    .zip(starts)
                    .filter(|(x, began)| *began >= from_s && x.t_s <= to_s)
                    .map(|(x, _)| ServerSample {
                        steady: true,
                        ..x.clone()
                    })
                    .collect();
                s.notes.clear();
                figures::summarize(&mut s, units);
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
}
