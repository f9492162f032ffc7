//! Imports only go down: the floors of `src/`, top to bottom, and a check
//! that no module names one on its own floor or above (STYLE.md "Floors";
//! `docs/architecture.md` draws them). A module's floor is that of its
//! top-level folder or file; a failure names the file, the line and the
//! import.

use std::path::Path;

/// Top to bottom. A module may name modules on lower floors only.
const FLOORS: &[&[&str]] = &[
    &["server"],
    &["admin", "listener", "replay"],
    &["pipeline"],
    &["alerts", "import", "logging", "traces"],
    &["config"],
    &["error", "http1", "tls", "secret", "reload"],
    &["limiter"],
    &["metrics"],
    &["clock"],
];

/// Pairs the floors allow but the design rules out: `listener` hands
/// requests to the pipeline and never reaches the reload contract, the
/// admin API or the server above it (issue 53's list, kept as written).
const NEVER: &[(&str, &[&str])] = &[
    ("pipeline", &["listener", "admin", "server"]),
    ("listener", &["admin", "server", "reload"]),
    (
        "config",
        &["pipeline", "listener", "admin", "server", "alerts"],
    ),
    ("http1", &["pipeline", "listener", "config"]),
    ("tls", &["pipeline", "listener", "config"]),
    ("limiter", &["pipeline", "listener", "config", "admin"]),
];

fn forbidden(from: &str, to: &str) -> bool {
    NEVER
        .iter()
        .any(|(module, never)| *module == from && never.contains(&to))
}

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&module))
}

/// Every `crate::<module>` named outside comments in `text`: (line, module).
fn named(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push((n + 1, name));
            rest = after;
        }
    }
    out
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn every_import_points_down_a_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut up = Vec::new();
    let mut placed = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        // The crate root and the binary sit above every floor.
        let Some(floor) = floor_of(&top) else {
            assert!(
                ["lib", "main", "testing"].contains(&top.as_str()),
                "src/{} belongs to no floor: add its module to FLOORS",
                rel.display()
            );
            continue;
        };
        placed += 1;
        for (line, name) in named(&std::fs::read_to_string(file).unwrap()) {
            if name == top {
                continue;
            }
            if forbidden(&top, &name) {
                up.push(format!(
                    "src/{}:{line}: {top} names crate::{name}, which it never may",
                    rel.display()
                ));
                continue;
            }
            match floor_of(&name) {
                Some(f) if f > floor => {}
                Some(_) => up.push(format!(
                    "src/{}:{line}: {top} names crate::{name}, on its floor or above",
                    rel.display()
                )),
                // A re-export at the crate root (`crate::Config`).
                None => {}
            }
        }
    }
    assert!(placed > 80, "only {placed} files checked");
    assert!(up.is_empty(), "imports that point up:\n{}", up.join("\n"));
}

#[test]
fn the_check_sees_an_upward_import() {
    let found = named(
        "use crate::listener::conn; // crate::admin in a comment\nlet x = crate::pipeline::Live;",
    );
    assert_eq!(
        found,
        [(1, "listener".to_owned()), (2, "pipeline".to_owned())]
    );
    assert!(floor_of("pipeline") > floor_of("listener"));
    assert!(forbidden("listener", "reload") && !forbidden("listener", "pipeline"));
}

/// Modules are the crate's own unless the binary, a test, a bench or a
/// fuzz target names them: `lib.rs` makes those few public (re-exporting
/// the names they use), and no other file makes a module `pub`.
#[test]
fn only_lib_rs_makes_a_module_public() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut public = Vec::new();
    for file in files.iter().filter(|f| !f.ends_with("lib.rs")) {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("pub mod ") {
                public.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(public.is_empty(), "public modules:\n{}", public.join("\n"));
}

/// Split by concern before a file reaches 600 lines.
#[test]
fn no_source_file_is_over_600_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    assert!(files.len() > 50, "{} files found under src/", files.len());
    let long: Vec<String> = files
        .iter()
        .map(|f| (f, std::fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, lines)| *lines > 600)
        .map(|(f, lines)| format!("{}: {lines} lines", f.display()))
        .collect();
    assert!(
        long.is_empty(),
        "files over 600 lines:\n{}",
        long.join("\n")
    );
}
