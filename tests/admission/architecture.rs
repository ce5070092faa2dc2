//! ARCHITECTURE.md's checkable claims, checked over the source tree: the
//! layering (and that the primitives build without `admission`), which
//! files name atomics directly, and that no test asserts a wall-clock
//! duration outside a short allow-list.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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
    out.sort();
    out
}

/// `path` relative to the crate root, with `/` separators.
fn rel(path: &Path) -> String {
    let rel = path.strip_prefix(root()).unwrap();
    rel.iter()
        .map(|c| c.to_str().unwrap())
        .collect::<Vec<_>>()
        .join("/")
}

/// The code lines of a file (comments and doc comments left out).
fn code(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with("//"))
}

/// A file's code lines, joined (so a statement spanning lines is one
/// string).
fn code_text(text: &str) -> String {
    code(text).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The text from `open` (an index of `(`, `[` or `{`) to its matching
/// close, both included; string literals are skipped. `None` if it never
/// closes.
fn balanced(text: &str, open: usize) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[open..=i]);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The top-level names each `crate::` path in `text` starts with:
/// `crate::a::b` gives `a`, `crate::{a::b, c}` gives `a` and `c`.
fn crate_paths(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (i, m) in text.match_indices("crate::") {
        if text[..i].ends_with(is_ident) {
            continue; // `backpressure_crate::`, not ours
        }
        let at = i + m.len();
        let rest = &text[at..];
        if rest.starts_with('{') {
            let group = balanced(text, at).unwrap();
            let inner = &group[1..group.len() - 1];
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(first_segment(&inner[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            out.push(first_segment(&inner[start..]));
        } else {
            out.push(first_segment(rest));
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

fn first_segment(path: &str) -> &str {
    let path = path.trim_start();
    let end = path.find(|c| !is_ident(c)).unwrap_or(path.len());
    &path[..end]
}

/// The root names `src/lib.rs` re-exports, by the top-level module each
/// comes from (`Semaphore` -> `semaphore`, `tower` -> `integrations`).
fn reexports() -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let lib = code_text(&lib);
    let mut out = BTreeMap::new();
    for (i, m) in lib.match_indices("pub use ") {
        let stmt = &lib[i + m.len()..];
        let stmt = &stmt[..stmt.find(';').unwrap()];
        let module = first_segment(stmt).to_owned();
        let names = match stmt.find('{') {
            Some(open) => stmt[open + 1..stmt.rfind('}').unwrap()].to_owned(),
            None => stmt.rsplit("::").next().unwrap().to_owned(),
        };
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            out.insert(name.to_owned(), module.clone());
        }
    }
    out
}

/// The layers of ARCHITECTURE.md, bottom up. Layers 0 and 1 build without
/// the `admission` feature; 2 and above need it.
fn layer(module: &str) -> Option<usize> {
    Some(match module {
        "sync" | "wait_list" | "park" | "clock" | "sleep" => 0,
        "semaphore" | "bucket" | "keyed" | "single_flight" | "limiter" | "window" | "throttled"
        | "redis" => 1,
        "headers" | "retry" | "failure" | "adaptive" => 2,
        "admission" => 3,
        "integrations" => 4,
        _ => return None,
    })
}

/// The top-level module a file of `src/` belongs to (`src/a/b.rs` -> `a`).
fn top_module(src: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(src).unwrap();
    let first = rel.iter().next().unwrap().to_str().unwrap();
    first.trim_end_matches(".rs").to_owned()
}

/// "Each layer uses only the ones below it": no module names one of a
/// layer above its own, directly (`crate::admission::..`), in a group
/// (`crate::{retry::Deadline, ..}`) or through a root re-export
/// (`crate::tower`).
#[test]
fn dependencies_point_down_only() {
    let src = root().join("src");
    let reexports = reexports();
    let mut upward = BTreeSet::new();
    for (path, text) in sources(&src) {
        let top = top_module(&src, &path);
        let Some(own) = layer(&top) else {
            continue; // lib.rs, fuzzing (test drivers)
        };
        for name in crate_paths(&code_text(&text)) {
            let module = reexports.get(name).map_or(name, String::as_str);
            if let Some(theirs) = layer(module)
                && theirs > own
            {
                upward.insert(format!("{}: {top} -> {module} ({name})", rel(&path)));
            }
        }
    }
    assert!(upward.is_empty(), "upward dependencies: {upward:#?}");
}

/// "With `default-features = false` only the primitives build": the
/// modules `src/lib.rs` compiles without the `admission` feature are
/// exactly layers 0 and 1, and every module gated on `admission` is in
/// layer 2 or above; with `dependencies_point_down_only`, nothing the
/// primitives use needs the feature. (`integrations` is always compiled
/// for `PollSemaphore` and gates its own seams on features that imply
/// `admission`; `fuzzing` gates its header driver the same way.)
#[test]
fn the_primitives_build_without_admission() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let mut misplaced = Vec::new();
    let mut cfg = String::new();
    for line in code(&lib) {
        let line = line.trim();
        if line.starts_with("#[cfg(") {
            cfg = line.to_owned();
            continue;
        }
        let decl = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "));
        let module = decl.and_then(|d| d.strip_suffix(';'));
        let gated = std::mem::take(&mut cfg).contains("feature = \"admission\"");
        let Some(module) = module else { continue };
        if matches!(module, "integrations" | "fuzzing" | "loom_tests") {
            continue;
        }
        match (layer(module), gated) {
            (Some(l), false) if l <= 1 => {}
            (Some(l), true) if l >= 2 => {}
            other => misplaced.push(format!("{module}: (layer, gated) = {other:?}")),
        }
    }
    assert!(misplaced.is_empty(), "layer vs feature: {misplaced:#?}");
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
    let src = root().join("src/integrations");
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

/// The files of `src/` that name `std::sync::atomic`, `core::sync::atomic`
/// or `loom::` in code, and why. Every lock-free structure takes its
/// atomics from `crate::sync`, so the loom models run the shipped code;
/// ARCHITECTURE.md ("Code map", `sync.rs`) states this same list.
const NAMES_ATOMICS: &[(&str, &str)] = &[
    ("src/sync.rs", "the shim: std or loom"),
    (
        "src/sync/lock.rs",
        "ListLock's stand-in for parking_lot_core under loom",
    ),
    (
        "src/semaphore/raw/hint.rs",
        "the try_acquire hint is a loom::thread_local! under loom",
    ),
    (
        "src/clock.rs",
        "ManualClock's sleep count and fences: std, so `advance` adds no loom scheduling point",
    ),
    (
        "src/retry/mod.rs",
        "Backoff's fork counter: a seed, Relaxed",
    ),
    (
        "src/admission/cache.rs",
        "the static generation source (a loom atomic cannot be static)",
    ),
    (
        "src/admission/rate/rescales.rs",
        "the static sleeper ids (names only; a loom atomic cannot be static)",
    ),
    ("src/wait_list.rs", "test code"),
    ("src/single_flight/tests.rs", "test code"),
    (
        "src/fuzzing/mod.rs",
        "the unit tests' counting waker (test code)",
    ),
];

/// A new file that names atomics directly fails here until the list above
/// and ARCHITECTURE.md say why.
#[test]
fn only_the_listed_files_name_atomics_directly() {
    let mut found = BTreeSet::new();
    for (path, text) in sources(&root().join("src")) {
        let names = code(&text).any(|l| {
            ["std::sync::atomic", "core::sync::atomic", "loom::"]
                .iter()
                .any(|p| l.match_indices(p).any(|(i, _)| !l[..i].ends_with(is_ident)))
        });
        if names {
            found.insert(rel(&path));
        }
    }
    let listed: BTreeSet<String> = NAMES_ATOMICS.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(
        found, listed,
        "files naming atomics directly differ from the list (and ARCHITECTURE.md)"
    );
}

/// Assertions allowed to read the wall clock: (file, a snippet of the
/// assertion, or "" for every one in the file, why). Most are lower bounds
/// the code enforces on real time (load only makes a gap longer),
/// orderings, or startup timeouts; one is an upper bound that a stalled
/// machine can break, and says so.
const WALL_CLOCK_ASSERTS: &[(&str, &str, &str)] = &[
    (
        "src/sleep/default.rs",
        "start.elapsed() >= Duration::from_secs(60)",
        "tokio's paused clock: deterministic",
    ),
    (
        "src/integrations/testing/limit.rs",
        "",
        "the fake server's limiter is handed each instant as an argument: no test waits",
    ),
    (
        "tests/support/redis_server.rs",
        "start.elapsed() < Duration::from_secs(10)",
        "a startup timeout: fails only if redis-server never answers",
    ),
    (
        "tests/support/redis_cluster.rs",
        "start.elapsed() < Duration::from_secs(20)",
        "a startup timeout: fails only if a cluster node never answers",
    ),
    (
        "tests/admission/runner.rs",
        ".duration_since(starts[",
        "a lower bound on real time: the retry waited out Retry-After",
    ),
    (
        "tests/admission/admission_layer.rs",
        "w > third_window",
        "a lower bound on real time: a fake server's next window, as the hint said",
    ),
    (
        "tests/integrations/tower_admission.rs",
        "after >= Duration::from_millis(950)",
        "a lower bound on real time: the server's hold, on its record of starts",
    ),
    (
        "tests/integrations/tower_admission.rs",
        "span >= Duration::from_millis(1_500)",
        "a lower bound on real time: the quota spreads the calls, on the server's record",
    ),
    (
        "tests/integrations/mcp_tool_limit.rs",
        "in_second <= LIMITED_PER_SECOND",
        "a ceiling per real window of the server's record, which load only spreads (the server's own limit counts that way)",
    ),
    (
        "tests/integrations/reqwest_seam.rs",
        "gaps(&starts)",
        "a lower bound on real time: the retry waited out Retry-After, on the server's record",
    ),
    (
        "tests/integrations/reqwest_seam.rs",
        "most <= 10",
        "a ceiling per real window that only a faster clock could break: load spreads requests",
    ),
    (
        "tests/integrations/reqwest_seam.rs",
        "u < starts[0] + Duration::from_millis(100)",
        "an upper bound on real time (10 requests start within 100 ms): a stall of 100 ms fails it",
    ),
    (
        "tests/integrations/reqwest_seam.rs",
        "bg_meanwhile <= bg_cap",
        "an ordering: which requests started between two others on the server's record",
    ),
    (
        "tests/integrations/testing.rs",
        "w[0] <= w[1]",
        "an ordering: the server records starts in arrival order",
    ),
    (
        "tests/support/down_server.rs",
        "gap >= COOL_DOWN",
        "a lower bound on real time: a cool-down between trials, on the server's record",
    ),
];

/// The body of every `fn` in `text` (a nested one also inside its
/// parent's), so a name is followed within the function that binds it.
fn fn_bodies(text: &str) -> Vec<&str> {
    text.match_indices("fn ")
        .filter(|(i, _)| !text[..*i].ends_with(is_ident))
        .filter_map(|(i, _)| {
            let sig = &text[i..];
            // The body opens at the first `{` after the signature; a
            // declaration without one (`fn f();`) ends at `;` first.
            let open = sig.find('{')?;
            if sig[..open].contains(';') {
                return None;
            }
            balanced(text, i + open)
        })
        .collect()
}

/// The assertion macro calls in `text` (`assert!`, `assert_eq!`,
/// `assert_ne!`, `debug_assert*!`, `prop_assert*!`), each whole.
fn assertions(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, _) in text.match_indices("assert") {
        let start = text[..i].rfind(|c| !is_ident(c)).map_or(0, |j| j + 1);
        let end = i + text[i..].find(|c| !is_ident(c)).unwrap_or(text.len() - i);
        let known = matches!(
            &text[start..end],
            "assert"
                | "assert_eq"
                | "assert_ne"
                | "debug_assert"
                | "debug_assert_eq"
                | "debug_assert_ne"
                | "prop_assert"
                | "prop_assert_eq"
                | "prop_assert_ne"
        );
        if !known || !text[end..].starts_with("!(") || !seen.insert(start) {
            continue;
        }
        if let Some(call) = balanced(text, end + 1) {
            out.push(&text[start..end + 1 + call.len()]);
        }
    }
    out
}

/// Whether `text` reads the wall clock itself: `Instant::now()`,
/// `.elapsed()`, `.duration_since(..)` between two instants, or a test
/// server's record of when requests started (`request_starts(..)`).
fn reads(text: &str) -> bool {
    let record = text.match_indices("request_starts(").any(|(i, m)| {
        // Its length is a count of requests, not a reading.
        let call = balanced(text, i + m.len() - 1).unwrap_or_default();
        !text[i + m.len() - 1 + call.len()..].starts_with(".len()")
    });
    record
        || ["Instant::now()", ".elapsed()", ".duration_since("]
            .iter()
            .any(|r| text.contains(r))
}

/// `text` with the contents of its string literals left out (so a message
/// naming a variable does not count as using it).
fn without_strings(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '"' {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        out.push('"');
                        break;
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// Whether `text` mentions the variable `name`: not a longer identifier,
/// a field or path segment (`.name`, `::name`), or a call (`name(`).
fn mentions(text: &str, name: &str) -> bool {
    text.match_indices(name)
        .any(|(i, _)| mention_at(text, i, name))
}

/// Whether the `name` found at `i` in `text` is the variable (and not
/// only its length: `starts.len()` counts instants, it reads none).
fn mention_at(text: &str, i: usize, name: &str) -> bool {
    let (before, after) = (&text[..i], &text[i + name.len()..]);
    !before.ends_with(|c| is_ident(c) || c == '.' || c == ':')
        && !after.starts_with(|c| is_ident(c) || c == '(' || c == '!')
        && !after.starts_with(".len()")
}

/// Whether `text` mentions the variable `name` outside any parentheses,
/// brackets or braces: `start + d` uses `start`'s value, `f(start)` or
/// `v.filter(|t| t > start)` only hands it on.
fn mentions_outside_calls(text: &str, name: &str) -> bool {
    let mut depth = 0i32;
    let mut at_depth = Vec::with_capacity(text.len() + 1);
    for c in text.bytes() {
        at_depth.push(depth);
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
    }
    at_depth.push(depth);
    text.match_indices(name)
        .any(|(i, _)| at_depth[i] == 0 && mention_at(text, i, name))
}

/// The names in a function bound, by `let`, to a reading of the wall
/// clock (see [`reads`]) or to arithmetic on one (and, in a file that
/// reads it, any name `elapsed`): `let start = Instant::now()` taints
/// `start`, then `let until = start + d` taints `until`; `f(start)` does
/// not taint what `f` returns, and a tuple pattern taints nothing but a
/// name `elapsed`.
fn wall_clock_names(text: &str, file_reads: bool) -> BTreeSet<String> {
    let mut tainted = BTreeSet::new();
    if file_reads {
        tainted.insert("elapsed".to_owned());
    }
    let lets: Vec<(&str, &str)> = text
        .match_indices("let ")
        .filter(|(i, _)| !text[..*i].ends_with(is_ident))
        .filter_map(|(i, m)| {
            let stmt = &text[i + m.len()..];
            let eq = stmt.find(" = ")?;
            let end = stmt.find(';')?;
            if eq > end {
                return None; // `let x;` or `let .. else`
            }
            // One name only: a tuple's parts are not all the clock's.
            let name = stmt[..eq].trim().trim_start_matches("mut ");
            let name = name.split(':').next().unwrap().trim();
            name.chars().all(is_ident).then_some((name, &stmt[eq..end]))
        })
        .collect();
    loop {
        let before = tainted.len();
        for (name, rhs) in &lets {
            let rhs = without_strings(rhs);
            if reads(&rhs) || tainted.iter().any(|t| mentions_outside_calls(&rhs, t)) {
                tainted.insert(name.to_string());
            }
        }
        if tainted.len() == before {
            return tainted;
        }
    }
}

/// "Tests assert orderings and counts, never durations": no assertion in
/// `tests/`, `loom-tests/` or `src/` (its test code) reads the wall clock
/// (`Instant::now()`, `elapsed`, or a name computed from them), except the
/// allow-list above, each entry with its reason.
#[test]
fn no_test_asserts_a_wall_clock_duration() {
    let mut found = BTreeSet::new();
    for dir in ["tests", "loom-tests", "src"] {
        for (path, text) in sources(&root().join(dir)) {
            if rel(&path) == "tests/admission/architecture.rs" {
                continue; // this file: its scratch cases are data
            }
            let text = code_text(&text);
            let file_reads = reads(&text);
            for body in fn_bodies(&text) {
                let names = wall_clock_names(body, file_reads);
                for call in assertions(body) {
                    let bare = without_strings(call);
                    if reads(&bare) || names.iter().any(|n| mentions(&bare, n)) {
                        let call = call.split_whitespace().collect::<Vec<_>>().join(" ");
                        found.insert((rel(&path), call));
                    }
                }
            }
        }
    }
    let unexplained: Vec<_> = found
        .iter()
        .filter(|(file, call)| {
            !WALL_CLOCK_ASSERTS
                .iter()
                .any(|(f, snippet, _)| f == file && call.contains(snippet))
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "assertions on the wall clock (assert counts and orderings on a ManualClock or \
         tokio's paused clock, or add an entry with its reason): {unexplained:#?}"
    );
    let stale: Vec<_> = WALL_CLOCK_ASSERTS
        .iter()
        .filter(|(f, snippet, _)| {
            !found
                .iter()
                .any(|(file, call)| file == f && call.contains(snippet))
        })
        .collect();
    assert!(
        stale.is_empty(),
        "allow-list entries that match nothing: {stale:#?}"
    );
}

/// A wall-clock assertion is found in a scratch function: directly, and
/// through `let` arithmetic; a count handed an instant, a string naming
/// one, and a manual clock are not.
#[test]
fn the_wall_clock_scan_finds_what_it_should() {
    let scratch = r#"
        fn t() {
            let start = Instant::now();
            let until = start + Duration::from_secs(2);
            let n = drive(start);
            let t0 = clock.now();
            assert!(start.elapsed() < Duration::from_secs(1));
            assert!(until > deadline, "{n}");
            assert_eq!(n, 3, "until {start:?}");
            assert!(t0 > 5, "{}", rate(n));
            assert_eq!(
                starts.len(),
                server.request_starts("k").len()
            );
        }
    "#;
    let body = fn_bodies(scratch)[0];
    let names = wall_clock_names(body, reads(scratch));
    let flagged: Vec<&str> = assertions(body)
        .into_iter()
        .filter(|call| {
            let bare = without_strings(call);
            reads(&bare) || names.iter().any(|n| mentions(&bare, n))
        })
        .collect();
    assert_eq!(
        flagged,
        [
            "assert!(start.elapsed() < Duration::from_secs(1))",
            "assert!(until > deadline, \"{n}\")",
        ]
    );
}

/// The layering test reads grouped and nested imports and root re-exports.
#[test]
fn crate_paths_reads_groups() {
    let line = "use crate::{headers::{Advice, Clamp}, retry::Deadline, Clock}; crate::tower::x";
    assert_eq!(crate_paths(line), ["headers", "retry", "Clock", "tower"]);
    let reexports = reexports();
    assert_eq!(reexports["Semaphore"], "semaphore");
    assert_eq!(reexports["RollingWindow"], "window");
}
