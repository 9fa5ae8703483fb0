//! The layers of `ARCHITECTURE.md`, held by a test. It parses every file of `src/` and of each
//! crate under `crates/` (with `syn`) and fails when
//!
//! - a `crate::…` path (in a `use`, a type, an expression or a macro) points from a module of a
//!   lower layer of the proxy to one of a higher layer;
//! - modules import each other in a circle: at every level of the module tree, the children of
//!   one module (each with everything under it) must import one another without a circle;
//! - a module names what only a higher layer may: `ValidConfig` (the whole configuration) only
//!   in the composition root (`app`), an HTTP `HeaderMap` in no leaf and no domain module (the
//!   context layer gets a tenant and a session hint, not headers).
//!
//! An arrow that still runs the wrong way is listed in [`EXCEPTIONS`] with its reason; the list
//! is meant to stay short and to shrink.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The proxy's top-level modules by layer, from the bottom (ARCHITECTURE.md, "Layers"). A module
/// may import its own layer and those below it, never one above.
const LAYERS: &[(&str, u8)] = &[
    // 0: pure leaves. The crates re-exported from lib.rs are leaves too.
    ("wire", 0),
    ("ids", 0),
    ("telemetry", 0),
    ("glob", 0),
    ("service", 0),
    ("tokens", 0),
    ("pricing", 0),
    ("contract", 0),
    ("corpus", 0),
    ("mock", 0),
    ("traffic", 0),
    // 1: adapters.
    ("store", 1),
    ("upstream", 1),
    ("http", 1),
    // 2: the domain.
    ("context", 2),
    ("auth", 2),
    ("proxy_tools", 2),
    ("summarizer", 2),
    ("recorder", 2),
    ("sessions", 2),
    // 3: routes and the server.
    ("routes", 3),
    ("server", 3),
    // 4: the composition root.
    ("app", 4),
];

/// Arrows that still run the wrong way, or names a module should not use yet: (the module that
/// imports or names, what it imports or names, why). A module path matches itself and every
/// module under it; the target is a module path or one of the names of [`NAMED_ONLY_IN`].
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// Names only some layers may use: (the name, the lowest layer that may, the highest layer that
/// may).
const NAMED_ONLY_IN: &[(&str, u8, u8)] = &[
    // The whole configuration: the handlers get the parts they need (`routes::shared`).
    ("ValidConfig", 4, 4),
    // Adapters (upstream requests, HTTP plumbing) and routes handle headers; the leaves and the
    // domain get what the headers said, already read.
    ("HeaderMap", 1, 1),
    ("HeaderMap", 3, 4),
];

/// One parsed module tree: every module (by path from the crate root) and the modules each one
/// refers to.
#[derive(Default)]
struct Tree {
    /// Every module, file or inline, by its path (`[]` is the crate root).
    modules: BTreeSet<Vec<String>>,
    /// (from, to) for every path that names something in `to` from inside `from`.
    edges: BTreeSet<(Vec<String>, Vec<String>)>,
    /// (module, name) for every name of [`NAMED_ONLY_IN`] a module uses.
    names: BTreeSet<(Vec<String>, String)>,
}

/// The module path of a source file under `root` (`lib.rs` is the root, `a/mod.rs` is `a`).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Reads every file of the library under `root` (its `lib.rs` and what lies beside it; a
/// binary's `main.rs` is a crate of its own and imports the library by name).
fn parse_tree(root: &Path) -> Tree {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.retain(|f| f != &root.join("main.rs") && !f.starts_with(root.join("bin")));
    let mut parsed = Vec::new();
    let mut tree = Tree::default();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", file.display()));
        let module = module_of(root, &file);
        collect_inline_modules(&module, &ast.items, &mut tree.modules);
        tree.modules.insert(module.clone());
        parsed.push((module, ast));
    }
    for (module, ast) in &parsed {
        let mut visitor = Refs {
            tree_modules: &tree.modules,
            current: module.clone(),
            edges: BTreeSet::new(),
            names: BTreeSet::new(),
        };
        visitor.visit_file(ast);
        tree.edges.extend(visitor.edges);
        tree.names.extend(visitor.names);
    }
    tree
}

fn collect_inline_modules(module: &[String], items: &[syn::Item], out: &mut BTreeSet<Vec<String>>) {
    for item in items {
        if let syn::Item::Mod(m) = item {
            let mut path = module.to_vec();
            path.push(m.ident.to_string());
            if let Some((_, inner)) = &m.content {
                collect_inline_modules(&path, inner, out);
            }
            out.insert(path);
        }
    }
}

/// Finds what one file refers to.
struct Refs<'a> {
    tree_modules: &'a BTreeSet<Vec<String>>,
    current: Vec<String>,
    edges: BTreeSet<(Vec<String>, Vec<String>)>,
    names: BTreeSet<(Vec<String>, String)>,
}

impl Refs<'_> {
    /// Records a path given as its segments, as written in `self.current`.
    fn path(&mut self, segments: &[String]) {
        for segment in segments {
            if NAMED_ONLY_IN.iter().any(|(name, ..)| name == segment) {
                self.names.insert((self.current.clone(), segment.clone()));
            }
        }
        let Some(first) = segments.first() else {
            return;
        };
        let mut absolute = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.current.clone(),
            "super" => {
                let mut base = self.current.clone();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                return self.resolved(base);
            }
            // A child module of this one, named without `self::`.
            _ => {
                let mut child = self.current.clone();
                child.push(first.clone());
                if !self.tree_modules.contains(&child) {
                    return;
                }
                self.current.clone()
            }
        };
        let skip = usize::from(matches!(first.as_str(), "crate" | "self"));
        absolute.extend(segments[skip..].iter().cloned());
        self.resolved(absolute);
    }

    /// Records an edge to the longest module prefix of an absolute path.
    fn resolved(&mut self, mut absolute: Vec<String>) {
        while !absolute.is_empty() && !self.tree_modules.contains(&absolute) {
            absolute.pop();
        }
        if !absolute.is_empty() && absolute != self.current {
            self.edges.insert((self.current.clone(), absolute));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.path(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.path(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.path(&prefix.clone()),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths inside a macro's tokens (`tracing::warn!(… crate::x::y …)`): `crate`, `self` or
    /// `super` followed by `::`-separated names.
    fn tokens(&mut self, tokens: TokenStream) {
        let flat: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < flat.len() {
            match &flat[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id)
                    if matches!(id.to_string().as_str(), "crate" | "self" | "super") =>
                {
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    loop {
                        let colons = matches!((&flat.get(j), &flat.get(j + 1)),
                            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':');
                        match (colons, flat.get(j + 2)) {
                            (true, Some(TokenTree::Ident(next))) => {
                                segments.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if segments.len() > 1 {
                        self.path(&segments);
                    }
                    i = j;
                    continue;
                }
                TokenTree::Ident(id) => {
                    let name = id.to_string();
                    if NAMED_ONLY_IN.iter().any(|(n, ..)| *n == name) {
                        self.names.insert((self.current.clone(), name));
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.current.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.current.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.path(&segments);
        syn::visit::visit_path(self, p);
    }

    /// `pub(crate)`, `pub(super)`: a visibility, not a reference.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }
}

fn join(path: &[String]) -> String {
    if path.is_empty() {
        "crate".into()
    } else {
        path.join("::")
    }
}

/// Whether `module` is `prefix` or lies under it (`a::b` is under `a`; `ab` is not).
fn under(module: &str, prefix: &str) -> bool {
    module == prefix || module.starts_with(&format!("{prefix}::"))
}

fn excepted(from: &str, to: &str) -> bool {
    EXCEPTIONS
        .iter()
        .any(|(f, t, _)| under(from, f) && (under(to, t) || to == *t))
}

fn layer_of(module: &[String]) -> Option<u8> {
    let top = module.first()?;
    LAYERS.iter().find(|(name, _)| name == top).map(|(_, l)| *l)
}

/// Every wrong-way arrow and misplaced name in the proxy's `src/`, as readable lines.
fn layer_violations(tree: &Tree) -> Vec<String> {
    let mut wrong = Vec::new();
    for module in &tree.modules {
        if module.len() == 1 && layer_of(module).is_none() {
            wrong.push(format!("{} has no layer in tests/layers.rs", join(module)));
        }
    }
    for (from, to) in &tree.edges {
        let (Some(low), Some(high)) = (layer_of(from), layer_of(to)) else {
            continue;
        };
        if low < high && !excepted(&join(from), &join(to)) {
            wrong.push(format!(
                "{} (layer {low}) imports {} (layer {high})",
                join(from),
                join(to)
            ));
        }
    }
    for (module, name) in &tree.names {
        let Some(layer) = layer_of(module) else {
            continue;
        };
        let allowed = NAMED_ONLY_IN
            .iter()
            .any(|(n, lo, hi)| n == name && (*lo..=*hi).contains(&layer));
        if !allowed && !excepted(&join(module), name) {
            wrong.push(format!("{} (layer {layer}) names {name}", join(module)));
        }
    }
    wrong
}

/// Every import circle in `tree`: at each module, among its children, each child standing for
/// everything under it.
fn circles(tree: &Tree) -> Vec<String> {
    let mut found = Vec::new();
    for parent in &tree.modules {
        let child_of = |module: &Vec<String>| -> Option<String> {
            (module.len() > parent.len() && module.starts_with(parent))
                .then(|| module[parent.len()].clone())
        };
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in &tree.edges {
            if excepted(&join(from), &join(to)) {
                continue;
            }
            if let (Some(a), Some(b)) = (child_of(from), child_of(to)) {
                if a != b {
                    graph.entry(a).or_default().insert(b);
                }
            }
        }
        for component in strongly_connected(&graph) {
            let names: Vec<String> = component
                .iter()
                .map(|c| {
                    let mut path = parent.clone();
                    path.push(c.clone());
                    join(&path)
                })
                .collect();
            found.push(names.join(" ⇄ "));
        }
    }
    found
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let lw = s.low[w.as_str()];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w.as_str()) {
                let iw = s.index[w.as_str()];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_import_points_up_a_layer() {
    let tree = parse_tree(&repo().join("src"));
    let wrong = layer_violations(&tree);
    assert!(
        wrong.is_empty(),
        "imports against the layers of ARCHITECTURE.md (fix the import, or list it with its \
         reason in EXCEPTIONS):\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn no_import_circle_in_the_proxy_or_any_crate() {
    let mut roots = vec![repo().join("src")];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(repo().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .filter(|p| p.join("lib.rs").exists())
        .collect();
    crates.sort();
    roots.extend(crates);
    let mut found = Vec::new();
    for root in &roots {
        for circle in circles(&parse_tree(root)) {
            found.push(format!("{}: {circle}", root.display()));
        }
    }
    assert!(
        found.is_empty(),
        "import circles:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn every_exception_is_still_needed() {
    let tree = parse_tree(&repo().join("src"));
    for (from, to, why) in EXCEPTIONS {
        assert!(
            !why.is_empty(),
            "the exception {from} → {to} gives no reason"
        );
        let used = tree
            .edges
            .iter()
            .any(|(f, t)| under(&join(f), from) && under(&join(t), to))
            || tree
                .names
                .iter()
                .any(|(m, name)| under(&join(m), from) && name == to);
        assert!(
            used,
            "the exception {from} → {to} is no longer needed: remove it"
        );
    }
}

/// The check itself: a wrong-way import, a circle and a misplaced name are each found.
#[test]
fn the_check_finds_what_it_forbids() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(
        src.join("lib.rs"),
        "pub mod wire;\npub mod app;\npub mod store;\n",
    )
    .unwrap();
    std::fs::write(src.join("app.rs"), "pub struct ValidConfig;\n").unwrap();
    std::fs::create_dir(src.join("wire")).unwrap();
    std::fs::write(
        src.join("wire/mod.rs"),
        "pub mod a;\npub mod b;\nfn f() { let _ = crate::app::ValidConfig; }\n",
    )
    .unwrap();
    std::fs::write(src.join("wire/a.rs"), "use super::b::B;\npub struct A;\n").unwrap();
    std::fs::write(src.join("wire/b.rs"), "pub struct B(crate::wire::a::A);\n").unwrap();
    std::fs::write(
        src.join("store.rs"),
        "fn f(h: &http::HeaderMap) { tracing::info!(\"{:?}\", crate::app::ValidConfig); }\n",
    )
    .unwrap();
    let tree = parse_tree(src);
    let wrong = layer_violations(&tree);
    assert!(
        wrong.contains(&"wire (layer 0) imports app (layer 4)".to_string()),
        "{wrong:?}"
    );
    assert!(
        wrong.contains(&"store (layer 1) imports app (layer 4)".to_string()),
        "{wrong:?}"
    );
    assert!(
        wrong.contains(&"wire (layer 0) names ValidConfig".to_string()),
        "{wrong:?}"
    );
    assert!(!wrong.iter().any(|w| w.contains("HeaderMap")), "{wrong:?}");
    assert_eq!(circles(&tree), vec!["wire::a ⇄ wire::b".to_string()]);
}
