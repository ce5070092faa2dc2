//! ARCHITECTURE.md's checkable claims, checked over the source tree
//! (issue #40 item 13: it said things the code did not do).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    out
}

/// The code lines of a file (comments and doc comments left out).
fn code(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with("//"))
}

/// The top-level module each `crate::x` path in `line` names.
fn crate_paths(line: &str) -> Vec<&str> {
    line.match_indices("crate::")
        .map(|(i, m)| {
            let rest = &line[i + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// The layers of ARCHITECTURE.md, bottom up.
fn layer(module: &str) -> Option<usize> {
    Some(match module {
        "sync" | "wait_list" | "park" | "clock" | "sleep" => 0,
        "semaphore" | "bucket" | "keyed" | "single_flight" | "limiter" | "window" | "redis" => 1,
        "headers" | "retry" | "throttled" | "failure" | "adaptive" => 2,
        "admission" => 3,
        "integrations" => 4,
        _ => return None,
    })
}

/// "Each layer uses only the ones below it": no module names one of a
/// layer above its own.
#[test]
fn dependencies_point_down_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut upward = BTreeSet::new();
    for (path, text) in sources(&src) {
        let rel = path.strip_prefix(&src).unwrap();
        let top = rel
            .iter()
            .next()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs");
        let Some(own) = layer(top) else {
            continue; // lib.rs, fuzzing (test drivers)
        };
        for line in code(&text) {
            for m in crate_paths(line) {
                if let Some(theirs) = layer(m)
                    && theirs > own
                {
                    upward.insert(format!("{}: {top} -> {m}", rel.display()));
                }
            }
        }
    }
    assert!(upward.is_empty(), "upward dependencies: {upward:#?}");
}

/// "Besides public methods, they reach the layers below through these
/// crate-private doors only: the attempt loop (`admission::attempt`)":
/// every `crate::admission::` path in `integrations/` is a public name of
/// `backpressure::admission` or the attempt loop.
#[test]
fn integrations_reach_admission_through_public_names_and_the_attempt_loop() {
    let public = [
        "Admission",
        "Builder",
        "Call",
        "CallFailure",
        "CallResult",
        "CallSpec",
        "CircuitBreaker",
        "Priority",
        "Provider",
        "Reply",
        "Runner",
        "SlotPolicy",
        "Ticket",
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/integrations");
    let mut private = BTreeSet::new();
    for (path, text) in sources(&src) {
        for line in code(&text) {
            for (i, _) in line.match_indices("crate::admission::") {
                let rest = &line[i + "crate::admission::".len()..];
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group[..group.find('}').unwrap()]
                        .split(',')
                        .map(|n| n.trim().split("::").next().unwrap())
                        .collect(),
                    None => vec![rest
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .next()
                        .unwrap()],
                };
                for name in names {
                    // The two crate-private doors: the attempt loop and the
                    // one read identity.
                    if !matches!(name, "attempt" | "identity") && !public.contains(&name) {
                        private.insert(format!("{}: {name}", path.display()));
                    }
                }
            }
        }
    }
    assert!(
        private.is_empty(),
        "crate-private admission paths: {private:#?}"
    );
}
