//! The architecture's rules, checked on the source tree: dependencies point one way
//! (router-core pure <- router-cluster <- router-server; routerctl talks gRPC only;
//! enginesim never depends on router-core, so the router never grades itself), and no
//! source file imports a module that imports it back.

use router_tests::workspace;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `cargo tree` of one package's normal dependencies (all, or only its direct ones), one
/// crate name each.
fn deps_at(package: &str, direct: bool) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec![
        "tree",
        "-p",
        package,
        "-e",
        "normal",
        "--prefix",
        "none",
        "--offline",
    ];
    if direct {
        args.extend(["--depth", "1"]);
    }
    let out = std::process::Command::new(cargo)
        .current_dir(workspace())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn deps(package: &str) -> Vec<String> {
    deps_at(package, false)
}

fn assert_no_dep(package: &str, banned: &[&str]) {
    let d = deps(package);
    for b in banned {
        assert!(!d.iter().any(|x| x == b), "{package} depends on {b}: {d:?}");
    }
}

#[test]
fn dependencies_point_one_way() {
    let core = deps("router-core");
    assert!(core.iter().any(|x| x == "xxhash-rust"), "{core:?}");
    assert_no_dep(
        "router-core",
        &[
            "tokio",
            "hyper",
            "tonic",
            "sled",
            "openraft",
            "mio",
            "router-cluster",
        ],
    );
    assert_no_dep("router-cluster", &["router-server"]);
    // openraft stays inside router-cluster: the server uses its types only.
    let server = deps_at("router-server", true);
    assert!(server.iter().any(|d| d == "router-cluster"), "{server:?}");
    assert!(!server.iter().any(|d| d == "openraft"), "{server:?}");
    assert_no_dep(
        "routerctl",
        &[
            "router-core",
            "router-cluster",
            "router-server",
            "openraft",
            "sled",
        ],
    );
    assert_no_dep(
        "engine-sim",
        &["router-core", "router-cluster", "router-server"],
    );
}

/// One source file and the module path it defines (`a::b` for `src/a/b.rs` or
/// `src/a/b/mod.rs`; empty for `lib.rs`/`main.rs`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_owned());
    }
    parts
}

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

/// Paths like `crate::a::b::C` or `super::x::Y` in a file's code (tests at the end of a
/// file, after `#[cfg(test)]`, and comments left out), with grouped imports expanded
/// one level (`use super::{a::X, b}` gives `super::a::X` and `super::b`).
fn paths_in(code: &str) -> Vec<String> {
    let code = code.split("\n#[cfg(test)]").next().unwrap_or("");
    let mut out = Vec::new();
    for line in code.lines() {
        let l = line.trim_start();
        if l.starts_with("//") {
            continue;
        }
        // `use child::...` (relative to this module), as `self::child::...`.
        let l = match ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|u| l.strip_prefix(u))
        {
            Some(rest)
                if !rest.starts_with("crate::")
                    && !rest.starts_with("super::")
                    && !rest.starts_with("self::")
                    && !rest.starts_with("std::") =>
            {
                out.push(
                    rest.trim_end_matches(';')
                        .split(['{', ' '])
                        .next()
                        .unwrap_or("")
                        .trim_end_matches("::")
                        .to_owned(),
                );
                continue;
            }
            _ => l,
        };
        let b = l.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let rest = &l[i..];
            let starts = (rest.starts_with("crate::")
                || rest.starts_with("super::")
                || rest.starts_with("self::"))
                && (i == 0
                    || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':'));
            if !starts {
                i += 1;
                continue;
            }
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            let head = rest[..end].trim_end_matches(':').to_owned();
            if rest[end..].starts_with('{') && rest[..end].ends_with("::") {
                let close = rest.find('}').unwrap_or(rest.len());
                for item in rest[end + 1..close].split(',') {
                    let item = item.trim().split(" as ").next().unwrap_or("").trim();
                    if !item.is_empty() {
                        out.push(format!("{head}::{item}"));
                    }
                }
                i += close.max(1);
            } else {
                out.push(head);
                i += end.max(1);
            }
        }
    }
    out
}

/// File-level import graph of one crate: an edge from a file to the file that defines the
/// longest module prefix of each path it uses.
fn import_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graph = BTreeMap::new();
    for f in &files {
        let me = module_of(src, f);
        let code = std::fs::read_to_string(f).unwrap();
        let mut edges = BTreeSet::new();
        for p in paths_in(&code) {
            let mut segs: Vec<&str> = p.split("::").collect();
            let mut target: Vec<String> = match segs[0] {
                "crate" => Vec::new(),
                "self" => {
                    segs[0] = "crate";
                    me.clone()
                }
                s if s != "super" => {
                    // `use child::X` in a file that declares `mod child;`.
                    let mut child = me.clone();
                    child.push(s.to_owned());
                    if !modules.contains(&child) {
                        continue;
                    }
                    segs.insert(0, "crate");
                    me.clone()
                }
                _ => {
                    // `super` of a mod.rs is its parent; of a plain file, its directory.
                    let mut base = me.clone();
                    while segs.first() == Some(&"super") {
                        segs.remove(0);
                        base.pop();
                    }
                    segs.insert(0, "crate");
                    base
                }
            };
            for s in &segs[1..] {
                target.push((*s).to_owned());
            }
            while !target.is_empty() && !modules.contains(&target) {
                target.pop();
            }
            if target != me {
                edges.insert(target);
            }
        }
        graph.insert(me, edges);
    }
    graph
}

/// A cycle in `g`, if any, as the list of modules on it.
fn find_cycle(g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<String>> {
    fn visit(
        n: &Vec<String>,
        g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m) {
                Some(1) => {
                    let at = stack.iter().position(|x| x == m).unwrap_or(0);
                    let mut c: Vec<String> = stack[at..].iter().map(|x| x.join("::")).collect();
                    c.push(m.join("::"));
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if !state.contains_key(n) {
            if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_source_file_imports_a_module_that_imports_it_back() {
    for krate in ["router-core", "router-cluster", "router-server"] {
        let src = workspace().join("crates").join(krate).join("src");
        let g = import_graph(&src);
        assert!(g.len() > 3, "{krate}: read only {} files", g.len());
        if let Some(c) = find_cycle(&g) {
            panic!("{krate}: import cycle {}", c.join(" -> "));
        }
    }
}

#[test]
fn the_cycle_check_finds_cycles() {
    // The checker itself: a child that uses an item of its parent module's file, while the
    // parent re-exports the child, is a cycle; siblings through `super::` are not.
    let dir = std::env::temp_dir().join(format!("rtr-cycles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\npub use a::B;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "mod b;\nmod c;\npub use b::B;\n").unwrap();
    std::fs::write(dir.join("a/b.rs"), "use super::c::C;\npub struct B;\n").unwrap();
    std::fs::write(dir.join("a/c.rs"), "pub struct C;\n").unwrap();
    assert_eq!(find_cycle(&import_graph(&dir)), None);
    std::fs::write(
        dir.join("a/mod.rs"),
        "mod b;\nmod c;\npub use b::B;\npub struct Shared;\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("a/c.rs"),
        "use super::Shared;\npub struct C;\n#[cfg(test)]\nmod t { use crate::a::b::B; }\n",
    )
    .unwrap();
    std::fs::write(dir.join("a/b.rs"), "use super::c::C;\npub struct B;\n").unwrap();
    // a/mod.rs -> a/b.rs -> a/c.rs -> a/mod.rs
    let c = find_cycle(&import_graph(&dir)).expect("cycle not found");
    assert!(c.contains(&"a".to_owned()), "{c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
