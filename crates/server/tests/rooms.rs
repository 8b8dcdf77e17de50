//! The server crate's rooms (ARCHITECTURE.md, "The server's modules point one way"): the route
//! modules take what they share from `context` and its neighbours, never from `app.rs` (which
//! assembles them) nor from `openapi.rs` (which lists them); the shared modules name no route.
//! Read from the sources: every `crate::…` path in code (comments left out).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, as (path relative to src/, code without comments).
fn sources(dir: &Path, src: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("src/ is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, src, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let text = std::fs::read_to_string(&path).expect("a source file is UTF-8");
            let code: String = text
                .lines()
                .map(|line| match line.find("//") {
                    Some(at) => &line[..at],
                    None => line,
                })
                .collect::<Vec<_>>()
                .join("\n");
            let name = path
                .strip_prefix(src)
                .expect("under src/")
                .to_string_lossy()
                .replace('\\', "/");
            out.push((name, code));
        }
    }
}

/// The crate modules a file's code names (`crate::x::…` → `x`).
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let module: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        named.insert(module);
    }
    named
}

fn all_sources() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    sources(&src, &src, &mut out);
    assert!(
        out.iter().any(|(name, _)| name == "routes/tasks.rs") && out.len() > 20,
        "the crate's sources were not found: {:?}",
        out.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    out
}

/// What `lib.rs` re-exports from `app.rs` (reached as `crate::router`, `crate::serve`).
const APP_ITEMS: [&str; 2] = ["router", "serve"];

#[test]
fn only_lib_names_app_and_only_app_names_openapi() {
    for (name, code) in all_sources() {
        let named = named_modules(&code);
        if name != "lib.rs" && name != "app.rs" {
            assert!(
                !named.contains("app") && APP_ITEMS.iter().all(|item| !named.contains(*item)),
                "{name} imports app.rs; what routes share belongs in context.rs"
            );
        }
        if !matches!(name.as_str(), "lib.rs" | "app.rs" | "openapi.rs") {
            assert!(
                !named.contains("openapi"),
                "{name} imports openapi.rs, which lists every route"
            );
        }
    }
}

#[test]
fn the_shared_modules_name_no_route() {
    // What the routes stand on; none of it may lean on a route, or the circle is back.
    let shared = [
        "config.rs",
        "context.rs",
        "key_secret.rs",
        "problem.rs",
        "auth.rs",
        "json.rs",
        "offload.rs",
        "policy.rs",
        "factory.rs",
        "views.rs",
        "views/redaction.rs",
        "views/boards.rs",
        "views/recall.rs",
        "batch_report.rs",
    ];
    let route_modules = ["routes", "viewer", "metrics", "openapi", "app"];
    let sources = all_sources();
    for file in shared {
        let (_, code) = sources
            .iter()
            .find(|(name, _)| name == file)
            .unwrap_or_else(|| panic!("{file} is not among the sources"));
        for module in named_modules(code) {
            assert!(
                !route_modules.contains(&module.as_str()),
                "{file} imports crate::{module}; the shared modules depend on no route"
            );
        }
    }
    // The config is the floor: it names no other module.
    let (_, config) = sources
        .iter()
        .find(|(name, _)| name == "config.rs")
        .expect("config.rs");
    assert_eq!(named_modules(config), BTreeSet::new());
}

#[test]
fn the_reader_sees_imports() {
    // The checks above mean something only if the reader finds what a route imports.
    let sources = all_sources();
    let (_, tasks) = sources
        .iter()
        .find(|(name, _)| name == "routes/tasks.rs")
        .expect("routes/tasks.rs");
    let named = named_modules(tasks);
    assert!(
        named.contains("context") && named.contains("problem"),
        "{named:?}"
    );
    let (_, app) = sources
        .iter()
        .find(|(name, _)| name == "app.rs")
        .expect("app.rs");
    assert!(named_modules(app).contains("routes"));
}
