//! From a Consul server's readings to its storm figures (the summary's
//! `server[].storm`, [`agent_sim_metrics::storm`]): per interval between
//! two scrapes, and in total, peak and highest queue depth over the run.
//!
//! Counters ([`kinds::STORM_COUNTERS`]) become a count per interval (a
//! counter that went down, or appeared since the scrape before, counts
//! from zero: go-metrics drops a series it has not moved for a while and
//! starts it again) and its rate. Serf's messages are the count of their
//! size summary; anti-entropy reads the count of the RPC summary's label
//! sets of [`kinds::AE_METHODS`]. A queue's depth is the highest of each
//! quantile over its label sets (LAN or WAN: the deeper), and the highest
//! of their means over the depths sampled in the interval. A figure seen
//! earlier in the run whose series has gone from the exposition is 0 for
//! the interval; one never seen is absent.
//!
//! Totals and peaks are taken as each interval is recorded, so a long run
//! whose samples are thinned keeps them whole.

use std::collections::BTreeMap;

use agent_sim_metrics::storm::{Count, Depth, Peak, Queue, StormSample, StormSummary};

use crate::kinds;
use crate::reading::{Reading, SummarySet, Value};

/// A series by its name, or the name with `_total`.
fn find<'a>(r: &'a Reading, name: &str) -> Option<&'a Value> {
    r.series
        .get(name)
        .or_else(|| r.series.get(&format!("{name}_total")))
}

/// What a counter that went from `before` to `now` counted (a restart, or
/// a series new since, counts from zero).
fn grew(before: Option<f64>, now: f64) -> f64 {
    match before {
        Some(b) if now >= b => now - b,
        _ => now.max(0.0),
    }
}

/// The summary's label sets, if it is one.
fn sets(v: Option<&Value>) -> Option<&BTreeMap<String, SummarySet>> {
    match v? {
        Value::Summary(s) => Some(s),
        _ => None,
    }
}

/// Each label set's observations in the interval (count, sum) that
/// `pick` keeps (a set that went down, or is new, counts from zero).
fn observed<'a>(
    prev: Option<&'a Value>,
    cur: &'a BTreeMap<String, SummarySet>,
    pick: impl Fn(&str) -> bool + 'a,
) -> impl Iterator<Item = (f64, f64)> + 'a {
    let before = sets(prev);
    cur.iter().filter(move |(k, _)| pick(k)).map(move |(k, s)| {
        match before.and_then(|p| p.get(k)) {
            Some(b) if s.count >= b.count => (s.count - b.count, (s.sum - b.sum).max(0.0)),
            _ => (s.count.max(0.0), s.sum.max(0.0)),
        }
    })
}

/// Whether a summary's label set is an anti-entropy read's.
fn ae_method(labels: &str) -> bool {
    labels
        .split(',')
        .filter_map(|kv| kv.strip_prefix("method="))
        .any(|m| kinds::AE_METHODS.contains(&m))
}

/// A counted figure's count in the interval of `dt` seconds.
fn counted(prev: Option<&Value>, cur: &Value, dt: f64, pick: &dyn Fn(&str) -> bool) -> Option<f64> {
    let scalar = |v: Option<&Value>| match v? {
        Value::Counter(x) | Value::Gauge(x) => Some(*x),
        _ => None,
    };
    match cur {
        Value::Counter(now) | Value::Gauge(now) => Some(grew(scalar(prev), *now)),
        // Consul's JSON: the server's own rate over its window.
        Value::Rate(r) => Some(r * dt),
        Value::Summary(s) => Some(observed(prev, s, pick).map(|(n, _)| n).sum()),
        _ => None,
    }
}

/// A queue's depth in the interval.
fn depth(prev: Option<&Value>, cur: &Value) -> Option<Depth> {
    match cur {
        Value::Summary(s) => {
            let at = |want: f64| {
                s.values()
                    .flat_map(|set| set.quantiles.iter())
                    .filter(|(q, _)| (q - want).abs() < 1e-9)
                    .map(|(_, v)| *v)
                    .reduce(f64::max)
            };
            let mean = observed(prev, s, |_| true)
                .filter(|(n, _)| *n > 0.0)
                .map(|(n, sum)| sum / n)
                .reduce(f64::max);
            let d = Depth {
                p50: at(0.5),
                p90: at(0.9),
                p99: at(0.99),
                max: None,
                mean,
            };
            (d.p50.is_some() || d.p90.is_some() || d.p99.is_some() || d.mean.is_some()).then_some(d)
        }
        Value::Window { mean, max, count } if *count > 0.0 => Some(Depth {
            mean: Some(*mean),
            max: Some(*max),
            ..Depth::default()
        }),
        _ => None,
    }
}

/// Each counted figure's count in the interval from `prev` to `cur`, `dt`
/// seconds; `known`: the figures seen before (0 when gone).
fn counts(
    prev: &Reading,
    cur: &Reading,
    dt: f64,
    known: &BTreeMap<Count, f64>,
) -> BTreeMap<Count, f64> {
    let all = |_: &str| true;
    let sources = kinds::STORM_COUNTERS
        .iter()
        .map(|(name, c)| (*name, *c, &all as &dyn Fn(&str) -> bool))
        .chain([
            (
                kinds::SERF_MSGS,
                Count::SerfMsgs,
                &all as &dyn Fn(&str) -> bool,
            ),
            (
                kinds::RPC_CALLS,
                Count::AeReads,
                &ae_method as &dyn Fn(&str) -> bool,
            ),
        ]);
    let mut out = BTreeMap::new();
    for (name, c, pick) in sources {
        let got = match find(cur, name) {
            Some(v) => counted(find(prev, name), v, dt, pick),
            None => None,
        };
        match got {
            Some(n) => {
                out.insert(c, n);
            }
            None if known.contains_key(&c) => {
                out.insert(c, 0.0);
            }
            None => {}
        }
    }
    out
}

/// Keeps `value` at `at_s` if it is the highest yet (the earliest of equals).
fn raise<K: Ord>(peaks: &mut BTreeMap<K, Peak>, key: K, value: f64, at_s: f64) {
    let p = peaks.entry(key).or_insert(Peak { value, at_s });
    if value > p.value {
        *p = Peak { value, at_s };
    }
}

/// Records the interval from `prev` (read at `prev_t`) to `cur` (at `t_s`)
/// into `out`: its sample, and the totals, peaks and highest depths. A
/// server that exported none of the storm series has no storm part.
pub fn record(
    out: &mut Option<StormSummary>,
    prev: Option<(&Reading, f64)>,
    cur: &Reading,
    t_s: f64,
) {
    let Some((prev, prev_t)) = prev else {
        return;
    };
    let dt = t_s - prev_t;
    if dt <= 0.0 || !dt.is_finite() {
        return;
    }
    let none = BTreeMap::new();
    let known = out.as_ref().map_or(&none, |o| &o.total);
    let counts = counts(prev, cur, dt, known);
    let queues: BTreeMap<Queue, Depth> = kinds::STORM_QUEUES
        .iter()
        .filter_map(|(name, q)| Some((*q, depth(find(prev, name), find(cur, name)?)?)))
        .collect();
    if counts.is_empty() && queues.is_empty() {
        return;
    }
    let out = out.get_or_insert_with(StormSummary::default);
    let mut sample = StormSample {
        t_s,
        ..StormSample::default()
    };
    for (c, n) in counts {
        *out.total.entry(c).or_default() += n;
        let rate = n / dt;
        sample.per_s.insert(c, rate);
        raise(&mut out.peak_per_s, c, rate, t_s);
    }
    for (q, d) in queues {
        if let Some(h) = d.high() {
            raise(&mut out.queue_max, q, h, t_s);
        }
        sample.queues.insert(q, d);
    }
    out.samples.push(sample);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reading::parse_prometheus;

    fn read(text: &str) -> Reading {
        parse_prometheus(text, &|kind, name| kinds::kept(kind, name, &[]))
    }

    /// A Consul server's storm series as a 1.20.1 server writes them, with
    /// `n` standing for how far the storm went.
    fn exposition(n: u32) -> String {
        let f = f64::from(n);
        format!(
            "# TYPE consul_memberlist_udp_received counter\n\
             consul_memberlist_udp_received{{network=\"lan\"}} {}\n\
             consul_memberlist_udp_received{{network=\"wan\"}} 100\n\
             # TYPE consul_memberlist_msg_alive counter\n\
             consul_memberlist_msg_alive{{network=\"lan\"}} {}\n\
             # HELP consul_serf_events_consul:new_leader consul_serf_events_consul:new_leader\n\
             # TYPE consul_serf_events_consul:new_leader counter\n\
             consul_serf_events_consul:new_leader{{network=\"lan\"}} 1\n\
             # TYPE consul_serf_queue_Intent summary\n\
             consul_serf_queue_Intent{{network=\"lan\",quantile=\"0.5\"}} {}\n\
             consul_serf_queue_Intent{{network=\"lan\",quantile=\"0.99\"}} {}\n\
             consul_serf_queue_Intent_sum{{network=\"lan\"}} {}\n\
             consul_serf_queue_Intent_count{{network=\"lan\"}} {n}\n\
             consul_serf_queue_Intent{{network=\"wan\",quantile=\"0.99\"}} 0\n\
             consul_serf_queue_Intent_sum{{network=\"wan\"}} 0\n\
             consul_serf_queue_Intent_count{{network=\"wan\"}} {n}\n\
             # TYPE consul_rpc_server_call summary\n\
             consul_rpc_server_call{{errored=\"false\",method=\"Catalog.NodeServiceList\",quantile=\"0.5\"}} 0.1\n\
             consul_rpc_server_call_sum{{errored=\"false\",method=\"Catalog.NodeServiceList\"}} 1\n\
             consul_rpc_server_call_count{{errored=\"false\",method=\"Catalog.NodeServiceList\"}} {}\n\
             consul_rpc_server_call_sum{{errored=\"false\",method=\"Health.NodeChecks\"}} 1\n\
             consul_rpc_server_call_count{{errored=\"false\",method=\"Health.NodeChecks\"}} {}\n\
             consul_rpc_server_call_sum{{errored=\"false\",method=\"Status.Ping\"}} 1\n\
             consul_rpc_server_call_count{{errored=\"false\",method=\"Status.Ping\"}} {}\n",
            1000.0 + f * 500.0,
            f * 100.0,
            f * 10.0,
            f * 20.0,
            f * f * 10.0,
            f * 6.0,
            f * 4.0,
            f * 1000.0,
        )
    }

    #[test]
    fn counters_are_rates_and_totals_queues_their_deepest_set() {
        let mut out = None;
        let (a, b, c) = (
            read(&exposition(0)),
            read(&exposition(2)),
            read(&exposition(3)),
        );
        record(&mut out, Some((&a, 0.0)), &b, 5.0);
        record(&mut out, Some((&b, 5.0)), &c, 10.0);
        let s = out.expect("a storm part");
        let x = &s.samples[0];
        assert_eq!(x.per_s[&Count::GossipBytesIn], 200.0, "{x:?}");
        assert_eq!(x.per_s[&Count::AliveMsgs], 40.0);
        assert_eq!(x.per_s[&Count::AeReads], 4.0, "only the two AE methods");
        assert_eq!(
            x.per_s[&Count::NewLeaderEvents],
            0.0,
            "the colon name is read"
        );
        let q = x.queues[&Queue::Intent];
        assert_eq!(
            (q.p50, q.p99),
            (Some(20.0), Some(40.0)),
            "lan is the deeper"
        );
        assert_eq!(
            q.mean,
            Some(20.0),
            "the deeper set's: 40 over its 2 samples"
        );
        assert_eq!(s.total[&Count::GossipBytesIn], 1500.0);
        assert_eq!(s.total[&Count::AliveMsgs], 300.0);
        assert_eq!(s.total[&Count::AeReads], 30.0);
        assert_eq!(
            s.peak_per_s[&Count::AliveMsgs],
            Peak {
                value: 40.0,
                at_s: 5.0
            }
        );
        assert_eq!(
            s.queue_max[&Queue::Intent],
            Peak {
                value: 60.0,
                at_s: 10.0
            }
        );
        assert!(
            !s.total.contains_key(&Count::SerfMsgs),
            "never exported: absent"
        );
        assert!(!s.total.contains_key(&Count::HandlerDrops));
    }

    #[test]
    fn a_series_gone_is_zero_and_one_back_counts_from_zero() {
        let mut out = None;
        let with = |n: u32| {
            read(&format!(
                "# TYPE consul_memberlist_msg_suspect counter\nconsul_memberlist_msg_suspect {n}\n"
            ))
        };
        let without =
            read("# TYPE consul_memberlist_msg_alive counter\nconsul_memberlist_msg_alive 1\n");
        record(&mut out, Some((&with(0), 0.0)), &with(10), 5.0);
        record(&mut out, Some((&with(10), 5.0)), &without, 10.0);
        record(&mut out, Some((&without, 10.0)), &with(3), 15.0);
        let s = out.unwrap();
        let rates: Vec<f64> = s
            .samples
            .iter()
            .map(|x| x.per_s[&Count::SuspectMsgs])
            .collect();
        assert_eq!(rates, [2.0, 0.0, 0.6]);
        assert_eq!(s.total[&Count::SuspectMsgs], 13.0);
    }

    #[test]
    fn the_embedded_servers_drops_and_no_storm_series_at_all() {
        let mut out = None;
        let drops = |n: u32| {
            read(&format!(
                "# TYPE agent_sim_memberlist_handler_queue_dropped_total counter\n\
                 agent_sim_memberlist_handler_queue_dropped_total {n}\n"
            ))
        };
        record(&mut out, Some((&drops(0), 0.0)), &drops(50), 5.0);
        assert_eq!(out.as_ref().unwrap().total[&Count::HandlerDrops], 50.0);
        let mut none = None;
        let sensu = read("# TYPE sensu_go_keepalives counter\nsensu_go_keepalives 5\n");
        record(&mut none, Some((&sensu, 0.0)), &sensu, 5.0);
        record(&mut none, None, &sensu, 5.0);
        assert_eq!(none, None);
    }
}
