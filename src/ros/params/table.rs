//! The parameter table of docs/parameters.md, rendered from the declarations and compared with
//! the one in that file, so the two cannot drift. `BPU_VLM_WRITE_PARAM_TABLE=1 cargo test -p
//! bpu_vlm --lib params::table` rewrites the table from the declarations.

use std::fmt::Write as _;

use r2r::ParameterValue;

use super::{Apply, Kind, SPECS};

/// The lines around the generated table in docs/parameters.md.
const BEGIN: &str =
    "<!-- parameter table: rendered from the declarations in src/ros/params.rs -->\n";
const END: &str = "<!-- end of the parameter table -->\n";

/// The value as the YAML file and the docs/parameters.md table spell it.
pub fn spelled(v: &ParameterValue) -> String {
    match v {
        ParameterValue::Bool(b) => b.to_string(),
        ParameterValue::Integer(i) => i.to_string(),
        ParameterValue::Double(d) => format!("{d:?}"),
        ParameterValue::String(s) => format!("{s:?}"),
        ParameterValue::StringArray(a) => format!(
            "[{}]",
            a.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => format!("{other:?}"),
    }
}

/// The range cell of docs/parameters.md: the names of a choice, or the range as code.
fn range_cell(kind: &Kind) -> String {
    match kind {
        Kind::Choice(names) => names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", "),
        other => other.range().map(|r| format!("`{r}`")).unwrap_or_default(),
    }
}

/// The table, header included.
pub fn table() -> String {
    let mut out = String::from(
        "| parameter | default | range | meaning | a new value applies |\n|---|---|---|---|---|\n",
    );
    for spec in SPECS {
        let applies = match spec.apply {
            Apply::Restart => "restart",
            Apply::NextAsk => "next ask",
            Apply::Configure => "restart or configure",
        };
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "| `{}` | `{}` | {} | {} | {applies} |",
            spec.name,
            spelled(&(spec.default)()),
            range_cell(&spec.kind),
            spec.description,
        );
    }
    out
}

#[test]
fn the_parameter_table_is_rendered_from_the_declarations() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/parameters.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc
        .find(BEGIN)
        .expect("docs/parameters.md lacks the table's first line")
        + BEGIN.len();
    let end = start
        + doc[start..]
            .find(END)
            .expect("docs/parameters.md lacks the table's last line");
    let want = table();
    if doc[start..end] == want {
        return;
    }
    if std::env::var_os("BPU_VLM_WRITE_PARAM_TABLE").is_some() {
        let rewritten = format!("{}{want}{}", &doc[..start], &doc[end..]);
        std::fs::write(&path, rewritten).unwrap();
        return;
    }
    panic!(
        "docs/parameters.md's parameter table is not the one the declarations in src/ros/params.rs render; \
         rewrite it with BPU_VLM_WRITE_PARAM_TABLE=1 cargo test -p bpu_vlm --lib params::table\n\
         want:\n{want}"
    );
}
