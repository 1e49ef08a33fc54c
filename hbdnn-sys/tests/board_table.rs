//! On a machine without the board runtime, loading the board table fails naming libdnn.so.
#![allow(clippy::unwrap_used)]
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
    // A real shared library that lacks our symbols: libc, copied under the expected name.
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
    let err = FnTable::load_board(Some(dir.path())).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::Symbol {
                symbol: "hbDNNGetVersion",
                library: "libdnn.so",
                ..
            }
        ),
        "{err:?}"
    );
}

/// Builds `libdnn.so` and `libhbucp.so` stubs exporting `names` (no-op functions); `None`
/// when no C compiler is available.
fn stub_libraries(names: &[&str]) -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().unwrap();
    for (lib, prefix) in [("libdnn.so", "hbDNN"), ("libhbucp.so", "hbUCP")] {
        let src = dir.path().join(format!("{lib}.c"));
        let body: String = names
            .iter()
            .filter(|n| n.starts_with(prefix))
            .map(|n| format!("int {n}(void) {{ return 0; }}\n"))
            .collect();
        std::fs::write(&src, body).unwrap();
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(dir.path().join(lib))
            .arg(&src)
            .status()
            .ok()?;
        if !status.success() {
            return None;
        }
    }
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
    let t = FnTable::load_board(Some(dir.path())).unwrap();
    let raw = t.raw();
    assert!(raw.hbDNNGetErrorDesc.is_none());
    assert!(raw.hbDNNGetInputName.is_none());
    assert!(raw.hbDNNGetOutputName.is_none());
    assert!(raw.hbUCPGetSocName.is_none());
    assert!(raw.hbDNNInferV2.is_some() && raw.hbUCPGetErrorDesc.is_some());
    // A required symbol missing is still an error naming it.
    let without_release: Vec<&str> = required
        .iter()
        .copied()
        .filter(|n| *n != "hbUCPReleaseTask")
        .collect();
    let dir = stub_libraries(&without_release).unwrap();
    let err = FnTable::load_board(Some(dir.path())).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::Symbol {
                symbol: "hbUCPReleaseTask",
                ..
            }
        ),
        "{err:?}"
    );
}
