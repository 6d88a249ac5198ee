//! The repository's README and the crate's own (its crates.io page, whose snippet compiles as a
//! doc example through `ReadmeDoctests` in `lib.rs`) show the same snippet: this keeps the two
//! identical, so the one on the front page is the one that compiles.

use std::path::Path;

/// The first fenced Rust block of a README, fences included.
fn first_rust_block(text: &str) -> Option<&str> {
    let start = text.find("```rust")?;
    let end = start + text[start..].find("\n```\n")? + "\n```".len();
    Some(&text[start..end])
}

#[test]
fn readme_snippets_are_identical() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let own = std::fs::read_to_string(crate_dir.join("README.md")).expect("the crate's README");
    let own = first_rust_block(&own).expect("a Rust block in the crate's README");
    // Outside the repository (an unpacked crate) there is no top-level README to compare with.
    let Ok(top) = std::fs::read_to_string(crate_dir.join("../README.md")) else {
        return;
    };
    assert_eq!(
        first_rust_block(&top),
        Some(own),
        "README.md and rdma-async/README.md must open with the same Rust snippet"
    );
}
