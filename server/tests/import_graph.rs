//! No two files of `server/src` import each other, directly or through others: a circle of
//! imports means neither file can be read, tested or moved without the other, and it is how a
//! module's helpers end up living in whichever file needed them first. Each `use crate::…`,
//! `use super::…`, `use self::…` (and such paths written inline) is resolved to the file that
//! defines what it names, through re-exports. A module's files are its own: a `mod` declaration,
//! and a parent's use of what it declares (re-exporting it, mounting its routes), is ownership,
//! not an import, so a child may use its parent's items; siblings and cousins may not use each
//! other both ways.

#[path = "import_graph/scan.rs"]
mod scan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use scan::{Crate, ModulePath, NamedPath, scan};

/// Circles left in place, as pairs of files that import each other (each written once, either
/// order). Each needs an edit in a file another change owns; the test fails once a pair no
/// longer imports each other, so that the list only shrinks.
const ALLOWED: &[(&str, &str)] = &[];

/// An import: the file that writes it, the file it resolves to, and where it is written.
#[derive(Debug, Clone)]
struct Import {
    from: usize,
    to: usize,
    line: usize,
    path: String,
}

fn imports(krate: &Crate) -> Vec<Import> {
    let mut imports = Vec::new();
    for (from, file) in krate.files.iter().enumerate() {
        for path in &file.paths {
            let owned = |to: usize| {
                let (parent, child) = (&file.module, &krate.files[to].module);
                parent.0 == child.0 && child.1.starts_with(&parent.1)
            };
            if let Some(to) = krate.resolve(path).filter(|&to| to != from && !owned(to)) {
                imports.push(Import { from, to, line: path.line, path: path.segments.join("::") });
            }
        }
    }
    imports
}

/// One circle of each group of files that reach each other, as the imports that close it.
fn cycles(files: usize, imports: &[Import]) -> Vec<Vec<Import>> {
    let mut first: BTreeMap<(usize, usize), Import> = BTreeMap::new();
    for import in imports {
        first.entry((import.from, import.to)).or_insert_with(|| import.clone());
    }
    let mut found = Vec::new();
    let mut in_a_cycle = BTreeSet::new();
    for start in 0..files {
        if in_a_cycle.contains(&start) {
            continue;
        }
        // Breadth-first from `start` to itself: the shortest circle through it.
        let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
        let mut frontier = vec![start];
        let mut closed = None;
        'search: while !frontier.is_empty() {
            let mut next = Vec::new();
            for &at in &frontier {
                for &(from, to) in first.keys().filter(|(from, _)| *from == at) {
                    if to == start {
                        closed = Some(from);
                        break 'search;
                    }
                    if let std::collections::btree_map::Entry::Vacant(e) = parent.entry(to) {
                        e.insert(from);
                        next.push(to);
                    }
                }
            }
            frontier = next;
        }
        let Some(mut at) = closed else { continue };
        let mut cycle = vec![first[&(at, start)].clone()];
        while at != start {
            let from = parent[&at];
            cycle.push(first[&(from, at)].clone());
            at = from;
        }
        cycle.reverse();
        in_a_cycle.extend(cycle.iter().map(|i| i.from));
        found.push(cycle);
    }
    found
}

fn server_crate() -> Crate {
    Crate::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

fn allowed(krate: &Crate, import: &Import) -> bool {
    let (a, b) = (krate.files[import.from].path.as_str(), krate.files[import.to].path.as_str());
    ALLOWED.iter().any(|&(x, y)| (x, y) == (a, b) || (y, x) == (a, b))
}

#[test]
fn no_files_import_each_other_in_a_circle() {
    let krate = server_crate();
    assert!(krate.files.len() > 40, "the crate's files are found ({})", krate.files.len());
    let all = imports(&krate);
    assert!(all.len() > 100, "imports are found ({})", all.len());
    let kept: Vec<Import> = all.iter().filter(|i| !allowed(&krate, i)).cloned().collect();
    let report: Vec<String> = cycles(krate.files.len(), &kept)
        .iter()
        .map(|cycle| {
            let steps: Vec<String> = cycle
                .iter()
                .map(|i| {
                    format!("  {}:{} uses {} ({})", krate.files[i.from].path, i.line, i.path, krate.files[i.to].path)
                })
                .collect();
            steps.join("\n")
        })
        .collect();
    assert!(report.is_empty(), "files import each other in a circle:\n{}", report.join("\n\n"));
    for &(a, b) in ALLOWED {
        let file = |p: &str| krate.files.iter().position(|f| f.path == p);
        let (Some(a_), Some(b_)) = (file(a), file(b)) else { panic!("the allowed pair {a} / {b} names no file") };
        let uses = |x, y| all.iter().any(|i| i.from == x && i.to == y);
        assert!(uses(a_, b_) && uses(b_, a_), "{a} and {b} no longer import each other: take them off ALLOWED");
    }
}

fn module(path: &[&str]) -> ModulePath {
    ("lib.rs".to_owned(), path.iter().map(|s| s.to_string()).collect())
}

fn segments(paths: &[NamedPath]) -> Vec<String> {
    paths.iter().map(|p| p.segments.join("::")).collect()
}

#[test]
fn use_trees_and_inline_paths_are_read() {
    let text = r#"
        //! use crate::commented::Out;
        use std::sync::Arc;
        pub(crate) use super::{a::{self, B as C}, d::*, e};
        use child::Thing;
        fn f() { let s = "crate::in_a_string"; crate::engine::run(); x.self_call(); }
        #[cfg(test)]
        mod tests {
            use super::*;
        }
        mod child;
    "#;
    let scanned = scan(text, &module(&["api", "chat"]));
    assert_eq!(
        segments(&scanned.paths),
        [
            "std::sync::Arc",
            "super::a",
            "super::a::B",
            "super::d",
            "super::e",
            "child::Thing",
            "crate::engine::run",
            "super"
        ]
    );
    assert_eq!(scanned.paths[7].scope, module(&["api", "chat", "tests"]));
    let names: Vec<Option<&str>> = scanned.bindings.iter().map(|b| Some(b.name.as_str())).collect();
    assert_eq!(names, [Some("Arc"), Some("a"), Some("C"), Some("e"), Some("Thing")]);
    assert_eq!(scanned.declared, [module(&["api", "chat", "child"])]);
    assert_eq!(scanned.inline_modules, [module(&["api", "chat", "tests"])]);
}

#[test]
fn a_circle_is_found_and_printed_in_order() {
    let import = |from, to| Import { from, to, line: 1, path: String::new() };
    let found = cycles(4, &[import(0, 1), import(1, 2), import(2, 0), import(2, 3)]);
    assert_eq!(found.len(), 1);
    let order: Vec<(usize, usize)> = found[0].iter().map(|i| (i.from, i.to)).collect();
    assert_eq!(order, [(0, 1), (1, 2), (2, 0)]);
    assert!(cycles(3, &[import(0, 1), import(1, 2)]).is_empty());
}
