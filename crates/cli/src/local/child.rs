//! A local process's side: the parent names it in the environment
//! (`AGENT_SIM_LOCAL_CHILD=I/N;DIR;SOURCES`), it runs shard I/N of the same
//! flags, writes its summary and interval log into DIR for the parent to
//! merge, judges no assertion (the parent judges the whole), and writes a
//! progress line a second on stderr that the parent adds up.

use std::path::PathBuf;

use crate::args::RunArgs;
use crate::values::{Secs, ShardSpec, ValueError};

/// The environment variable that makes a process a local child.
pub const CHILD_ENV: &str = "AGENT_SIM_LOCAL_CHILD";

/// Why a child's [`CHILD_ENV`] cannot be applied (each carries the
/// variable's value).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChildEnvError {
    /// Its shard does not parse.
    #[error("{CHILD_ENV}={value:?}: {source}")]
    Shard {
        /// The variable's value.
        value: String,
        /// Why the shard does not parse (boxed: the error stays small).
        source: Box<ValueError>,
    },
    /// Its shard has no index.
    #[error("{CHILD_ENV}={value:?}: no index")]
    NoIndex {
        /// The variable's value.
        value: String,
    },
    /// Its source addresses do not parse.
    #[error(transparent)]
    Sources(ValueError),
}

/// The value of [`CHILD_ENV`] for child `index` of `count`.
pub(super) fn child_env(index: u64, count: u64, dir: &std::path::Path, sources: &str) -> String {
    format!("{index}/{count};{};{sources}", dir.display())
}

/// Applies a child's settings to the flag layer (the top one): its shard,
/// its result files in the parent's folder, no assertion, no page, no
/// live terminal line, its source addresses; `Ok(false)` when this process
/// is not a child.
pub fn apply_child(
    cli: &mut RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<bool, ChildEnvError> {
    let Some(v) = env(CHILD_ENV) else {
        return Ok(false);
    };
    let mut parts = v.splitn(3, ';');
    let (shard, dir, sources) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let spec: ShardSpec = shard.parse().map_err(|source| ChildEnvError::Shard {
        value: v.clone(),
        source: Box::new(source),
    })?;
    let index = spec
        .index
        .ok_or_else(|| ChildEnvError::NoIndex { value: v.clone() })?;
    let dir = PathBuf::from(dir);
    cli.shard = Some(spec);
    cli.summary = Some(dir.join(format!("{index}.json")));
    cli.hlog = Some(dir.join(format!("{index}.hlog")));
    cli.hlog_interval = cli
        .hlog_interval
        .or(Some(Secs(std::time::Duration::from_secs(1))));
    cli.report_html = None;
    cli.metrics_addr = None;
    cli.asserts.clear();
    cli.quiet = Some(true);
    cli.processes = Some(1);
    if !sources.is_empty() {
        cli.source_addrs = super::parse_sources(sources).map_err(ChildEnvError::Sources)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::{ChildProgress, PROGRESS_PREFIX, progress_line};
    use agent_sim_metrics::Snapshot;

    #[test]
    fn a_child_takes_its_shard_files_and_sources_from_the_environment() {
        let mut a = RunArgs {
            asserts: vec!["errors.total == 0".parse().unwrap()],
            ..RunArgs::default()
        };
        let dir = std::path::Path::new("/tmp/x");
        let v = child_env(1, 3, dir, "127.0.0.1-127.0.0.3");
        assert!(apply_child(&mut a, &|k| (k == CHILD_ENV).then(|| v.clone())).unwrap());
        assert_eq!(a.shard.unwrap().to_string(), "1/3");
        assert_eq!(a.summary.as_deref(), Some(dir.join("1.json").as_path()));
        assert!(a.asserts.is_empty() && a.quiet == Some(true));
        assert_eq!(a.source_addrs.len(), 1);
        let mut b = RunArgs::default();
        assert!(!apply_child(&mut b, &|_| None).unwrap());
        assert!(b.shard.is_none());
    }

    #[test]
    fn progress_lines_round_trip() {
        let snap = Snapshot {
            counters: vec![("keepalives_sent", 7), ("events_sent", 0)],
            connected: 5,
            ..Snapshot::default()
        };
        let line = progress_line(&snap, 9);
        let p: ChildProgress =
            serde_json::from_str(line.strip_prefix(PROGRESS_PREFIX).unwrap()).unwrap();
        assert_eq!((p.connected, p.started, p.counters.len()), (5, 9, 1));
    }
}
