//! The outcome of a finished run: the exit code with the reason for it, and
//! the final table printed for people (headline first, as the report page).

use agent_sim_fleet::{Failure, FleetReport, Stopped};
use agent_sim_metrics::Summary;
use agent_sim_metrics::assert::Verdict;
use agent_sim_metrics::report::TableOptions;
use agent_sim_metrics::summary::Outcome;

use super::exit;

/// Decides the outcome (the outcome contract of docs/results.md): 1 when nothing could
/// run (no agent ever held a session) or the summary could not be written;
/// 2 when the run finished with an incomplete fleet; 3 when an assertion
/// failed; else 0. Reasons of every failed check are kept, the first one
/// decides the code.
pub(crate) fn decide(
    summary: &Summary,
    stopped: Option<&Stopped>,
    write_error: Option<String>,
    verdicts: &[Verdict],
) -> Outcome {
    let a = &summary.agents;
    // Agents that left on purpose (ramp-down) are neither connected nor missing.
    let complete = a.requested > 0 && a.connected + a.left >= a.requested;
    let mut code = exit::OK;
    let mut reasons = Vec::new();
    let mut fail = |c: i32, why: String| {
        if code == exit::OK {
            code = c;
        }
        reasons.push(why);
    };
    if let Some(e) = write_error {
        fail(exit::FAILURE, e);
    }
    if let Some(s) = stopped.filter(|s| s.fail_fast) {
        fail(
            exit::FAILURE,
            format!("--fail-fast: stopped at {}", words(summary, &s.failure)),
        );
    } else if a.requested > 0 && a.ever_connected == 0 {
        fail(
            exit::FAILURE,
            format!("no agent could hold a session{}", top_cause(summary)),
        );
    } else if !complete && summary.capacity.is_none() {
        // A stepped run's fleet past its knee is the result, not a fault.
        fail(
            exit::INCOMPLETE,
            format!(
                "incomplete fleet: {} of {} agent(s) connected at the end ({} never connected, \
                 {} lost and not back){}",
                a.connected,
                a.requested,
                a.never_connected,
                a.lost_not_back,
                top_cause(summary)
            ),
        );
    }
    let failed = verdicts.iter().filter(|v| !v.passed).count();
    if failed > 0 {
        fail(exit::SLO_FAILED, format!("{failed} --assert failed"));
    }
    Outcome {
        exit_code: code,
        complete,
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        missing: summary.outcome.missing.clone(),
    }
}

/// `<kind>: "<server's words>" (check <hint>)`.
fn words(summary: &Summary, f: &Failure) -> String {
    let mut s = f.kind.to_string();
    if let Some(d) = &f.detail {
        s.push_str(&format!(": \"{d}\""));
    }
    if let Some(hint) = summary.errors.get(f.kind).and_then(|e| e.hint.as_ref()) {
        s.push_str(&format!(" (check {hint})"));
    }
    s
}

/// `: most often <kind> (<count>x): "<sample>"`, or nothing without errors.
fn top_cause(summary: &Summary) -> String {
    summary
        .errors
        .iter()
        .max_by(|x, y| x.1.count.cmp(&y.1.count).then(y.0.cmp(x.0)))
        .map(|(kind, e)| {
            let mut s = format!("; most often {kind} ({}x)", e.count);
            if let Some(sample) = &e.sample {
                s.push_str(&format!(": \"{sample}\""));
            }
            if let Some(hint) = &e.hint {
                s.push_str(&format!(" (check {hint})"));
            }
            s
        })
        .unwrap_or_default()
}

/// The ramp line: how long starting and connecting every agent took.
fn ramp_line(requested: u64, reports: &[FleetReport]) -> Option<String> {
    let r = reports.iter().filter_map(|r| r.ramp_elapsed).max()?;
    let all = if reports.iter().all(|r| r.all_connected_after.is_some()) {
        reports.iter().filter_map(|r| r.all_connected_after).max()
    } else {
        None
    };
    Some(match all {
        Some(a) => format!(
            "ramp       {requested} agent(s) started in {:.2}s, all connected after {:.2}s ({:.0} sessions/s)",
            r.as_secs_f64(),
            a.as_secs_f64(),
            requested as f64 / a.as_secs_f64().max(1e-3)
        ),
        None => format!(
            "ramp       {requested} agent(s) started in {:.2}s, not all connected",
            r.as_secs_f64()
        ),
    })
}

/// Prints the final table on stdout: the headline (result, agents, ramp,
/// verdicts) first, then the figures (`verbose`: every counter).
pub(super) fn print_report(
    summary: &Summary,
    reports: &[FleetReport],
    verdicts: &[Verdict],
    verbose: bool,
) {
    let notes: Vec<String> = ramp_line(summary.agents.requested, reports)
        .into_iter()
        .collect();
    print!(
        "{}",
        agent_sim_metrics::report::render_with(
            summary,
            &TableOptions {
                verdicts,
                notes: &notes,
                verbose,
            }
        )
    );
}
