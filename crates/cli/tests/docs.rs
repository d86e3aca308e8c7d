//! The guide stays whole: every relative link in README.md and docs/
//! resolves (files, and headings for `#anchors`), and every flag that
//! `--help` shows (the run's and every subcommand's) is explained on some
//! page.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every page under docs/.
fn pages() -> Vec<(PathBuf, String)> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// Text outside fenced code blocks (links in code are not links).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, spaces to hyphens, other
/// punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// `(target)` of every `[text](target)` in the prose.
fn links(text: &str) -> Vec<String> {
    let text = prose(text);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in pages() {
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match link.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap().join(file)
            };
            checked += 1;
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", path.display()));
                continue;
            }
            if let Some(a) = anchor
                && target.extension().is_some_and(|x| x == "md")
            {
                let have = anchors(&std::fs::read_to_string(&target).unwrap());
                if !have.contains(a) {
                    broken.push(format!("{}: {link} (no heading #{a})", path.display()));
                }
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `--flag` of every argument of `cmd` and its subcommands.
fn long_flags(cmd: &clap::Command, out: &mut BTreeSet<String>) {
    for a in cmd.get_arguments() {
        if let Some(l) = a.get_long()
            && !a.is_hide_set()
            && !matches!(l, "help" | "version")
        {
            out.insert(format!("--{l}"));
        }
    }
    for s in cmd.get_subcommands() {
        long_flags(s, out);
    }
}

/// Whether `flag` stands in `text` as itself (`--probe` is not found in
/// `--probe-every`).
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        let next = text[i + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn every_flag_in_help_is_explained_in_the_guide() {
    let mut flags = BTreeSet::new();
    long_flags(&agent_sim::help::command(), &mut flags);
    assert!(
        flags.len() > 80,
        "{} flags: is the walk right?",
        flags.len()
    );
    let all: String = pages().into_iter().map(|(_, t)| t).collect();
    let missing: Vec<&String> = flags.iter().filter(|f| !mentions(&all, f)).collect();
    assert!(
        missing.is_empty(),
        "flags no page of README.md or docs/ mentions: {missing:?}"
    );
}

#[test]
fn the_front_page_reads_in_two_minutes() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 160,
        "README.md has {lines} lines; the guide lives in docs/"
    );
    assert!(readme.contains("cargo test --workspace"));
}

#[test]
fn help_names_the_summary_schema_written() {
    let help = agent_sim::help::command().render_long_help().to_string();
    assert!(
        help.contains(agent_sim_metrics::summary::SCHEMA_V2),
        "--help must name the schema the summary has"
    );
}

#[test]
fn slugs_follow_githubs_rule() {
    assert_eq!(
        slug(" Will it fit? `agent-sim doctor`"),
        "will-it-fit-agent-sim-doctor"
    );
    assert_eq!(slug("Sensu Go 6.12.0"), "sensu-go-6120");
    assert!(mentions("use --probe catalog", "--probe"));
    assert!(!mentions("use --probe-every 5s", "--probe"));
}
