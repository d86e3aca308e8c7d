//! Process exit codes of `agent-sim` (README and docs/results.md).

/// Run completed (and every assertion held).
pub const OK: i32 = 0;
/// Nothing could run: no agent ever held a session (or `--fail-fast`
/// stopped the run), or a result file could not be written.
pub const FAILURE: i32 = 1;
/// The run finished but the fleet was incomplete at the end.
pub const INCOMPLETE: i32 = 2;
/// At least one `--assert` failed.
pub const SLO_FAILED: i32 = 3;
/// Bad usage (flags, config file, host limits).
pub const USAGE: i32 = 64;
