//! Generates the raw bindings from our own header `include/hbdnn_sys.h`.
//!
//! Env overrides (each echoed and tracked; a `<NAME>_<target with _>` variant wins):
//! - `HBDNN_SYS_SYSROOT`: sysroot passed to clang (cross builds; Debian's
//!   `libc6-dev-arm64-cross` is found without it).
//! - `HBDNN_SYS_CLANG_ARGS`: extra clang arguments, whitespace separated.
//! - `HBDNN_SYS_HOBOT_INCLUDE`: include root holding `hobot/dnn/hb_dnn.h`, used only with the
//!   `board-check` feature (default `/usr/include`).
//! - `HBDNN_SYS_HOBOT_LIB_DIR`: where `libdnn.so`/`libhbucp.so` are linked from for the
//!   `board-check` signature tests (default `/usr/hobot/lib`).
//!
//! Exported metadata (`links = "hbdnn"`): `DEP_HBDNN_INCLUDE` = directory of our header.
use std::env;
use std::path::PathBuf;

fn env_var(name: &str) -> Option<String> {
    let target = env::var("TARGET").unwrap_or_default().replace('-', "_");
    let specific = format!("{name}_{target}");
    for key in [specific.as_str(), name] {
        println!("cargo:rerun-if-env-changed={key}");
        if let Ok(v) = env::var(key) {
            println!("cargo:warning=hbdnn-sys: {key}={v}");
            return Some(v);
        }
    }
    None
}

/// Integer macros become `i32`, except the 64-bit backend mask bits.
#[derive(Debug)]
struct IntKinds;

impl bindgen::callbacks::ParseCallbacks for IntKinds {
    fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        let backend_bit = name.starts_with("HB_UCP_") && name.contains("CORE");
        Some(if backend_bit {
            IntKind::U64
        } else {
            IntKind::I32
        })
    }
}

fn clang_args() -> Vec<String> {
    let target = env::var("TARGET").expect("cargo sets TARGET");
    let mut args = vec![format!("--target={target}")];
    if let Some(sysroot) = env_var("HBDNN_SYS_SYSROOT") {
        args.push(format!("--sysroot={sysroot}"));
    }
    if let Some(extra) = env_var("HBDNN_SYS_CLANG_ARGS") {
        args.extend(extra.split_whitespace().map(str::to_owned));
    }
    args
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let include = manifest.join("include");
    let header = include.join("hbdnn_sys.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:include={}", include.display());

    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_args(clang_args())
        .allowlist_file(".*hbdnn_sys\\.h")
        .ctypes_prefix("::core::ffi")
        .use_core()
        .parse_callbacks(Box::new(IntKinds))
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "hbdnn-sys: bindgen failed on {} ({e}); HOST={} TARGET={}. Install libclang and \
                 the target's C headers, or set HBDNN_SYS_SYSROOT / HBDNN_SYS_CLANG_ARGS.",
                header.display(),
                env::var("HOST").unwrap_or_default(),
                env::var("TARGET").unwrap_or_default()
            )
        });
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("OUT_DIR is writable");

    if env::var_os("CARGO_FEATURE_BOARD_CHECK").is_some() {
        board_check(&out);
    }
}

/// Binds the installed vendor headers into a separate module so tests can compare them with
/// ours. The vendor status header is not C-clean, hence `-x c++`.
fn board_check(out: &std::path::Path) {
    let root = env_var("HBDNN_SYS_HOBOT_INCLUDE").unwrap_or_else(|| "/usr/include".into());
    let lib_dir = env_var("HBDNN_SYS_HOBOT_LIB_DIR").unwrap_or_else(|| "/usr/hobot/lib".into());
    let wrapper = out.join("board_wrapper.hpp");
    std::fs::write(
        &wrapper,
        "#include <hobot/dnn/hb_dnn.h>\n#include <hobot/hb_ucp.h>\n#include <hobot/hb_ucp_sys.h>\n\
         #include <hobot/dnn/hb_dnn_status.h>\n#include <hobot/hb_ucp_status.h>\n",
    )
    .expect("OUT_DIR is writable");
    let mut args = clang_args();
    args.extend(["-x".into(), "c++".into(), format!("-I{root}")]);
    let bindings = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_args(args.clone())
        .allowlist_type("hb(DNN|UCP).*")
        .allowlist_function("hb(DNN|UCP).*")
        .allowlist_var("HB_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .ctypes_prefix("::core::ffi")
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!("hbdnn-sys board-check: cannot bind headers under {root}/hobot: {e}")
        });
    bindings
        .write_to_file(out.join("board_bindings.rs"))
        .expect("OUT_DIR is writable");
    // The vendor prototypes again, but over OUR types, so that a signature mismatch is a type
    // error in `tests/board_check.rs`.
    let fns = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_args(args)
        .allowlist_function("hb(DNN|UCP).*")
        .blocklist_type("hb.*")
        .raw_line("#[allow(unused_imports)] use crate::*;")
        .ctypes_prefix("::core::ffi")
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|e| panic!("hbdnn-sys board-check: cannot bind prototypes: {e}"));
    fns.write_to_file(out.join("board_fns.rs"))
        .expect("OUT_DIR is writable");
    println!("cargo:rustc-link-search=native={lib_dir}");
    println!("cargo:rustc-link-lib=dylib=dnn");
    println!("cargo:rustc-link-lib=dylib=hbucp");
}
