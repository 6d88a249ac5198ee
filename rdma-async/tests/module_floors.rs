//! The crate's modules stand on floors (listed in `src/lib.rs`'s docs, lowest first): a module
//! uses only modules on lower floors. This test reads the sources and fails on a use of a
//! module on the same or a higher floor, and on a module the list leaves out, so the list in
//! the docs stays the truth.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The floors as `src/lib.rs` lists them: lines `//! N. `module`: ...`, lowest first.
fn floors(lib_rs: &str) -> BTreeMap<String, usize> {
    let mut floors = BTreeMap::new();
    for line in lib_rs.lines() {
        let Some(rest) = line.strip_prefix("//! ") else {
            continue;
        };
        let Some((number, rest)) = rest.split_once(". `") else {
            continue;
        };
        let (Ok(floor), Some((module, _))) = (number.parse::<usize>(), rest.split_once('`')) else {
            continue;
        };
        floors.insert(module.to_string(), floor);
    }
    floors
}

/// Every `.rs` file below `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading the source tree") {
        let path = entry.expect("reading the source tree").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names `code` reaches through `crate::` (also inside `use crate::{...}` groups and as
/// `$crate::` in macros), comments left out: top-level modules, and items of the crate root.
fn modules_used(code: &str) -> Vec<String> {
    let code: String = code
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut used = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for path in group[..end].split(',') {
                used.extend(first_segment(path.trim()));
            }
        } else {
            used.extend(first_segment(rest));
        }
    }
    used
}

/// The first segment of `path` (a module, or an item of the crate root).
fn first_segment(path: &str) -> Option<String> {
    let end = path
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(path.len());
    (end > 0).then(|| path[..end].to_string())
}

#[test]
fn every_module_uses_only_lower_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib_rs = fs::read_to_string(src.join("lib.rs")).expect("reading src/lib.rs");
    let floors = floors(&lib_rs);
    assert!(
        floors.len() >= 10,
        "src/lib.rs lists {} floors; its docs should list every top-level module",
        floors.len()
    );
    let mut files = Vec::new();
    sources(&src, &mut files);
    let module_of = |file: &Path| {
        let relative = file.strip_prefix(&src).expect("a file below src");
        let first = relative.components().next().expect("a path below src");
        first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string()
    };
    let modules: Vec<String> = files.iter().map(|f| module_of(f)).collect();
    let mut wrong = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("a file below src");
        let module = module_of(file);
        if module == "lib" {
            continue;
        }
        let Some(&floor) = floors.get(&module) else {
            wrong.push(format!(
                "{}: module `{module}` is on no floor in src/lib.rs",
                relative.display()
            ));
            continue;
        };
        let code = fs::read_to_string(file).expect("reading a source file");
        for used in modules_used(&code) {
            if used == module || !modules.contains(&used) {
                continue; // the module itself, or an item of the crate root
            }
            match floors.get(&used) {
                Some(&other) if other < floor => {}
                Some(&other) => wrong.push(format!(
                    "{}: `{module}` (floor {floor}) uses `{used}` (floor {other})",
                    relative.display()
                )),
                None => wrong.push(format!(
                    "{}: `{module}` uses `{used}`, which is on no floor in src/lib.rs",
                    relative.display()
                )),
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "uses against the floors:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reader_finds_uses_in_paths_groups_and_macros() {
    let code = "use crate::verbs::CmId;\nuse crate::{error, cm::link::CmLink, proto::Connection};\n\
                // crate::stream::RStream in a comment\n$crate::device::DeviceChoice\ncrate::Root";
    assert_eq!(
        modules_used(code),
        ["verbs", "error", "cm", "proto", "device", "Root"]
    );
    let lib = "//! Floors, lowest first:\n//!\n//! 1. `error`: what errors carry.\n//! 2. `verbs`: C objects.\n";
    let floors = floors(lib);
    assert_eq!(floors.get("error"), Some(&1));
    assert_eq!(floors.get("verbs"), Some(&2));
}
