//! The orchestrator configs stay true to the flags. configs/kubernetes/,
//! configs/nomad/ and configs/swarm/ are read (with a reader of just the
//! YAML and HCL they are written in), and each engine's shard is run
//! through agent-sim's own command line and config resolution the way that
//! engine starts it: its templates filled in, its index variable set, the
//! environment it declares given to the flags that read it. Every engine
//! runs the same image (whose two Dockerfiles agree on entrypoint and
//! user), reads its index from a variable agent-sim reads and counts it
//! right (shard I of the N the job runs), writes its summary and hlog into
//! the folder its merge step reads, under a name of its own, and merges
//! with the same arguments.

use std::path::{Path, PathBuf};

use agent_sim::args::{Cli, Command, ReportCommand};
use agent_sim::plan::Shard;
use clap::{CommandFactory, Parser};

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A value without its quotes and trailing `# comment`.
fn bare(v: &str) -> String {
    let v = match v.find(" #") {
        Some(i) => &v[..i],
        None => v,
    };
    v.trim().trim_matches('"').to_string()
}

/// Every value of `key:` in a YAML text (`key: value`, `- key: value`, or
/// inside a flow map `{..., key: value}`).
fn yaml_values(text: &str, key: &str) -> Vec<String> {
    let pat = format!("{key}: ");
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let i = l.find(&pat)?;
            let before = l[..i].trim_start().trim_start_matches("- ");
            let flow = before.ends_with('{') || before.ends_with(", ");
            (before.is_empty() || flow).then(|| {
                let rest = &l[i + pat.len()..];
                let end = if flow { rest.find(['}', ',']) } else { None };
                bare(&rest[..end.unwrap_or(rest.len())])
            })
        })
        .collect()
}

/// The one value of `key:`.
fn yaml_value(text: &str, key: &str) -> String {
    let all = yaml_values(text, key);
    assert_eq!(all.len(), 1, "{key}: {all:?}");
    all[0].clone()
}

/// The lines nested under the line `key:` (deeper indented), trimmed.
fn yaml_block<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    let mut lines = text.lines();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let head = lines
        .by_ref()
        .find(|l| l.trim() == format!("{key}:"))
        .unwrap_or_else(|| panic!("no `{key}:`"));
    lines
        .filter(|l| !l.trim().is_empty())
        .take_while(|l| indent(l) > indent(head))
        .map(str::trim)
        .collect()
}

/// The items of the list under `key:`.
fn yaml_list(text: &str, key: &str) -> Vec<String> {
    yaml_block(text, key)
        .into_iter()
        .filter_map(|l| l.strip_prefix("- "))
        .map(bare)
        .collect()
}

/// The `K: V` entries of the map under `key:`.
fn yaml_map(text: &str, key: &str) -> Vec<(String, String)> {
    yaml_block(text, key)
        .into_iter()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), bare(v)))
        .collect()
}

/// The value of `key = value` in an HCL text.
fn hcl_value(text: &str, key: &str) -> String {
    let all: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key && !v.trim_start().starts_with('[')).then(|| bare(v))
        })
        .collect();
    assert_eq!(all.len(), 1, "{key}: {all:?}");
    all[0].clone()
}

/// The strings of the list `key = [ ... ]` (one line or several).
fn hcl_list(text: &str, key: &str) -> Vec<String> {
    let start = text
        .lines()
        .position(|l| l.split_once('=').is_some_and(|(k, _)| k.trim() == key))
        .unwrap_or_else(|| panic!("no `{key} =`"));
    let mut joined = String::new();
    for l in text.lines().skip(start) {
        joined.push_str(l);
        if l.contains(']') {
            break;
        }
    }
    let inner = &joined[joined.find('[').unwrap() + 1..joined.rfind(']').unwrap()];
    inner
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Docker's stack deploy fills `${VAR:-default}` from the shell; with none
/// set, the defaults.
fn compose_defaults(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find('}').unwrap() + i;
        let inner = &rest[i + 2..end];
        out.push_str(inner.split_once(":-").map_or("", |(_, d)| d));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// One engine's shards as its config declares them.
struct Shards {
    engine: &'static str,
    image: String,
    /// Tasks the job runs at once (completions, count, replicas).
    tasks: u64,
    args: Vec<String>,
    /// Environment the config declares (name, value) besides secrets.
    env: Vec<(String, String)>,
    /// Where the results volume is mounted.
    results: String,
    /// The variable the engine sets, how it is written in the config, and
    /// the value of task `i` (0-based).
    variable: &'static str,
    template: &'static str,
    value_of: fn(u64) -> u64,
}

fn kubernetes() -> Shards {
    let job = read("configs/kubernetes/agent-sim-job.yaml");
    let completions: u64 = yaml_value(&job, "completions").parse().unwrap();
    let parallelism: u64 = yaml_value(&job, "parallelism").parse().unwrap();
    assert_eq!(completions, parallelism, "every shard at once");
    assert_eq!(yaml_value(&job, "completionMode"), "Indexed");
    Shards {
        engine: "kubernetes",
        image: yaml_value(&job, "image"),
        tasks: completions,
        args: yaml_list(&job, "args"),
        env: yaml_values(&job, "name")
            .into_iter()
            .filter(|n| n.starts_with("AGENT_SIM_"))
            .map(|n| (n, "<secret>".into()))
            .collect(),
        results: yaml_value(&job, "mountPath"),
        variable: "JOB_COMPLETION_INDEX",
        template: "$(JOB_COMPLETION_INDEX)",
        value_of: |i| i,
    }
}

fn nomad() -> Shards {
    let job = read("configs/nomad/agent-sim.nomad.hcl");
    Shards {
        engine: "nomad",
        image: hcl_value(&job, "image"),
        tasks: hcl_value(&job, "count").parse().unwrap(),
        args: hcl_list(&job, "args"),
        env: Vec::new(),
        results: hcl_value(&job, "destination"),
        variable: "NOMAD_ALLOC_INDEX",
        template: "${NOMAD_ALLOC_INDEX}",
        value_of: |i| i,
    }
}

fn swarm() -> Shards {
    let stack = read("configs/swarm/agent-sim.yaml");
    assert_eq!(yaml_value(&stack, "mode"), "replicated", "slots from 1");
    assert_eq!(yaml_value(&stack, "condition"), "none", "never restarted");
    let env = yaml_map(&stack, "environment");
    assert!(
        env.contains(&("AGENT_SIM_SHARD_SLOT".into(), "{{.Task.Slot}}".into())),
        "{env:?}"
    );
    Shards {
        engine: "swarm",
        image: compose_defaults(&yaml_value(&stack, "image")),
        tasks: compose_defaults(&yaml_value(&stack, "replicas"))
            .parse()
            .unwrap(),
        args: yaml_list(&stack, "command")
            .iter()
            .map(|a| compose_defaults(a))
            .collect(),
        env: env
            .into_iter()
            .map(|(k, v)| (k, compose_defaults(&v)))
            .collect(),
        results: yaml_value(&stack, "target"),
        variable: "AGENT_SIM_SHARD_SLOT",
        template: "{{.Task.Slot}}",
        value_of: |i| i + 1,
    }
}

/// `--long=value` for the flag that reads `var` from the environment.
fn flag_reading(var: &str) -> Option<String> {
    Cli::command()
        .get_arguments()
        .find(|a| a.get_env() == Some(std::ffi::OsStr::new(var)))
        .and_then(|a| a.get_long())
        .map(|l| format!("--{l}"))
}

/// Resolves task `i` of `s` as its engine starts it.
fn task(s: &Shards, i: u64) -> agent_sim::plan::RunConfig {
    let value = (s.value_of)(i).to_string();
    let fill = |v: &str| v.replace(s.template, &value);
    let mut argv = vec!["agent-sim".to_string()];
    argv.extend(s.args.iter().map(|a| fill(a)));
    for (name, v) in &s.env {
        if name == s.variable {
            continue;
        }
        let flag =
            flag_reading(name).unwrap_or_else(|| panic!("{}: {name} is read by no flag", s.engine));
        // Secrets stay in the environment; the rest stands for its flag.
        if v != "<secret>" {
            argv.push(format!("{flag}={}", fill(v)));
        }
    }
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{}: {argv:?}: {e}", s.engine));
    assert!(cli.command.is_none(), "{}: a fleet run", s.engine);
    let var = s.variable;
    let env = move |k: &str| (k == var).then(|| value.clone());
    agent_sim::config::resolve(cli.run, &env)
        .unwrap_or_else(|e| panic!("{} task {i}: {argv:?}: {e}", s.engine))
}

#[test]
fn every_engines_shards_parse_and_count_their_index_right() {
    let engines = [kubernetes(), nomad(), swarm()];
    for s in &engines {
        assert!(s.tasks >= 2, "{}: {} tasks", s.engine, s.tasks);
        let mut summaries = Vec::new();
        for i in 0..s.tasks {
            let cfg = task(s, i);
            assert_eq!(
                cfg.shard,
                Some(Shard {
                    index: i,
                    count: s.tasks
                }),
                "{}: task {i} of {}: --shard and the task count must agree",
                s.engine,
                s.tasks
            );
            let from = cfg.shard_from.expect("the index came from the engine");
            assert_eq!(from.variable, s.variable, "{}", s.engine);
            let results = Path::new(&s.results);
            for (what, path) in [("summary", &cfg.summary), ("hlog", &cfg.hlog)] {
                let path = path
                    .as_ref()
                    .unwrap_or_else(|| panic!("{}: no --{what}", s.engine));
                assert_eq!(
                    path.parent(),
                    Some(results),
                    "{}: the {what} goes where the merge reads",
                    s.engine
                );
            }
            summaries.push(cfg.summary.unwrap());
        }
        summaries.sort();
        summaries.dedup();
        assert_eq!(
            summaries.len() as u64,
            s.tasks,
            "{}: a summary per shard",
            s.engine
        );
    }
    let images: Vec<&str> = engines.iter().map(|s| s.image.as_str()).collect();
    assert!(images.iter().all(|i| *i == images[0]), "{images:?}");
}

/// A merge step's arguments with its results folder written `<results>`.
fn merge_args(engine: &str, args: Vec<String>, results: &str) -> Vec<String> {
    let mut argv = vec!["agent-sim".to_string()];
    argv.extend(args);
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{engine}: {e}"));
    let Some(Command::Report(ReportCommand::Merge { files, summary, .. })) = cli.command else {
        panic!("{engine}: not `report merge`: {argv:?}");
    };
    assert_eq!(files, vec![PathBuf::from(results)], "{engine}");
    assert_eq!(
        summary.as_deref().and_then(Path::parent),
        Some(Path::new(results)),
        "{engine}: the merged summary beside the shards'"
    );
    argv.iter()
        .map(|a| a.replace(results, "<results>"))
        .collect()
}

#[test]
fn every_engine_merges_the_same_way_with_the_same_image() {
    let k8s = read("configs/kubernetes/agent-sim-merge.yaml");
    let nomad = read("configs/nomad/agent-sim-merge.nomad.hcl");
    let swarm = read("configs/swarm/agent-sim-merge.yaml");
    let steps = [
        (
            "kubernetes",
            yaml_value(&k8s, "image"),
            merge_args("kubernetes", yaml_list(&k8s, "args"), &kubernetes().results),
        ),
        (
            "nomad",
            hcl_value(&nomad, "image"),
            merge_args("nomad", hcl_list(&nomad, "args"), &self::nomad().results),
        ),
        (
            "swarm",
            compose_defaults(&yaml_value(&swarm, "image")),
            merge_args(
                "swarm",
                yaml_list(&swarm, "command"),
                &self::swarm().results,
            ),
        ),
    ];
    let shards_image = kubernetes().image;
    for (engine, image, args) in &steps {
        assert_eq!(image, &shards_image, "{engine}");
        assert_eq!(args, &steps[0].2, "{engine} merges unlike kubernetes");
    }
}

#[test]
fn both_images_start_agent_sim_as_the_same_non_root_user() {
    let lines = |path: &str, word: &str| -> Vec<String> {
        read(path)
            .lines()
            .filter(|l| l.starts_with(word))
            .map(str::to_string)
            .collect()
    };
    let entry = lines("Dockerfile", "ENTRYPOINT");
    assert_eq!(entry, ["ENTRYPOINT [\"/usr/local/bin/agent-sim\"]"]);
    assert_eq!(lines("Dockerfile.scratch", "ENTRYPOINT"), entry);
    // distroless's nonroot user is uid 65532; the scratch image names it.
    assert_eq!(lines("Dockerfile", "USER"), ["USER nonroot:nonroot"]);
    assert!(lines("Dockerfile", "FROM gcr.io/distroless/cc-debian12:nonroot").len() == 1);
    assert_eq!(lines("Dockerfile.scratch", "USER"), ["USER 65532:65532"]);
    assert_eq!(lines("Dockerfile.scratch", "FROM"), ["FROM scratch"]);
    let script = read("scripts/image.sh");
    assert!(
        script.contains("nonroot:x:65532:65532:"),
        "scripts/image.sh"
    );
}

#[test]
fn the_readers_read_what_the_configs_hold() {
    assert_eq!(bare("\"a b\"  # c"), "a b");
    assert_eq!(compose_defaults("--n=${N:-4}/${M}x"), "--n=4/x");
    let y = "a:\n  b: 1\n  list:\n    - x\n    - \"y\"\n  m: {n: v, k: w}\nc: 2\n";
    assert_eq!(yaml_list(y, "list"), ["x", "y"]);
    assert_eq!(yaml_value(y, "k"), "w");
    assert_eq!(yaml_value(y, "c"), "2");
    assert_eq!(yaml_map(y, "a")[0], ("b".into(), "1".into()));
    let h = "x = 3\nargs = [\n  \"--a=1\",\n  \"--b\",\n]\nimage = \"i\"\n";
    assert_eq!(hcl_list(h, "args"), ["--a=1", "--b"]);
    assert_eq!(hcl_value(h, "image"), "i");
    let one = "  args  = [\"report\", \"merge\", \"--assert=x == y\"]\n";
    assert_eq!(
        hcl_list(one, "args"),
        ["report", "merge", "--assert=x == y"]
    );
}
