//! Imports go one way in every crate (`crates/*/src`, generated code
//! aside): among the modules of one parent, no module imports (through a
//! `crate::`, `super::` or `self::` path, in a `use` or in the code, outside
//! its tests) a sibling that imports it back, directly or through others.
//! A parent and its own children are the crate's map, not a circle. And no
//! glob import (`use x::*;`) outside tests, but for the preludes below:
//! a reader should see where each name comes from. Read from the sources,
//! as a newcomer would follow them.

use std::collections::{BTreeMap, BTreeSet};

use agent_sim_testkit::source::{SourceFile, sources};

/// Glob imports allowed outside tests, each a prelude meant to be used so.
const PRELUDES: &[(&str, &str)] = &[(
    "proptest::prelude::*",
    "proptest's strategies and macros are written through its prelude",
)];

/// Globs and circles that a branch not merged yet still has to mend (none
/// since issue 26's branches were merged). Each entry must still be found
/// (the test fails on one that is gone, so the list only shrinks).
const PENDING: &[&str] = &[];

/// The code of a file without its tests and comments (literals blanked).
fn code(text: &str) -> String {
    agent_sim_testkit::source::code(text)
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Reads one path (with `{…}` groups) from the start of `s`: every full
/// path it names, as segments (`*` for a glob), and how much it read.
fn use_tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    let mut i = 0;
    loop {
        let rest = &s[i..];
        let skip = rest.len() - rest.trim_start().len();
        i += skip;
        let rest = &s[i..];
        if let Some(group) = rest.strip_prefix('{') {
            i += 1;
            let mut j = 0;
            loop {
                let g = &group[j..];
                let t = g.trim_start();
                j += g.len() - t.len();
                if t.starts_with('}') || t.is_empty() {
                    j += 1;
                    break;
                }
                j += use_tree(&group[j..], &path, out);
                let g = &group[j..];
                let t = g.trim_start();
                j += g.len() - t.len();
                if t.starts_with(',') {
                    j += 1;
                }
            }
            return i + j;
        }
        let seg = if rest.starts_with('*') {
            "*"
        } else {
            ident(rest)
        };
        if seg.is_empty() {
            out.push(path);
            return i;
        }
        i += seg.len();
        if seg != "self" || path.is_empty() {
            path.push(seg.to_string());
        }
        match s[i..].strip_prefix("::") {
            Some(_) => i += 2,
            None => {
                out.push(path);
                return i;
            }
        }
    }
}

/// Every path in `code` that starts at `crate::`, `super::` or `self::`,
/// groups expanded (`crate::{a, b::c}` is `crate::a` and `crate::b::c`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = ["crate::", "super::", "self::"]
        .iter()
        .filter_map(|k| code[from..].find(k).map(|p| from + p))
        .min()
    {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
            from = at + 1;
            continue;
        }
        from = at + use_tree(&code[at..], &[], &mut out).max(1);
    }
    out
}

/// Top-level modules named after `crate::`, also inside `crate::{a, b::c}`.
fn imported(code: &str) -> BTreeSet<String> {
    paths(code)
        .into_iter()
        .filter(|p| p.first().is_some_and(|s| s == "crate") && p.len() > 1)
        .map(|p| p[1].clone())
        .collect()
}

/// The glob imports of a file's code (`use a::b::*;`, `use a::{b::*}`).
fn globs(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("use ") {
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let mut found = Vec::new();
        use_tree(&code[at + 4..], &[], &mut found);
        out.extend(
            found
                .into_iter()
                .filter(|p| p.last().is_some_and(|s| s == "*"))
                .map(|p| p.join("::")),
        );
    }
    out
}

/// The module a path names from module `m` (the longest prefix that is a
/// module of the crate), or `None` for another crate's path.
fn target(m: &[String], path: &[String], mods: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut base = m.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("super") | Some("self") => {
            while let Some(s) = rest.first().filter(|s| *s == "super" || *s == "self") {
                if s == "super" {
                    base.pop();
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    (0..=base.len())
        .rev()
        .map(|k| base[..k].to_vec())
        .find(|p| mods.contains(p))
}

/// Edges between sibling modules: for each parent, which of its children
/// import which (an import from deep inside a child counts for the child).
type Siblings = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;

/// The circles of one crate's files, as `crate: parent: a, b`.
fn circles(krate: &str, files: &[&SourceFile]) -> Vec<String> {
    let mods: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let mut siblings: Siblings = BTreeMap::new();
    for f in files {
        for p in paths(&code(&f.text)) {
            let Some(t) = target(&f.module, &p, &mods) else {
                continue;
            };
            let common = f.module.iter().zip(&t).take_while(|(a, b)| a == b).count();
            if common == f.module.len() || common == t.len() {
                continue; // itself, its parent or its child: the map
            }
            siblings
                .entry(t[..common].to_vec())
                .or_default()
                .entry(f.module[common].clone())
                .or_default()
                .insert(t[common].clone());
        }
    }
    let mut out = Vec::new();
    for (parent, edges) in &siblings {
        let reach = |from: &str| {
            let mut seen = BTreeSet::new();
            let mut todo: Vec<&String> = edges.get(from).into_iter().flatten().collect();
            while let Some(x) = todo.pop() {
                if seen.insert(x.clone()) {
                    todo.extend(edges.get(x).into_iter().flatten());
                }
            }
            seen
        };
        let looped: Vec<&String> = edges.keys().filter(|m| reach(m).contains(*m)).collect();
        let mut done = BTreeSet::new();
        for m in looped {
            if done.contains(m) {
                continue;
            }
            let ring: BTreeSet<String> = reach(m)
                .into_iter()
                .filter(|x| reach(x).contains(m))
                .collect();
            done.extend(ring.iter().cloned());
            let parent = if parent.is_empty() {
                "(root)".to_string()
            } else {
                parent.join("::")
            };
            let ring: Vec<String> = ring.into_iter().collect();
            out.push(format!("circle: {krate}: {parent}: {}", ring.join(", ")));
        }
    }
    out
}

/// Everything the rules refuse in the workspace, one line each.
fn problems() -> Vec<String> {
    let all = sources();
    let mut out = Vec::new();
    let krates: BTreeSet<&str> = all.iter().map(|f| f.krate.as_str()).collect();
    for krate in krates {
        // The binary's `main.rs` uses the library by its name, like any user.
        let files: Vec<&SourceFile> = all
            .iter()
            .filter(|f| f.krate == krate && !(krate == "cli" && f.is_main()))
            .filter(|f| !f.test_only)
            .collect();
        out.extend(circles(krate, &files));
    }
    for f in all.iter().filter(|f| !f.test_only) {
        for g in globs(&code(&f.text)) {
            if !PRELUDES.iter().any(|(p, _)| *p == g) {
                out.push(format!("glob: {}: {g}", f.path.display()));
            }
        }
    }
    out
}

#[test]
fn imports_go_one_way_and_name_what_they_take() {
    let found = problems();
    let refused: Vec<&String> = found
        .iter()
        .filter(|p| !PENDING.contains(&p.as_str()))
        .collect();
    assert!(
        refused.is_empty(),
        "import circles and glob imports:\n{}",
        refused
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let gone: Vec<&&str> = PENDING
        .iter()
        .filter(|p| !found.iter().any(|f| f == *p))
        .collect();
    assert!(gone.is_empty(), "gone now, take them off PENDING: {gone:?}");
}

#[test]
fn the_reader_finds_grouped_and_plain_imports() {
    let found = imported("use crate::{a::X, b, c::{d, e}};\nlet x = crate::f::g();");
    let want: BTreeSet<String> = ["a", "b", "c", "f"].iter().map(|s| s.to_string()).collect();
    assert_eq!(found, want);
    assert!(code("use crate::a; // crate::b\n#[cfg(test)]\nuse crate::c;").contains("crate::a"));
    assert!(!code("use crate::a; // crate::b\n#[cfg(test)]\nuse crate::c;").contains("crate::c"));
}

#[test]
fn the_reader_follows_super_self_groups_and_globs() {
    let found = paths("use super::{a::{self, B}, c::*};\nself::d::e(); use super::super::f;");
    let want: Vec<Vec<String>> = [
        "super::a",
        "super::a::B",
        "super::c::*",
        "self::d::e",
        "super::super::f",
    ]
    .iter()
    .map(|p| p.split("::").map(str::to_string).collect())
    .collect();
    assert_eq!(found, want);
    assert_eq!(
        globs("use super::*;\nuse std::{io, fmt::*};\nfn f() { use names::*; }"),
        ["super::*", "std::fmt::*", "names::*"]
    );
    let mods: BTreeSet<Vec<String>> = [vec![], vec!["a".into()], vec!["a".into(), "b".into()]]
        .into_iter()
        .collect();
    let from_b = ["a".to_string(), "b".to_string()];
    let super_x: Vec<String> = vec!["super".into(), "X".into()];
    assert_eq!(
        target(&from_b, &super_x, &mods),
        Some(vec!["a".to_string()])
    );
    assert_eq!(target(&from_b, &["tokio".to_string()], &mods), None);
}
