//! Which slice of a multi-process run this process is: `--shard I/N` as
//! given, or `--shard N` with the index from the engine that started it.
//!
//! Engines hand each task its number in an environment variable, and not
//! all count alike: a Kubernetes Indexed Job sets `JOB_COMPLETION_INDEX`
//! and Nomad `NOMAD_ALLOC_INDEX`, both from 0; Docker Swarm numbers a
//! service's task slots from 1 and expands `{{.Task.Slot}}` in the
//! service's environment only (not in its arguments), so a Swarm service
//! sets `AGENT_SIM_SHARD_SLOT={{.Task.Slot}}` and the slot is the index + 1,
//! no arithmetic in a template. [`resolve`] reads them, refuses a value
//! that is not a number or does not fit N in plain words, and says where
//! the index came from ([`IndexSource`], written into the summary).
//! Not here: how a shard slices agents and addresses ([`Shard::slice`]).

use crate::plan::{IndexSource, Shard, UsageError, usage};
use crate::values::ShardSpec;

/// A variable that carries a task's number, and how it counts.
struct IndexVariable {
    /// The variable's name.
    name: &'static str,
    /// Who sets it.
    engine: &'static str,
    /// The first task's value: 0 for an index, 1 for a slot.
    first: u64,
    /// Said after a refusal: what usually puts a wrong value there.
    hint: &'static str,
}

/// The variables `--shard N` reads, in this order: ours first (it is only
/// ever set on purpose), then the engines' own.
const INDEX_VARIABLES: [IndexVariable; 3] = [
    IndexVariable {
        name: "AGENT_SIM_SHARD_SLOT",
        engine: "Docker Swarm task slot",
        first: 1,
        hint: " (Swarm expands {{.Task.Slot}} in a service's environment, not in its arguments or \
               in `docker run`; a replicated job gives one of its tasks the node ID: run the \
               service with --mode replicated --restart-condition none)",
    },
    IndexVariable {
        name: "JOB_COMPLETION_INDEX",
        engine: "Kubernetes Indexed Job",
        first: 0,
        hint: " (completions and --shard N should be the same number)",
    },
    IndexVariable {
        name: "NOMAD_ALLOC_INDEX",
        engine: "Nomad allocation",
        first: 0,
        hint: " (the group's count and --shard N should be the same number)",
    },
];

/// Resolves `--shard`: `I/N` as given (no variable is read), or `N` with
/// the index from the first of [`INDEX_VARIABLES`] that is set.
pub fn resolve(
    spec: Option<ShardSpec>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(Shard, Option<IndexSource>)>, UsageError> {
    let Some(spec) = spec else { return Ok(None) };
    let count = spec.count;
    if let Some(index) = spec.index {
        if index >= count {
            return usage(format!("--shard {index}/{count}: need 0 <= I < N"));
        }
        return Ok(Some((Shard { index, count }, None)));
    }
    let Some((var, text)) = INDEX_VARIABLES
        .iter()
        .find_map(|v| env(v.name).map(|text| (v, text)))
    else {
        return usage(format!(
            "--shard {spec}: no index: use I/N, or set AGENT_SIM_SHARD_SLOT to a slot from 1 \
             (Docker Swarm: {{{{.Task.Slot}}}}), or run where JOB_COMPLETION_INDEX (Kubernetes \
             Indexed Job) or NOMAD_ALLOC_INDEX (Nomad) is set"
        ));
    };
    let (first, last) = (var.first, var.first + count - 1);
    let what = if var.first == 0 { "an index" } else { "a slot" };
    let value = match text.trim().parse::<u64>() {
        Ok(v) => v,
        Err(_) => {
            return usage(format!(
                "{}={text:?} is not a number: {what} is a whole number from {first} to {last}{}",
                var.name, var.hint
            ));
        }
    };
    if !(first..=last).contains(&value) {
        return usage(format!(
            "{}={value} with --shard {count}: {what} is a whole number from {first} to {last}{}",
            var.name, var.hint
        ));
    }
    let shard = Shard {
        index: value - first,
        count,
    };
    let source = IndexSource {
        variable: var.name,
        engine: var.engine,
        value,
    };
    Ok(Some((shard, Some(source))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn spec(s: &str) -> Option<ShardSpec> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn an_explicit_index_reads_no_variable() {
        let env = with(&[("AGENT_SIM_SHARD_SLOT", "x"), ("JOB_COMPLETION_INDEX", "9")]);
        let (s, from) = resolve(spec("1/3"), &env).unwrap().unwrap();
        assert_eq!((s, from), (Shard { index: 1, count: 3 }, None));
        assert!(resolve(None, &env).unwrap().is_none());
    }

    #[test]
    fn each_engine_counts_its_own_way() {
        for (vars, index, shown) in [
            (
                &[("JOB_COMPLETION_INDEX", "2")][..],
                2,
                "JOB_COMPLETION_INDEX=2 (Kubernetes Indexed Job)",
            ),
            (
                &[("NOMAD_ALLOC_INDEX", " 0 ")][..],
                0,
                "NOMAD_ALLOC_INDEX=0 (Nomad allocation)",
            ),
            (
                &[("AGENT_SIM_SHARD_SLOT", "3")][..],
                2,
                "AGENT_SIM_SHARD_SLOT=3 (Docker Swarm task slot)",
            ),
            // Ours wins over an engine's: it is only set on purpose.
            (
                &[("NOMAD_ALLOC_INDEX", "0"), ("AGENT_SIM_SHARD_SLOT", "1")][..],
                0,
                "AGENT_SIM_SHARD_SLOT=1 (Docker Swarm task slot)",
            ),
        ] {
            let (s, from) = resolve(spec("3"), &with(vars)).unwrap().unwrap();
            assert_eq!(s, Shard { index, count: 3 }, "{vars:?}");
            assert_eq!(from.unwrap().to_string(), shown);
        }
    }

    #[test]
    fn values_that_are_not_a_task_number_are_refused_in_words() {
        for (vars, says) in [
            (
                &[][..],
                "--shard 3: no index: use I/N, or set AGENT_SIM_SHARD_SLOT to a slot from 1 \
                 (Docker Swarm: {{.Task.Slot}})",
            ),
            // What a replicated job gave one task in a real Swarm.
            (
                &[("AGENT_SIM_SHARD_SLOT", "4zwo2f42e2f36wly2id04228y")][..],
                "AGENT_SIM_SHARD_SLOT=\"4zwo2f42e2f36wly2id04228y\" is not a number: a slot is a \
                 whole number from 1 to 3 (Swarm expands",
            ),
            (
                &[("AGENT_SIM_SHARD_SLOT", "{{.Task.Slot}}")][..],
                "is not a number: a slot is a whole number from 1 to 3",
            ),
            (
                &[("AGENT_SIM_SHARD_SLOT", "0")][..],
                "AGENT_SIM_SHARD_SLOT=0 with --shard 3: a slot is a whole number from 1 to 3",
            ),
            (
                &[("AGENT_SIM_SHARD_SLOT", "4")][..],
                "AGENT_SIM_SHARD_SLOT=4 with --shard 3: a slot",
            ),
            (
                &[("JOB_COMPLETION_INDEX", "3")][..],
                "JOB_COMPLETION_INDEX=3 with --shard 3: an index is a whole number from 0 to 2 \
                 (completions and --shard N",
            ),
            (
                &[("NOMAD_ALLOC_INDEX", "-1")][..],
                "NOMAD_ALLOC_INDEX=\"-1\" is not a number: an index is a whole number from 0 to 2",
            ),
        ] {
            let e = resolve(spec("3"), &with(vars)).unwrap_err().0;
            assert!(e.starts_with(says) || e.contains(says), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
