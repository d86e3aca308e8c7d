//! The page's "Capacity" section of a stepped run (`--steps`): the answer,
//! one row per step, and each SLO's figure, the server's cores and its RSS
//! drawn against the agents of each step, the knee marked.

use super::blocks::{close, figure, kv, open, table};
use super::esc;
use super::svg::{Axis, Chart, Mark, Scale, Series, Unit};
use crate::assert::{Assertion, Measure};
use crate::capacity::{CapacitySummary, StepSummary, StepVerdict};
use crate::summary::Summary;
use crate::units::Kind;

/// The section, when the run was stepped.
pub(super) fn capacity(o: &mut String, s: &Summary) {
    let Some(c) = &s.capacity else {
        return;
    };
    open(o, "capacity", "Capacity");
    kv(
        o,
        &[
            ("answer", c.answer.clone()),
            ("judged by", c.slos.join(", ")),
            (
                "each step",
                format!(
                    "settled {:.0} s, then held and judged {:.0} s",
                    c.settle_s, c.hold_s
                ),
            ),
        ],
    );
    steps_table(o, c);
    let marks = knee_marks(c);
    for (i, slo) in c.slos.iter().enumerate() {
        let points = per_step(c, |st| st.slos.get(i).and_then(|f| f.value));
        let (unit, reference) = slo_axis(slo);
        let chart = against_agents(slo, c, unit, slo_path(slo), points, &marks, reference);
        figure(o, chart, &format!("{slo}, over each step's window"));
    }
    let cores = per_step(c, |st| st.server.first().and_then(|x| x.cpu_cores));
    let chart = against_agents(
        "Server CPU",
        c,
        Unit::Cores,
        "cores (mean)",
        cores,
        &marks,
        None,
    );
    figure(o, chart, "The server's CPU over each step's window");
    let rss = per_step(c, |st| st.server.first().and_then(|x| x.rss_bytes));
    let mib: Vec<(f64, f64)> = rss.iter().map(|(x, y)| (*x, y / 1_048_576.0)).collect();
    let chart = against_agents(
        "Server RSS",
        c,
        Unit::ScaledBytes(2),
        "resident memory (mean)",
        mib,
        &marks,
        None,
    );
    figure(
        o,
        chart,
        "The server's resident memory over each step's window",
    );
    close(o);
}

fn steps_table(o: &mut String, c: &CapacitySummary) {
    let mut head: Vec<String> = vec![">agents".into(), ">connected".into(), ">errors".into()];
    head.extend(c.slos.iter().map(|s| format!(">{}", slo_path(s))));
    head.extend([
        ">server cores".into(),
        ">server RSS".into(),
        "verdict".into(),
    ]);
    let rows: Vec<Vec<String>> = c
        .steps
        .iter()
        .map(|st| {
            let mut row = vec![
                st.agents.to_string(),
                st.connected.to_string(),
                st.errors.to_string(),
            ];
            row.extend(st.slos.iter().map(|f| {
                let by = f.over.map_or(String::new(), |x| format!(" ({x:.2}x)"));
                let text = esc(&format!("{}{by}", f.actual));
                if f.passed {
                    text
                } else {
                    format!("<strong>{text}</strong>")
                }
            }));
            let srv = st.server.first();
            row.push(
                srv.and_then(|x| x.cpu_cores)
                    .map_or("-".into(), |v| format!("{v:.2}")),
            );
            row.push(
                srv.and_then(|x| x.rss_bytes)
                    .map_or("-".into(), |v| format!("{:.0} MiB", v / 1_048_576.0)),
            );
            row.push(verdict_cell(st));
            row
        })
        .collect();
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    table(o, &head, &rows);
}

fn verdict_cell(st: &StepSummary) -> String {
    let word = esc(st.verdict.word());
    match st.verdict {
        StepVerdict::Held | StepVerdict::Cut => word,
        StepVerdict::LoadBox => {
            format!("<strong>{word}</strong>: {}", esc(&st.load_box.join("; ")))
        }
        StepVerdict::Failed => format!("<strong>{word}</strong>"),
    }
}

/// The knee on the agents axis: the capacity and the step that broke.
fn knee_marks(c: &CapacitySummary) -> Vec<Mark> {
    let mut marks = Vec::new();
    if let Some(n) = c.capacity {
        marks.push(Mark {
            x: n as f64,
            label: format!("capacity {n}"),
        });
    }
    if let Some(n) = c.broke_at {
        marks.push(Mark {
            x: n as f64,
            label: format!("broke at {n}"),
        });
    }
    marks
}

/// `(agents, value)` of each judged step that has the value.
fn per_step(c: &CapacitySummary, f: impl Fn(&StepSummary) -> Option<f64>) -> Vec<(f64, f64)> {
    c.steps
        .iter()
        .filter(|st| st.verdict != StepVerdict::Cut)
        .filter_map(|st| f(st).map(|v| (st.agents as f64, v)))
        .collect()
}

/// An SLO's path (`propagation.p99 < 1s` → `propagation.p99`).
fn slo_path(slo: &str) -> &str {
    slo.split(['<', '>', '=', '!']).next().unwrap_or(slo).trim()
}

/// How an SLO's values read, and its threshold as a reference line (none
/// for a comparison with `requested`, whose threshold is each step's).
fn slo_axis(slo: &str) -> (Unit, Option<(f64, String)>) {
    let unit = match slo_path(slo).parse::<Measure>().map(|m| m.unit()) {
        Ok(Kind::Micros) => Unit::Micros,
        Ok(Kind::Bytes) => Unit::Bytes,
        _ => Unit::Count,
    };
    let reference = slo
        .parse::<Assertion>()
        .ok()
        .filter(|_| !slo.contains("requested") && !matches!(unit, Unit::Bytes))
        .map(|a| (a.threshold(0), "the SLO".to_string()));
    (unit, reference)
}

/// A line of `points` against the steps' agents, the knee marked.
fn against_agents(
    title: &str,
    c: &CapacitySummary,
    unit: Unit,
    y_title: &str,
    points: Vec<(f64, f64)>,
    marks: &[Mark],
    reference: Option<(f64, String)>,
) -> Option<Chart> {
    if points.is_empty() {
        return None;
    }
    let most = c.steps.iter().map(|s| s.agents).max().unwrap_or(1) as f64;
    let top = points
        .iter()
        .map(|p| p.1)
        .chain(reference.iter().map(|r| r.0))
        .fold(0.0f64, f64::max);
    Some(Chart {
        title: title.to_string(),
        x: Axis {
            scale: Scale::linear_from_zero(most),
            unit: Unit::Count,
            title: "agents in the step".into(),
        },
        y: Axis {
            scale: Scale::linear_from_zero(top.max(1e-9)),
            unit,
            title: y_title.to_string(),
        },
        series: vec![Series {
            name: title.to_string(),
            points,
            steps: false,
        }],
        bars: Vec::new(),
        marks: marks.to_vec(),
        reference,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{SloFigure, StepServer};

    #[test]
    fn a_stepped_run_gets_its_table_and_curves_with_the_knee_marked() {
        let step = |agents: u64, p99_ms: f64, passed| StepSummary {
            agents,
            connected: agents,
            verdict: if passed {
                StepVerdict::Held
            } else {
                StepVerdict::Failed
            },
            slos: vec![SloFigure {
                slo: "propagation.p99 < 1s".into(),
                actual: format!("{p99_ms}ms"),
                value: Some(p99_ms * 1000.0),
                passed,
                over: (!passed).then_some(p99_ms / 1000.0),
                note: None,
            }],
            server: vec![StepServer {
                target: "consul".into(),
                cpu_cores: Some(agents as f64 / 1000.0),
                rss_bytes: Some(agents as f64 * 200_000.0),
                ..StepServer::default()
            }],
            ..StepSummary::default()
        };
        let mut c = CapacitySummary {
            slos: vec!["propagation.p99 < 1s".into()],
            steps: vec![
                step(1000, 40.0, true),
                step(2000, 90.0, true),
                step(4000, 1620.0, false),
            ],
            ..CapacitySummary::default()
        };
        c.conclude(false);
        let s = Summary {
            capacity: Some(c),
            ..Summary::default()
        };
        let mut o = String::new();
        capacity(&mut o, &s);
        assert!(o.contains("<section id=\"capacity\">"), "{o}");
        assert!(
            o.contains("capacity 2000 agents; broke at 4000 agents"),
            "{o}"
        );
        assert_eq!(o.matches("<svg").count(), 3, "the SLO, cores and RSS");
        assert!(o.contains("broke at 4000") && o.contains("agents in the step"));
        assert!(o.contains("<strong>1620ms (1.62x)</strong>"), "{o}");
        let mut none = String::new();
        capacity(&mut none, &Summary::default());
        assert!(none.is_empty());
    }
}
