//! The guide stays whole: every relative link in README.md and docs/
//! resolves (files, and headings for `#anchors`), every flag that `--help`
//! shows (the run's and every subcommand's) is explained on some page, and
//! every limit a `// Bound:` comment of the code names is in
//! docs/hardening.md.

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

/// The `// Bound:` comments (`///`, `//!` too) of the code outside tests,
/// each with the comment lines that continue it, as `(file, text)`.
fn bound_comments() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in agent_sim_testkit::source::sources() {
        let mut open: Option<(&str, String)> = None;
        for line in f.non_test().lines() {
            let t = line.trim_start();
            let marker = ["//! ", "/// ", "// "]
                .into_iter()
                .find(|m| t.starts_with(m) || t == m.trim_end());
            match (marker, open.as_mut()) {
                (Some(m), _) if t[m.trim_end().len()..].trim_start().starts_with("Bound:") => {
                    if let Some((_, text)) = open.take() {
                        out.push((f.path.display().to_string(), text));
                    }
                    open = Some((m, t.to_string()));
                }
                (Some(m), Some((om, text))) if m == *om && t.len() > m.trim_end().len() => {
                    text.push(' ');
                    text.push_str(&t[m.len()..]);
                }
                _ => {
                    if let Some((_, text)) = open.take() {
                        out.push((f.path.display().to_string(), text));
                    }
                }
            }
        }
        if let Some((_, text)) = open {
            out.push((f.path.display().to_string(), text));
        }
    }
    out
}

/// The limits a comment names: constants in capitals with at least one
/// underscore (`MAX_SESSIONS`), with the module path written before them
/// (`codec::MAX_MESSAGE`).
fn named_limits(text: &str) -> Vec<String> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for word in text.split(|c: char| !(is_ident(c) || c == ':')) {
        let word = word.trim_matches(':');
        let name = word.rsplit("::").next().unwrap_or(word);
        let capitals = name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if capitals && name.contains('_') && name.starts_with(|c: char| c.is_ascii_uppercase()) {
            out.push(word.to_string());
        }
    }
    out
}

/// Whether `name` stands in `text` as itself (`MAX_STREAMS` is not found
/// in `MAX_STREAMS_PER_CONN`).
fn names(text: &str, name: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

#[test]
fn every_limit_a_bound_comment_names_is_in_hardening_md() {
    let doc = std::fs::read_to_string(root().join("docs/hardening.md")).unwrap();
    let comments = bound_comments();
    assert!(
        comments.len() > 20,
        "only {} `// Bound:` comments found: is the reader right?",
        comments.len()
    );
    let mut checked = 0;
    let mut missing = Vec::new();
    for (file, text) in &comments {
        for limit in named_limits(text) {
            checked += 1;
            if !names(&doc, &limit) {
                missing.push(format!("{file}: {limit} ({text})"));
            }
        }
    }
    assert!(
        checked > 15,
        "only {checked} limits named: is the reader right?"
    );
    assert!(
        missing.is_empty(),
        "limits named in `// Bound:` comments that docs/hardening.md does not list:\n{}",
        missing.join("\n")
    );
}

#[test]
fn bound_comments_are_read_whole_and_their_limits_found() {
    assert_eq!(
        named_limits(
            "// Bound: MAX_NODES nodes, MAX_PER_NODE each; codec::MAX_MESSAGE (TTL, HTTP)."
        ),
        ["MAX_NODES", "MAX_PER_NODE", "codec::MAX_MESSAGE"]
    );
    assert!(names("`MAX_STREAMS` (server)", "MAX_STREAMS"));
    assert!(!names("`MAX_STREAMS_PER_CONN`", "MAX_STREAMS"));
    let all = bound_comments();
    let (_, state) = all
        .iter()
        .find(|(f, t)| f.ends_with("server/src/consul/state.rs") && t.contains("MAX_NODES"))
        .expect("the catalog's bound");
    assert!(
        state.contains("MAX_TOPICS"),
        "a comment read with its second line: {state}"
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
