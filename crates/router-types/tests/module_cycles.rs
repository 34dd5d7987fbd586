//! Fails when any crate of the workspace has a module import cycle (the style guide's one-way rule).
//!
//! Read as text, nothing built: a crate's modules are its files under `src/` (`foo.rs` and
//! `foo/mod.rs` are module `foo`; `src/bin/` is left out). An edge A → B is a `crate::b…` path in
//! A's code outside comments and strings, or a `super::…` path resolved against A's place, a child
//! naming one of its ancestors through `super::` excepted. Code after A's first `#[cfg(test)]` is
//! test code and ignored. A cycle is a strongly connected set of more than one module.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).expect("file under src").with_extension("");
    let mut parts: Module = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The code with comments and string literals blanked, cut at the first `#[cfg(test)]`.
fn code_of(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            i = end;
            out.push(' ');
        } else if b[i..].starts_with(b"'\"'") || b[i..].starts_with(b"'\\''") {
            i += if b[i + 1] == b'\\' { 4 } else { 3 };
            out.push_str("' '");
        } else if b[i..].starts_with(b"r#\"") {
            let end = text[i + 3..].find("\"#").map_or(b.len(), |e| i + 3 + e + 2);
            i = end;
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            let c = text[i..].chars().next().expect("in bounds");
            out.push(c);
            i += c.len_utf8();
        }
    }
    match out.find("#[cfg(test)]") {
        Some(cut) => out[..cut].to_string(),
        None => out,
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every `word::a::b…` path in `code` as its segments after `word` (for `super`, the run of
/// `super::` is returned as the count of leading empty segments).
fn paths_after(code: &str, word: &str) -> Vec<(usize, Vec<String>)> {
    let b = code.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(pos) = code[at..].find(word) {
        let start = at + pos;
        at = start + word.len();
        if start > 0 && is_ident(b[start - 1]) {
            continue;
        }
        let mut ups = 0;
        let mut i = start + word.len();
        let mut segments = Vec::new();
        if word == "super" {
            ups = 1;
            while code[i..].starts_with("::super") {
                ups += 1;
                i += "::super".len();
            }
        }
        while code[i..].starts_with("::") {
            let s = i + 2;
            let mut e = s;
            while e < b.len() && is_ident(b[e]) {
                e += 1;
            }
            if e == s {
                break;
            }
            segments.push(code[s..e].to_string());
            i = e;
        }
        if ups > 0 || !segments.is_empty() {
            found.push((ups, segments));
        }
    }
    found
}

/// The longest prefix of `path` that is a module of the crate.
fn resolve(modules: &BTreeSet<Module>, path: &[String]) -> Option<Module> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| modules.contains(m))
}

fn edges_of(modules: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let names: BTreeSet<Module> = modules.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (m, text) in modules {
        let code = code_of(text);
        let mut to = BTreeSet::new();
        for (_, path) in paths_after(&code, "crate") {
            if let Some(t) = resolve(&names, &path)
                && &t != m
                && !t.is_empty()
            {
                to.insert(t);
            }
        }
        for (ups, rest) in paths_after(&code, "super") {
            let mut path: Module = m[..m.len().saturating_sub(ups)].to_vec();
            path.extend(rest);
            if let Some(t) = resolve(&names, &path)
                && &t != m
                && !t.is_empty()
                && !(t.len() < m.len() && m[..t.len()] == t[..])
            {
                to.insert(t);
            }
        }
        edges.insert(m.clone(), to);
    }
    edges
}

/// Strongly connected components of more than one module (Tarjan, iterative).
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    let nodes: Vec<&Module> = edges.keys().collect();
    let id: BTreeMap<&Module, usize> = nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let succ: Vec<Vec<usize>> =
        nodes.iter().map(|m| edges[*m].iter().filter_map(|t| id.get(t).copied()).collect()).collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut out, mut next) = (Vec::new(), Vec::new(), 0);
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut k)) = work.last_mut() {
            if *k == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = succ[v].get(*k) {
                *k += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    out.push(comp);
                }
            }
        }
    }
    out
}

fn crate_cycles(src: &Path) -> Vec<Vec<Module>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules = files.iter().map(|f| (module_of(src, f), fs::read_to_string(f).expect("readable source"))).collect();
    cycles(&edges_of(&modules))
}

#[test]
fn no_crate_of_the_workspace_has_a_module_import_cycle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crates/");
    let mut found = Vec::new();
    let mut read = 0;
    for entry in fs::read_dir(crates).expect("crates/ readable").flatten() {
        let src = entry.path().join("src");
        if src.is_dir() {
            read += 1;
            for comp in crate_cycles(&src) {
                let names: Vec<String> = comp.iter().map(|m| m.join("::")).collect();
                found.push(format!("{}: {}", entry.file_name().to_string_lossy(), names.join(", ")));
            }
        }
    }
    assert!(read >= 10, "read only {read} crates under {}", crates.display());
    assert!(found.is_empty(), "module import cycles:\n{}", found.join("\n"));
}

fn module(path: &str) -> Module {
    path.split("::").filter(|p| !p.is_empty()).map(String::from).collect()
}

fn graph(files: &[(&str, &str)]) -> BTreeMap<Module, String> {
    files.iter().map(|(m, text)| (module(m), text.to_string())).collect()
}

#[test]
fn the_check_sees_crate_and_super_cycles_and_ignores_tests_comments_strings_and_parents() {
    let found = |files: &[(&str, &str)]| cycles(&edges_of(&graph(files)));
    // crate:: both ways
    let two = found(&[("", "mod a; mod b;"), ("a", "use crate::b::X;"), ("b", "fn f() { crate::a::g() }")]);
    assert_eq!(two, vec![vec![module("a"), module("b")]]);
    // super:: between siblings, and through a chain of three
    let three = found(&[
        ("p", "mod x; mod y; mod z;"),
        ("p::x", "use super::y::T;"),
        ("p::y", "use super::super::p::z::U;"),
        ("p::z", "use super::x;"),
    ]);
    assert_eq!(three, vec![vec![module("p::x"), module("p::y"), module("p::z")]]);
    // a child naming its parent through super:: is no edge; test code, comments, strings are none
    let none = found(&[
        ("p", "mod c; use crate::p::c::Item;"),
        ("p::c", "use super::Thing; // crate::p::c\n const S: &str = \"crate::p\";"),
        ("q", "pub fn f() {}\n#[cfg(test)]\nmod tests { use crate::r::g; }"),
        ("r", "use crate::q::f; /* crate::q */"),
    ]);
    assert!(none.is_empty(), "{none:?}");
    // `my_crate::a` is not `crate::a`
    let ident = found(&[("a", "use my_crate::b;"), ("b", "use crate::a;")]);
    assert!(ident.is_empty(), "{ident:?}");
}
