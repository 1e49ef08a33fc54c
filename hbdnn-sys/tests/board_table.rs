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
