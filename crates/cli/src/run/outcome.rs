//! The outcome of a finished run: the exit code with the reason for it, and
//! the final table printed for people.

use agent_sim_fleet::FleetReport;
use agent_sim_metrics::Summary;
use agent_sim_metrics::assert::{Verdict, render_verdicts};

use super::exit;

/// The exit code and, when it is not 0, why (one line).
pub(super) fn exit_code(
    summary: &Summary,
    ever_connected: u64,
    write_error: Option<String>,
    verdicts: &[Verdict],
) -> (i32, Option<String>) {
    if let Some(e) = write_error {
        return (exit::FAILURE, Some(e));
    }
    if summary.agents.requested > 0 && ever_connected == 0 {
        return (
            exit::FAILURE,
            Some("no agent could establish a session (see errors above)".into()),
        );
    }
    if verdicts.iter().any(|v| !v.passed) {
        return (
            exit::SLO_FAILED,
            Some("at least one --assert failed".into()),
        );
    }
    (exit::OK, None)
}

/// Prints the final table, the ramp line and the verdicts on stdout.
pub(super) fn print_report(summary: &Summary, reports: &[FleetReport], verdicts: &[Verdict]) {
    print!("{}", agent_sim_metrics::report::render(summary));
    let requested = summary.agents.requested;
    if let Some(r) = reports.iter().filter_map(|r| r.ramp_elapsed).max() {
        let all = if reports.iter().all(|r| r.all_connected_after.is_some()) {
            reports.iter().filter_map(|r| r.all_connected_after).max()
        } else {
            None
        };
        match all {
            Some(a) => println!(
                "ramp       {requested} agent(s) started in {:.2}s, all connected after {:.2}s ({:.0} sessions/s)",
                r.as_secs_f64(),
                a.as_secs_f64(),
                requested as f64 / a.as_secs_f64().max(1e-3)
            ),
            None => println!(
                "ramp       {requested} agent(s) started in {:.2}s, not all connected",
                r.as_secs_f64()
            ),
        }
    }
    if !verdicts.is_empty() {
        print!("{}", render_verdicts(verdicts));
    }
}
