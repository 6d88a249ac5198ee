//! The layout check's two tables, generated from the committed bindings: for every complete struct
//! and union of `src/bindings.rs`, its size and alignment, and the offset and size of each of its
//! fields (through anonymous members and nested anonymous types), once as the C compiler of the
//! target sees them (`layout.c`, compiled into the shim) and once as Rust does (`layout.rs`, which
//! `tests/layout.rs` includes). The test compares the two on whatever target it runs, so a layout
//! that differs between targets (glibc's `pthread_mutex_t` inside `ibv_cq`, say) is caught where
//! it differs. Generated from the bindings themselves, the list of what is checked cannot drift
//! from what is bound.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One field of a struct or union of the bindings, as bindgen wrote it.
struct Field {
    name: String,
    ty: String,
}

/// A struct or union of the bindings.
struct Type {
    /// A union in C: a Rust union, or a struct standing for one (`bindgen_union_field`).
    union: bool,
    fields: Vec<Field>,
}

/// The two tables, as C and Rust source.
pub struct Tables {
    pub c: String,
    pub rust: String,
}

/// Fields that C has no name for: bindgen's storage, padding and bitfield units.
fn is_storage(name: &str) -> bool {
    name == "bindgen_union_field"
        || name.starts_with("__bindgen_padding")
        || name.starts_with("_bitfield")
        || name == "_unused"
}

/// The C name of a field bindgen renamed because it is a Rust keyword (`type_` for `type`).
fn c_name(rust: &str) -> &str {
    match rust.strip_suffix('_') {
        Some(kw @ ("type" | "priv" | "ref" | "mod" | "fn" | "impl" | "in" | "match" | "box")) => kw,
        _ => rust,
    }
}

/// Splits a struct body at its top-level commas (function pointer types hold commas of their
/// own; `->` is no closing bracket).
fn split_fields(body: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    let mut previous = ' ';
    for c in body.chars() {
        match c {
            '<' | '(' | '[' | '{' => depth += 1,
            '>' if previous != '-' => depth -= 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                previous = c;
                continue;
            }
            _ => {}
        }
        current.push(c);
        previous = c;
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Every struct and union definition of the bindings, by name.
fn parse(bindings: &str) -> BTreeMap<String, Type> {
    let mut types = BTreeMap::new();
    let mut lines = bindings.lines();
    while let Some(line) = lines.next() {
        let (union, rest) = if let Some(rest) = line.strip_prefix("pub struct ") {
            (false, rest)
        } else if let Some(rest) = line.strip_prefix("pub union ") {
            (true, rest)
        } else {
            continue;
        };
        let Some(name) = rest.strip_suffix(" {") else {
            continue; // a tuple struct: bindgen's own helpers
        };
        let body: String = lines
            .by_ref()
            .take_while(|l| *l != "}")
            .collect::<Vec<_>>()
            .join(" ");
        let fields: Vec<Field> = split_fields(&body)
            .iter()
            .filter_map(|f| {
                let (name, ty) = f.strip_prefix("pub ").unwrap_or(f).split_once(": ")?;
                Some(Field {
                    name: name.to_owned(),
                    ty: ty.to_owned(),
                })
            })
            .collect();
        let union = union || fields.iter().any(|f| f.name == "bindgen_union_field");
        types.insert(name.to_owned(), Type { union, fields });
    }
    types
}

/// Appends the entries for `fields` of the root type `root`, reached by the C path `c_path` and
/// the Rust path `rust_path` (empty at the root), descending into anonymous types.
fn push_fields(
    types: &BTreeMap<String, Type>,
    root: &str,
    ty: &Type,
    c_path: &str,
    rust_path: &str,
    entries: &mut Vec<(String, String, String)>,
) {
    let join = |path: &str, name: &str| {
        if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    };
    let c_type = |name: &str| {
        format!(
            "{} {name}",
            if types[name].union { "union" } else { "struct" }
        )
    };
    for field in ty.fields.iter().filter(|f| !is_storage(&f.name)) {
        let rust = join(rust_path, &field.name);
        // An anonymous member: C reaches its fields directly.
        let anonymous = field.name.starts_with("__bindgen_anon_");
        let c = if anonymous {
            c_path.to_owned()
        } else {
            join(c_path, c_name(&field.name))
        };
        if !anonymous {
            let key = format!("{root}.{c}");
            entries.push((
                format!("offset_of {key}"),
                format!("offsetof({}, {c})", c_type(root)),
                format!("::core::mem::offset_of!({root}, {rust})"),
            ));
            // A union's variants are zero-sized markers in bindgen's struct for it.
            if !field.ty.starts_with("__BindgenUnionField") {
                entries.push((
                    format!("size_of {key}"),
                    format!("sizeof((({} *)0)->{c})", c_type(root)),
                    format!("::core::mem::size_of::<{}>()", field.ty),
                ));
            }
        }
        if let Some(inner) = types
            .get(&field.ty)
            .filter(|_| field.ty.contains("__bindgen_ty_"))
        {
            push_fields(types, root, inner, &c, &rust, entries);
        }
    }
}

/// The tables for the bindings' text.
pub fn tables(bindings: &str) -> Tables {
    let types = parse(bindings);
    let mut entries = Vec::new();
    // Complete named types only: C has no name for bindgen's `__bindgen_ty_N` (they are checked
    // through the fields that hold them), opaque ones have no layout, and `__`-prefixed ones are
    // glibc internals that only the libc crate's types stand for.
    for (name, ty) in types.iter().filter(|(name, ty)| {
        !name.contains("__bindgen_ty_")
            && !name.starts_with('_')
            && !ty.fields.iter().any(|f| f.name == "_unused")
    }) {
        let c_type = format!("{} {name}", if ty.union { "union" } else { "struct" });
        entries.push((
            format!("size_of {name}"),
            format!("sizeof({c_type})"),
            format!("::core::mem::size_of::<{name}>()"),
        ));
        entries.push((
            format!("align_of {name}"),
            format!("_Alignof({c_type})"),
            format!("::core::mem::align_of::<{name}>()"),
        ));
        push_fields(&types, name, ty, "", "", &mut entries);
    }

    let mut c = String::from(
        "/* Generated by rdma-async-sys's build script from src/bindings.rs (build/layout.rs). */\n\
         #include <stddef.h>\n#include \"wrapper.h\"\n\n\
         struct rdma_async_layout_entry { const char *what; size_t value; };\n\n\
         const struct rdma_async_layout_entry rdma_async_layout[] = {\n",
    );
    let mut rust = String::from(
        "// Generated by rdma-async-sys's build script from src/bindings.rs (build/layout.rs).\n\
         const RUST_LAYOUT: &[(&str, usize)] = &[\n",
    );
    for (what, c_expr, rust_expr) in &entries {
        writeln!(c, "\t{{ \"{what}\", {c_expr} }},").unwrap();
        writeln!(rust, "    (\"{what}\", {rust_expr}),").unwrap();
    }
    c.push_str(
        "};\n\nconst size_t rdma_async_layout_len = sizeof rdma_async_layout / sizeof rdma_async_layout[0];\n",
    );
    rust.push_str("];\n");
    Tables { c, rust }
}
