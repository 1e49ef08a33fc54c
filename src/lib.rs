//! The `bpu_vlm` ROS 2 node (binary `vlm_node`): serves `/ask`, streams answers as
//! `bpu_vlm_msgs/Token` on `/vlm/tokens`, publishes finished `Answer`s on `/vlm/answers` and
//! stops requests through `/vlm/cancel`.
//!
//! This crate holds ROS plumbing only: no model math and no FFI (those live in `vlm` and
//! `vlm-bpu`). A frame's way to a token:
//! 1. `ros::cameras` validates each camera message into the latest-frame cache;
//! 2. [`request::plan`] checks a request against a snapshot of the [`ros::params`] in force
//!    (served and set at run time through `ros::param_server`; sizes first,
//!    [`request::limits`]), picks its image and builds the job ([`serve::job`]: a
//!    `vlm::assistant::Turn` plus the image choice and session); `request::ask` admits it
//!    (`serve::registry`) and queues it;
//! 3. `serve::worker`, the one thread that owns the model, converts the frame to RGB,
//!    continues the conversation from `serve::sessions` (or answers from the latest frame
//!    `serve::priming` filled in the background) and asks `vlm::assistant`, publishing each
//!    delta through `serve::token_sink`;
//! 4. the request ends in one `serve::outcome` (`serve::deliver` serves a job to it), from
//!    which the last Token, the `Answer` and the `/ask` response are filled; error codes are
//!    [`interface::ErrorCode`] and finish reasons `vlm::stream::FinishReason` until then.
//!
//! [`node`] wires it: the entities, threads and shutdown (`request::ask_server` tracks every
//! `/ask` task until its response is sent; `request::ask_action` serves the same asks as the
//! action `vlm/ask`, each goal on the service's path with its Tokens as feedback;
//! [`process::signals`]: SIGINT, SIGTERM; `model` opens the model, [`embedded`] is the demo
//! model, `demo_model`); `diagnostics` reports on `/diagnostics` (the level judged by
//! `health`); [`ros::rosout`] sends logs to `/rosout` (`rosout_level`); [`ros::log_level`]
//! sets the stderr log level from `--ros-args --log-level`.
//!
//! Failures stay as small as they can: every string bound for a message passes `ros::text`
//! (a NUL from the model cannot panic r2r), each request is served inside
//! `process::panics::contained` (a panic fails that request only), and what cannot be
//! recovered is raised in [`process::fatal`], which decides the exit code
//! (`process::test_hooks` injects panics in debug builds).
//!
//! # Rooms
//! The modules live in four rooms, each a directory of `src/` (`ros::cameras` is
//! `src/ros/cameras.rs`). A room uses its own modules and the rooms before it, never one
//! after it:
//!
//! `process` ← `ros` ← `serve` ← `request`
//!
//! - `process`: exit codes, runtime failures, the panic hook, signals;
//! - `ros`: names, QoS, the spin thread, publishers, clock, logging, parameters, cameras,
//!   message text;
//! - `serve`: the worker thread and what it serves (jobs, outcomes, sessions, priming,
//!   tokens, admission);
//! - `request`: `/ask`, `/vlm/cancel` and the Ask action, from a request to a queued job.
//!
//! Every room may use [`interface`] and [`msgs`], which use no room. The files directly in
//! `src/` ([`node`], `managed`, `diagnostics`, `health`, `model`, [`embedded`]) wire the rooms together
//! and may use any of them; no room uses them. Unit tests (`rooms`, below) check the order on
//! the sources, and that no modules use each other in a cycle, inside a room too.
#![forbid(unsafe_code)]

pub(crate) mod diagnostics;
pub mod embedded;
pub(crate) mod health;
pub mod interface;
pub(crate) mod managed;
pub(crate) mod model;
pub mod node;
pub mod process;
pub mod request;
pub mod ros;
pub mod serve;

/// The generated interface types of `msg/` (package `bpu_vlm_msgs`).
pub use r2r::bpu_vlm_msgs as msgs;

/// The room order of the crate doc, checked on the sources: a file of a room names
/// (`crate::<room>`) only its own room or one before it, and never a file directly in `src/`
/// other than [`interface`] (which names no room).
#[cfg(test)]
mod rooms {
    use std::path::{Path, PathBuf};

    /// Lowest first.
    const ORDER: [&str; 4] = ["process", "ros", "serve", "request"];
    /// Modules directly in `src/` any room may use.
    const SHARED: [&str; 2] = ["interface", "msgs"];

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every module a file names as `crate::<name>`, comments left out.
    fn named(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.push(name);
                }
            }
        }
        names
    }

    #[test]
    fn rooms_use_only_the_rooms_before_them() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut rooms: Vec<String> = std::fs::read_dir(&src)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        rooms.sort();
        let mut declared = ORDER.map(str::to_owned).to_vec();
        declared.sort();
        assert_eq!(
            rooms, declared,
            "every directory of src/ is a room of ORDER"
        );
        let mut wrong = Vec::new();
        for (rank, room) in ORDER.iter().enumerate() {
            let mut files = Vec::new();
            sources(&src.join(room), &mut files);
            assert!(!files.is_empty(), "{room}");
            for file in files {
                let text = std::fs::read_to_string(&file).unwrap();
                for name in named(&text) {
                    let allowed = match ORDER.iter().position(|r| *r == name) {
                        Some(r) => r <= rank,
                        None => SHARED.contains(&name.as_str()),
                    };
                    if !allowed {
                        wrong.push(format!("{} uses crate::{name}", file.display()));
                    }
                }
            }
        }
        for shared in SHARED {
            if let Ok(text) = std::fs::read_to_string(src.join(format!("{shared}.rs"))) {
                for name in named(&text) {
                    wrong.push(format!("{shared}.rs uses crate::{name}"));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "against the room order:\n{}",
            wrong.join("\n")
        );
    }

    /// The module of a file: `src/serve/job.rs` is `serve::job`, a `mod.rs` its directory.
    fn module_of(src: &Path, file: &Path) -> String {
        let rel = file.strip_prefix(src).unwrap().with_extension("");
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .filter(|p| p != "mod")
            .collect();
        parts.join("::")
    }

    /// Every `crate::a::b::…` path a file names, comments left out.
    fn paths(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let path: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                out.push(path.trim_end_matches(':').to_owned());
            }
        }
        out
    }

    /// No two modules of the crate use each other, directly or around a loop (a file's
    /// `crate::` paths outside its test module, resolved to the longest module they name).
    #[test]
    fn no_module_imports_form_a_cycle() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        let modules: Vec<String> = files.iter().map(|f| module_of(&src, f)).collect();
        let mut edges: Vec<Vec<usize>> = vec![Vec::new(); files.len()];
        for (from, file) in files.iter().enumerate() {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.split("\n#[cfg(test)]\nmod ").next().unwrap_or("");
            for path in paths(code) {
                let target = modules
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| path == **m || path.starts_with(&format!("{m}::")))
                    .max_by_key(|(_, m)| m.len());
                if let Some((to, _)) = target {
                    if to != from && !edges[from].contains(&to) {
                        edges[from].push(to);
                    }
                }
            }
        }
        // Depth-first search; a module met again on the current path closes a cycle.
        fn visit(
            n: usize,
            edges: &[Vec<usize>],
            state: &mut [u8],
            path: &mut Vec<usize>,
        ) -> Option<Vec<usize>> {
            state[n] = 1;
            path.push(n);
            for &m in &edges[n] {
                if state[m] == 1 {
                    let start = path.iter().position(|&p| p == m).unwrap();
                    let mut cycle = path[start..].to_vec();
                    cycle.push(m);
                    return Some(cycle);
                }
                if state[m] == 0 {
                    if let Some(c) = visit(m, edges, state, path) {
                        return Some(c);
                    }
                }
            }
            path.pop();
            state[n] = 2;
            None
        }
        let mut state = vec![0u8; files.len()];
        for n in 0..files.len() {
            if state[n] == 0 {
                if let Some(cycle) = visit(n, &edges, &mut state, &mut Vec::new()) {
                    let names: Vec<&str> = cycle.iter().map(|&i| modules[i].as_str()).collect();
                    panic!("import cycle: {}", names.join(" -> "));
                }
            }
        }
    }

    #[test]
    fn the_check_sees_paths_in_code_and_not_in_comments() {
        let text = "use crate::serve::job::Job;\n// crate::node\nlet q = crate::ros::qos::tokens_qos(); // crate::request";
        assert_eq!(named(text), ["serve", "ros"]);
        assert_eq!(paths(text), ["serve::job::Job", "ros::qos::tokens_qos"]);
    }
}
