//! Imports between the top-level modules of `crates/cli/src`,
//! `crates/metrics/src` and `crates/fleet/src` go one way: no module
//! imports (through `crate::…`, outside its tests) a module that imports it
//! back, directly or through others. Read from the sources, as a newcomer
//! would follow them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its tests and comments.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap_or("");
    body.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Top-level modules named after `crate::`, also inside `crate::{a, b::c}`.
fn imported(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Names at the first level of the braces.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.insert(ident(item.trim()));
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

/// Modules of a crate that are part of an import circle, with their edges.
fn circles(crate_dir: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crate_dir)
        .join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        edges.entry(top).or_default().extend(imported(&code(&text)));
    }
    let names: BTreeSet<String> = edges.keys().cloned().collect();
    for set in edges.values_mut() {
        set.retain(|m| names.contains(m));
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = edges[from].iter().cloned().collect();
        while let Some(x) = todo.pop() {
            if seen.insert(x.clone()) {
                todo.extend(edges[&x].iter().cloned());
            }
        }
        seen
    };
    names
        .iter()
        .filter(|m| reach(m).contains(*m))
        .map(|m| format!("{crate_dir}: {m} -> {:?}", edges[m]))
        .collect()
}

#[test]
fn imports_go_one_way() {
    let mut all = Vec::new();
    for c in ["cli", "metrics", "fleet"] {
        all.extend(circles(c));
    }
    assert!(all.is_empty(), "import circles:\n{}", all.join("\n"));
}

#[test]
fn the_reader_finds_grouped_and_plain_imports() {
    let found = imported("use crate::{a::X, b, c::{d, e}};\nlet x = crate::f::g();");
    let want: BTreeSet<String> = ["a", "b", "c", "f"].iter().map(|s| s.to_string()).collect();
    assert_eq!(found, want);
    assert!(code("use crate::a; // crate::b\n#[cfg(test)]\nuse crate::c;").contains("crate::a"));
    assert!(!code("use crate::a; // crate::b\n#[cfg(test)]\nuse crate::c;").contains("crate::c"));
}
