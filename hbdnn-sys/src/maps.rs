//! Which board runtime libraries the process has mapped, read from `/proc/self/maps`.
//!
//! `libdnn.so` is opened by absolute path, but its own dependencies (`libhbucp`, `libhbrt4`,
//! `libhbtl`) are found through the library search path, where `LD_LIBRARY_PATH` comes before
//! libdnn's `RUNPATH`. With `LD_LIBRARY_PATH` pointing at an SDK folder, a second copy of a
//! library can be mapped next to the one we opened, and a task made by one copy would then be
//! handed to the other. The loader lists what is really mapped; two different files for one
//! library is refused before any graph runs.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where the kernel lists the process's mappings.
pub const PROC_MAPS: &str = "/proc/self/maps";

/// One mapped file of a board runtime library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedLibrary {
    /// The library it is a copy of: `libdnn`, `libhbucp`, `libhbtl` or `libhbrt…` (the file
    /// name before `.so`).
    pub library: String,
    /// The mapped file, as the kernel names it.
    pub path: PathBuf,
    /// Device (`major:minor`, hex) and inode of the file; a file reached through two names
    /// (a symlink, a hard link, a bind mount) has one identity.
    pub dev: String,
    pub inode: u64,
}

impl MappedLibrary {
    /// What makes two mappings the same copy: the file identity when the kernel gives one
    /// (inode ≠ 0), else the canonical path.
    fn identity(&self) -> (String, u64, PathBuf) {
        if self.inode != 0 {
            (self.dev.clone(), self.inode, PathBuf::new())
        } else {
            let p = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
            (String::new(), 0, p)
        }
    }
}

impl fmt::Display for MappedLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())
    }
}

/// The board library a file name belongs to, if any: `libdnn.so*`, `libhbucp.so*`,
/// `libhbtl.so*`, `libhbrt*.so*`. Exact stems, so that e.g. oneDNN's `libdnnl.so` is not one.
pub fn board_library(file_name: &str) -> Option<&str> {
    let stem = file_name.split(".so").next()?;
    if !file_name[stem.len()..].starts_with(".so") {
        return None;
    }
    let known = matches!(stem, "libdnn" | "libhbucp" | "libhbtl") || stem.starts_with("libhbrt");
    known.then_some(stem)
}

/// The distinct board-library files in `maps` (the text of `/proc/<pid>/maps`), in the order
/// they first appear. A file mapped in several segments is listed once.
pub fn parse_maps(maps: &str) -> Vec<MappedLibrary> {
    let mut out: Vec<MappedLibrary> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode [path]; the path may hold spaces.
        let mut fields = line.splitn(6, ' ');
        let (Some(_), Some(_), Some(_), Some(dev), Some(inode), Some(rest)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let path = rest.trim_start();
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        if !path.starts_with('/') {
            continue;
        }
        let path = Path::new(path);
        let Some(library) = path
            .file_name()
            .and_then(|f| f.to_str())
            .and_then(board_library)
        else {
            continue;
        };
        let entry = MappedLibrary {
            library: library.to_owned(),
            path: path.to_owned(),
            dev: dev.to_owned(),
            inode: inode.parse().unwrap_or(0),
        };
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    out
}

/// The board libraries this process has mapped now (empty where `/proc` cannot be read).
pub fn mapped_libraries() -> Vec<MappedLibrary> {
    match std::fs::read_to_string(PROC_MAPS) {
        Ok(text) => parse_maps(&text),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read {PROC_MAPS}: mapped libraries unknown");
            Vec::new()
        }
    }
}

/// Two different copies of one library, if any: `(library, first copy, second copy)`. The
/// same file under two names is one copy.
pub fn two_copies(libs: &[MappedLibrary]) -> Option<(String, PathBuf, PathBuf)> {
    let mut seen: BTreeMap<&str, &MappedLibrary> = BTreeMap::new();
    for l in libs {
        match seen.get(l.library.as_str()) {
            None => {
                seen.insert(&l.library, l);
            }
            Some(first) if first.identity() != l.identity() => {
                return Some((l.library.clone(), first.path.clone(), l.path.clone()));
            }
            Some(_) => {}
        }
    }
    None
}

/// The mapped board libraries that are not in `dir` (a library found through another folder
/// of the search path). Compared by canonical folder, so a symlinked `dir` still matches.
pub fn outside(libs: &[MappedLibrary], dir: &Path) -> Vec<MappedLibrary> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let dir = canon(dir);
    libs.iter()
        .filter(|l| l.path.parent().map(canon).as_deref() != Some(dir.as_path()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 100 /usr/bin/vlm
7f0000000000-7f0000100000 r--p 00000000 08:01 2001 /usr/hobot/lib/libdnn.so
7f0000100000-7f0000400000 r-xp 00100000 08:01 2001 /usr/hobot/lib/libdnn.so
7f0000400000-7f0000500000 r--p 00000000 08:01 2002 /usr/hobot/lib/libhbucp.so
7f0000500000-7f0000600000 r--p 00000000 08:01 2003 /usr/hobot/lib/libhbrt4.so
7f0000600000-7f0000700000 r--p 00000000 08:01 2004 /usr/hobot/lib/libhbtl.so
7f0000700000-7f0000800000 r--p 00000000 08:01 3001 /usr/lib/x86_64-linux-gnu/libdnnl.so.3
7f0000800000-7f0000900000 rw-p 00000000 00:00 0 
7f0000900000-7f0000a00000 rw-p 00000000 00:00 0                          [heap]
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn lists_each_board_library_once_and_nothing_else() {
        let libs = parse_maps(MAPS);
        let names: Vec<(&str, &str)> = libs
            .iter()
            .map(|l| (l.library.as_str(), l.path.to_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("libdnn", "/usr/hobot/lib/libdnn.so"),
                ("libhbucp", "/usr/hobot/lib/libhbucp.so"),
                ("libhbrt4", "/usr/hobot/lib/libhbrt4.so"),
                ("libhbtl", "/usr/hobot/lib/libhbtl.so"),
            ]
        );
        assert_eq!((libs[0].dev.as_str(), libs[0].inode), ("08:01", 2001));
        assert_eq!(two_copies(&libs), None);
        assert!(outside(&libs, Path::new("/usr/hobot/lib")).is_empty());
    }

    #[test]
    fn two_files_for_one_library_are_two_copies() {
        let maps = format!(
            "{MAPS}7f0000b00000-7f0000c00000 r-xp 00000000 08:02 77 /opt/sdk/lib with space/libhbucp.so\n"
        );
        let libs = parse_maps(&maps);
        let (lib, a, b) = two_copies(&libs).unwrap();
        assert_eq!(lib, "libhbucp");
        assert_eq!(a, Path::new("/usr/hobot/lib/libhbucp.so"));
        assert_eq!(b, Path::new("/opt/sdk/lib with space/libhbucp.so"));
        let out = outside(&libs, Path::new("/usr/hobot/lib"));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].path, b);
    }

    #[test]
    fn one_file_under_two_names_is_one_copy() {
        // A hard link or a bind mount: two paths, one (dev, inode).
        let maps = format!(
            "{MAPS}7f0000b00000-7f0000c00000 r-xp 00000000 08:01 2002 /opt/sdk/lib/libhbucp.so\n"
        );
        let libs = parse_maps(&maps);
        assert_eq!(libs.iter().filter(|l| l.library == "libhbucp").count(), 2);
        assert_eq!(two_copies(&libs), None);
    }

    #[test]
    fn without_an_inode_a_symlink_and_its_target_are_one_copy() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("libhbrt4.so.1.2");
        std::fs::write(&real, b"x").unwrap();
        let link = d.path().join("libhbrt4.so");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let other = d.path().join("sdk");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("libhbrt4.so"), b"x").unwrap();
        let line = |p: &Path| format!("7f00-7f01 r--p 00000000 00:00 0 {}\n", p.display());
        let libs = parse_maps(&(line(&real) + &line(&link)));
        assert_eq!(libs.len(), 2);
        assert_eq!(libs[1].library, "libhbrt4");
        assert_eq!(two_copies(&libs), None);
        let libs = parse_maps(&(line(&real) + &line(&other.join("libhbrt4.so"))));
        assert!(two_copies(&libs).is_some());
    }

    #[test]
    fn a_deleted_file_keeps_its_name() {
        let libs =
            parse_maps("7f00-7f01 r-xp 00000000 08:01 9 /usr/hobot/lib/libdnn.so (deleted)\n");
        assert_eq!(libs[0].path, Path::new("/usr/hobot/lib/libdnn.so"));
    }

    #[test]
    fn library_names() {
        assert_eq!(board_library("libdnn.so"), Some("libdnn"));
        assert_eq!(board_library("libdnn.so.3.1"), Some("libdnn"));
        assert_eq!(board_library("libhbrt4.so"), Some("libhbrt4"));
        assert_eq!(board_library("libhbtl.so"), Some("libhbtl"));
        assert_eq!(board_library("libhbucp.so"), Some("libhbucp"));
        assert_eq!(board_library("libdnnl.so.3"), None);
        assert_eq!(board_library("libdnn"), None);
        assert_eq!(board_library("libc.so.6"), None);
    }
}
