//! On a machine without the board runtime, loading the board table fails naming libdnn.so.
//! Tests that map libraries run the load in a child process of their own: the two-copies
//! check reads the whole process's mappings, and libraries loaded by a parallel test (or
//! not unmapped after one) would count as copies.
#![allow(clippy::unwrap_used)]
use std::path::Path;

use hbdnn_sys::{FnTable, LoadError};

#[test]
fn missing_board_library_names_libdnn() {
    let dir = tempfile::tempdir().unwrap();
    let err = FnTable::load_board(Some(dir.path())).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::Library {
                library: "libdnn.so",
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("libdnn.so"), "{msg}");
    assert!(msg.contains("HBDNN_LIB_DIR"), "{msg}");
}

#[test]
fn default_board_dir_fails_here_naming_libdnn() {
    if std::path::Path::new("/usr/hobot/lib/libdnn.so").exists() {
        return; // a real board: nothing to assert here
    }
    let err = FnTable::load_board(None).unwrap_err();
    assert!(err.to_string().contains("libdnn.so"), "{err}");
}

#[test]
fn library_without_symbols_names_the_symbol() {
    // A real shared library that lacks our symbols: libc, copied under the expected names.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    let Some(libc) = libc else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(libc, dir.path().join("libdnn.so")).unwrap();
    std::fs::copy(libc, dir.path().join("libhbucp.so")).unwrap();
    let out = load_in_a_child(dir.path(), None);
    let failed = line(&out, "FAILED ");
    assert!(
        failed.contains("Symbol {")
            && failed.contains("symbol: \"hbDNNGetVersion\"")
            && failed.contains("library: \"libdnn.so\""),
        "{out}"
    );
}

/// Compiles `body` into the shared library `out` with `extra` flags; `None` when no C
/// compiler is available.
fn cc(out: &Path, body: &str, extra: &[&str]) -> Option<()> {
    let src = out.with_extension("c");
    std::fs::write(&src, body).unwrap();
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(out)
        .arg(&src)
        .args(extra)
        .status()
        .ok()?;
    status.success().then_some(())
}

/// Builds `libdnn.so` and `libhbucp.so` stubs exporting `names` (no-op functions) in `dir`,
/// linked as the vendor's are: libdnn needs libhbucp and finds it through `RUNPATH $ORIGIN`.
/// `soname`: whether libhbucp carries its soname. `None` when no C compiler is available.
fn stub_libraries_in(dir: &Path, names: &[&str], soname: bool) -> Option<()> {
    let body = |prefix: &str| -> String {
        names
            .iter()
            .filter(|n| n.starts_with(prefix))
            .map(|n| format!("int {n}(void) {{ return 0; }}\n"))
            .collect()
    };
    let mut ucp_flags = vec![];
    if soname {
        ucp_flags.push("-Wl,-soname,libhbucp.so");
    }
    cc(&dir.join("libhbucp.so"), &body("hbUCP"), &ucp_flags)?;
    let l = format!("-L{}", dir.display());
    cc(
        &dir.join("libdnn.so"),
        &body("hbDNN"),
        &[
            &l,
            "-Wl,--no-as-needed",
            "-lhbucp",
            "-Wl,-rpath,$ORIGIN",
            "-Wl,--enable-new-dtags",
        ],
    )
}

fn stub_libraries(names: &[&str]) -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().unwrap();
    stub_libraries_in(dir.path(), names, true)?;
    Some(dir)
}

#[test]
fn libraries_without_the_optional_symbols_still_load() {
    let required: Vec<&str> = hbdnn_sys::entry_points()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !hbdnn_sys::is_optional(n))
        .collect();
    let Some(dir) = stub_libraries(&required) else {
        eprintln!("no C compiler: skipped");
        return;
    };
    let out = load_in_a_child(dir.path(), None);
    assert!(out.contains("\nLOADED"), "{out}");
    assert_eq!(
        line(&out, "MISSING "),
        "MISSING hbDNNGetErrorDesc hbDNNGetInputName hbDNNGetOutputName hbUCPGetSocName",
        "{out}"
    );
    assert!(out.contains("\nREQUIRED present"), "{out}");
    // A required symbol missing is still an error naming it.
    let without_release: Vec<&str> = required
        .iter()
        .copied()
        .filter(|n| *n != "hbUCPReleaseTask")
        .collect();
    let dir = stub_libraries(&without_release).unwrap();
    let out = load_in_a_child(dir.path(), None);
    let failed = line(&out, "FAILED ");
    assert!(
        failed.contains("Symbol {") && failed.contains("symbol: \"hbUCPReleaseTask\""),
        "{out}"
    );
}

/// The first line of `out` starting with `prefix`.
fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{out}"))
}

/// Env var naming the library folder the child test loads from.
const CHILD_DIR: &str = "HBDNN_SYS_TEST_CHILD_DIR";

/// Not a test of its own: the body of [`load_in_a_child`], run in a fresh process so that
/// `LD_LIBRARY_PATH` (read by the loader only at start-up) applies. Prints what it found.
#[test]
fn child_load_board() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    // Each line starts a line of its own: libtest prints `test … ` before the first.
    match FnTable::load_board(Some(Path::new(&dir))) {
        Ok(t) => {
            for l in t.mapped_libraries() {
                println!("\nMAPPED {} {}", l.library, l.path.display());
            }
            let raw = t.raw();
            let optional = [
                ("hbDNNGetErrorDesc", raw.hbDNNGetErrorDesc.is_none()),
                ("hbDNNGetInputName", raw.hbDNNGetInputName.is_none()),
                ("hbDNNGetOutputName", raw.hbDNNGetOutputName.is_none()),
                ("hbUCPGetSocName", raw.hbUCPGetSocName.is_none()),
            ];
            let missing: Vec<&str> = optional
                .iter()
                .filter_map(|(n, m)| m.then_some(*n))
                .collect();
            println!("\nMISSING {}", missing.join(" "));
            if raw.hbDNNInferV2.is_some() && raw.hbUCPGetErrorDesc.is_some() {
                println!("\nREQUIRED present");
            }
            println!("\nLOADED");
        }
        Err(e) => println!("\nFAILED {e:?}\nMESSAGE {e}"),
    }
}

/// Runs [`child_load_board`] in a new process with `lib_dir` and `ld_library_path`; returns
/// its output.
fn load_in_a_child(lib_dir: &Path, ld_library_path: Option<&Path>) -> String {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_load_board",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_DIR, lib_dir)
    .env_remove("LD_LIBRARY_PATH");
    if let Some(p) = ld_library_path {
        cmd.env("LD_LIBRARY_PATH", p);
    }
    let out = cmd.output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn all_entry_points() -> Vec<&'static str> {
    hbdnn_sys::entry_points()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

#[test]
fn an_sdk_folder_in_ld_library_path_does_not_bring_a_second_libhbucp() {
    let lib = tempfile::tempdir().unwrap();
    let sdk = tempfile::tempdir().unwrap();
    let names = all_entry_points();
    if stub_libraries_in(lib.path(), &names, true).is_none()
        || stub_libraries_in(sdk.path(), &names, true).is_none()
    {
        eprintln!("no C compiler: skipped");
        return;
    }
    let out = load_in_a_child(lib.path(), Some(sdk.path()));
    assert!(out.contains("\nLOADED"), "{out}");
    let ucp: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("MAPPED libhbucp "))
        .collect();
    let expected = format!("MAPPED libhbucp {}/libhbucp.so", lib.path().display());
    assert_eq!(ucp, [expected.as_str()], "{out}");
    assert!(
        out.contains(&format!("MAPPED libdnn {}/libdnn.so", lib.path().display())),
        "{out}"
    );
}

#[test]
fn two_copies_of_libhbucp_are_refused_naming_both_and_ld_library_path() {
    // Without a soname the loader cannot tell that the libhbucp we opened is the one libdnn
    // needs, so LD_LIBRARY_PATH's copy is mapped as well.
    let lib = tempfile::tempdir().unwrap();
    let sdk = tempfile::tempdir().unwrap();
    let names = all_entry_points();
    if stub_libraries_in(lib.path(), &names, false).is_none()
        || stub_libraries_in(sdk.path(), &names, false).is_none()
    {
        eprintln!("no C compiler: skipped");
        return;
    }
    let out = load_in_a_child(lib.path(), Some(sdk.path()));
    assert!(line(&out, "FAILED ").contains("TwoCopies"), "{out}");
    let failed = line(&out, "MESSAGE ");
    assert!(
        failed.contains("two different copies of libhbucp"),
        "{failed}"
    );
    assert!(
        failed.contains(&format!("{}/libhbucp.so", lib.path().display()))
            && failed.contains(&format!("{}/libhbucp.so", sdk.path().display())),
        "{failed}"
    );
    assert!(
        failed.contains("LD_LIBRARY_PATH is") && failed.contains("unset it"),
        "{failed}"
    );
    // Without LD_LIBRARY_PATH libdnn's RUNPATH finds the very file we opened: one copy.
    let out = load_in_a_child(lib.path(), None);
    assert!(out.contains("\nLOADED"), "{out}");
    assert_eq!(out.matches("MAPPED libhbucp ").count(), 1, "{out}");
}
