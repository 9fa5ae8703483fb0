//! Source files of a synthetic project: Rust and Python modules with imports, types, documented
//! functions and tests; manifests, lock files and READMEs; and the `cat -n` numbering a
//! read-file tool adds.

use super::prose;
use super::rng::Rng;
use super::words::{self, put};

/// The language of a coding session's project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Rust,
    Python,
}

/// `text` with each line prefixed by its number (from `first`), right-aligned in six columns
/// and followed by a tab, as `cat -n` prints it.
pub fn cat_n(text: &str, first: usize) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for (i, line) in text.lines().enumerate() {
        put!(&mut out, "{:>6}\t{}\n", first + i, line);
    }
    out
}

/// One plausible statement of `lang`, without indentation.
pub fn statement(rng: &mut Rng, lang: Lang) -> String {
    let a = words::snake(rng);
    let b = words::snake(rng);
    let f = words::fn_name(rng);
    match lang {
        Lang::Rust => match rng.below(10) {
            0 => format!("let {a} = self.{b}.{f}(&{})?;", words::snake(rng)),
            1 => format!(
                "let mut {a} = Vec::with_capacity({});",
                rng.between(2, 4096)
            ),
            2 => format!("{a}.push({b}.clone());"),
            3 => format!(
                "tracing::debug!({a} = %{b}, \"{} {}\");",
                words::word(rng),
                words::word(rng)
            ),
            4 => format!("self.{a}.insert({b}.id(), {});", words::snake(rng)),
            5 => format!("let {a} = {f}({b}, {}).await?;", rng.between(0, 64)),
            6 => format!("// {}", prose::sentence(rng)),
            7 => format!("let {a}: usize = {b}.iter().map(|x| x.len()).sum();"),
            8 => format!("{a}.{f}()?;"),
            _ => format!("let {a} = {}::new({b});", words::camel(rng)),
        },
        Lang::Python => match rng.below(10) {
            0 => format!("{a} = self.{b}.{f}({})", words::snake(rng)),
            1 => format!("{a} = []"),
            2 => format!("{a}.append({b})"),
            3 => format!("logger.debug(\"{} %s\", {a})", words::word(rng)),
            4 => format!("self.{a}[{b}.id] = {}", words::snake(rng)),
            5 => format!("{a} = await {f}({b}, timeout={})", rng.between(1, 60)),
            6 => format!("# {}", prose::sentence(rng)),
            7 => format!("{a} = sum(len(x) for x in {b})"),
            8 => format!("{a}.{f}()"),
            _ => format!("{a} = {}({b})", words::camel(rng)),
        },
    }
}

fn rust_body(rng: &mut Rng, out: &mut String, indent: usize, n: usize) {
    let pad = " ".repeat(indent);
    for _ in 0..n {
        match rng.below(12) {
            0 if indent < 16 => {
                put!(
                    out,
                    "{pad}if {}.len() > {} {{\n",
                    words::snake(rng),
                    rng.between(1, 1 << 16)
                );
                let k = rng.between(1, 3);
                rust_body(rng, out, indent + 4, k);
                put!(out, "{pad}}}\n");
            }
            1 if indent < 16 => {
                put!(
                    out,
                    "{pad}for {} in {}.iter() {{\n",
                    words::snake(rng),
                    words::snake(rng)
                );
                let k = rng.between(1, 4);
                rust_body(rng, out, indent + 4, k);
                put!(out, "{pad}}}\n");
            }
            2 if indent < 16 => {
                let v = words::snake(rng);
                put!(out, "{pad}match {v} {{\n");
                put!(out, "{pad}    Some(x) => {}(x),\n", words::fn_name(rng));
                put!(
                    out,
                    "{pad}    None => return Err(Error::Missing(\"{v}\")),\n"
                );
                put!(out, "{pad}}}\n");
            }
            _ => put!(out, "{pad}{}\n", statement(rng, Lang::Rust)),
        }
    }
}

fn python_body(rng: &mut Rng, out: &mut String, indent: usize, n: usize) {
    let pad = " ".repeat(indent);
    for _ in 0..n {
        match rng.below(12) {
            0 if indent < 16 => {
                put!(
                    out,
                    "{pad}if len({}) > {}:\n",
                    words::snake(rng),
                    rng.between(1, 1 << 16)
                );
                let k = rng.between(1, 3);
                python_body(rng, out, indent + 4, k);
            }
            1 if indent < 16 => {
                put!(
                    out,
                    "{pad}for {} in {}:\n",
                    words::snake(rng),
                    words::snake(rng)
                );
                let k = rng.between(1, 4);
                python_body(rng, out, indent + 4, k);
            }
            2 if indent < 16 => {
                put!(
                    out,
                    "{pad}try:\n{pad}    {}\n",
                    statement(rng, Lang::Python)
                );
                put!(out, "{pad}except {}Error as exc:\n", words::camel(rng));
                put!(
                    out,
                    "{pad}    raise {}Error(str(exc)) from exc\n",
                    words::camel(rng)
                );
            }
            _ => put!(out, "{pad}{}\n", statement(rng, Lang::Python)),
        }
    }
}

fn rust_fn(rng: &mut Rng, out: &mut String, indent: usize) {
    let pad = " ".repeat(indent);
    put!(out, "{pad}/// {}\n", prose::sentence(rng));
    if rng.chance(30) {
        put!(out, "{pad}/// {}\n", prose::sentence(rng));
    }
    let asyncness = if rng.chance(25) { "async " } else { "" };
    put!(
        out,
        "{pad}pub {asyncness}fn {}(&self, {}: &{}, {}: usize) -> Result<{}, Error> {{\n",
        words::fn_name(rng),
        words::snake(rng),
        words::camel(rng),
        words::snake(rng),
        words::camel(rng),
    );
    let n = rng.between(2, 14);
    rust_body(rng, out, indent + 4, n);
    put!(out, "{pad}    Ok({})\n{pad}}}\n", words::snake(rng));
}

fn rust_source(rng: &mut Rng, target: usize) -> String {
    let mut s = String::with_capacity(target + 2048);
    put!(
        &mut s,
        "//! {}\n//!\n//! {}\n\n",
        prose::sentence(rng),
        prose::sentence(rng)
    );
    s.push_str("use std::collections::HashMap;\nuse std::sync::Arc;\n\n");
    for _ in 0..rng.between(1, 4) {
        put!(
            &mut s,
            "use crate::{}::{{{}, {}}};\n",
            words::snake(rng),
            words::camel(rng),
            words::camel(rng)
        );
    }
    s.push('\n');
    put!(
        &mut s,
        "const {}: usize = {};\n\n",
        words::snake(rng).to_uppercase(),
        rng.between(8, 1 << 20)
    );
    loop {
        let ty = words::camel(rng);
        put!(
            &mut s,
            "/// {}\n#[derive(Debug, Clone)]\npub struct {ty} {{\n",
            prose::sentence(rng)
        );
        for _ in 0..rng.between(1, 6) {
            put!(
                &mut s,
                "    {}: {},\n",
                words::snake(rng),
                rng.pick(&[
                    "usize",
                    "String",
                    "Vec<u8>",
                    "Option<u64>",
                    "Arc<Store>",
                    "HashMap<String, Entry>"
                ])
            );
        }
        put!(&mut s, "}}\n\nimpl {ty} {{\n");
        for i in 0..rng.between(1, 6) {
            if i > 0 {
                s.push('\n');
            }
            rust_fn(rng, &mut s, 4);
            if s.len() >= target {
                break;
            }
        }
        s.push_str("}\n\n");
        if s.len() >= target {
            break;
        }
    }
    s.push_str("#[cfg(test)]\nmod tests {\n    use super::*;\n");
    for _ in 0..rng.between(1, 4) {
        put!(
            &mut s,
            "\n    #[test]\n    fn {}_{}() {{\n",
            words::fn_name(rng),
            rng.pick(&["works", "fails_cleanly", "round_trips", "is_empty"])
        );
        let n = rng.between(1, 5);
        rust_body(rng, &mut s, 8, n);
        put!(
            &mut s,
            "        assert_eq!({}, {});\n    }}\n",
            words::snake(rng),
            rng.between(0, 100)
        );
    }
    s.push_str("}\n");
    s
}

fn python_source(rng: &mut Rng, target: usize) -> String {
    let mut s = String::with_capacity(target + 2048);
    put!(
        &mut s,
        "\"\"\"{}\n\n{}\n\"\"\"\n\n",
        prose::sentence(rng),
        prose::sentence(rng)
    );
    s.push_str("from __future__ import annotations\n\nimport asyncio\nimport logging\nfrom dataclasses import dataclass, field\n");
    for _ in 0..rng.between(1, 4) {
        put!(
            &mut s,
            "from .{} import {}, {}\n",
            words::snake(rng),
            words::camel(rng),
            words::camel(rng)
        );
    }
    s.push_str("\nlogger = logging.getLogger(__name__)\n\n");
    loop {
        put!(
            &mut s,
            "\n@dataclass\nclass {}:\n    \"\"\"{}\"\"\"\n\n",
            words::camel(rng),
            prose::sentence(rng)
        );
        for _ in 0..rng.between(1, 5) {
            put!(
                &mut s,
                "    {}: {} = {}\n",
                words::snake(rng),
                rng.pick(&["int", "str", "list[str]", "dict[str, Any]", "float | None"]),
                rng.pick(&["0", "\"\"", "field(default_factory=list)", "None"])
            );
        }
        for _ in 0..rng.between(1, 6) {
            let asyncness = if rng.chance(25) { "async " } else { "" };
            put!(
                &mut s,
                "\n    {asyncness}def {}(self, {}: {}, {}: int = {}) -> {}:\n",
                words::fn_name(rng),
                words::snake(rng),
                words::camel(rng),
                words::snake(rng),
                rng.between(0, 100),
                words::camel(rng)
            );
            put!(&mut s, "        \"\"\"{}\"\"\"\n", prose::sentence(rng));
            let n = rng.between(2, 12);
            python_body(rng, &mut s, 8, n);
            put!(&mut s, "        return {}\n", words::snake(rng));
            if s.len() >= target {
                break;
            }
        }
        if s.len() >= target {
            break;
        }
    }
    s
}

/// A lock file (`Cargo.lock` or `poetry.lock`-like) of about `target` bytes: long and repetitive.
pub fn lock_file(rng: &mut Rng, lang: Lang, target: usize) -> String {
    let mut s = String::with_capacity(target + 512);
    match lang {
        Lang::Rust => s.push_str("# This file is automatically @generated by Cargo.\n# It is not intended for manual editing.\nversion = 4\n"),
        Lang::Python => s.push_str("# This file is automatically @generated by Poetry 1.8.3 and should not be changed by hand.\n"),
    }
    while s.len() < target {
        let name = format!("{}-{}", rng.pick(words::NOUNS), rng.pick(words::VERBS));
        let version = format!("{}.{}.{}", rng.below(3), rng.below(40), rng.below(20));
        match lang {
            Lang::Rust => {
                put!(&mut s, "\n[[package]]\nname = \"{name}\"\nversion = \"{version}\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\nchecksum = \"{}\"\n", rng.hex(64));
                if rng.chance(60) {
                    s.push_str("dependencies = [\n");
                    for _ in 0..rng.between(1, 6) {
                        put!(
                            &mut s,
                            " \"{}-{}\",\n",
                            rng.pick(words::NOUNS),
                            rng.pick(words::VERBS)
                        );
                    }
                    s.push_str("]\n");
                }
            }
            Lang::Python => {
                put!(&mut s, "\n[[package]]\nname = \"{name}\"\nversion = \"{version}\"\ndescription = \"{}\"\noptional = false\npython-versions = \">=3.8\"\nfiles = [\n    {{file = \"{name}-{version}-py3-none-any.whl\", hash = \"sha256:{}\"}},\n]\n", prose::sentence(rng).trim_end_matches('.'), rng.hex(64));
            }
        }
    }
    s
}

/// A project manifest (`Cargo.toml` or `pyproject.toml`).
pub fn manifest(rng: &mut Rng, lang: Lang, project: &str) -> String {
    let mut s = String::new();
    match lang {
        Lang::Rust => {
            put!(&mut s, "[package]\nname = \"{project}\"\nversion = \"0.{}.{}\"\nedition = \"2021\"\n\n[dependencies]\n", rng.below(9), rng.below(20));
            for dep in ["serde", "tokio", "anyhow", "tracing", "clap", "reqwest"] {
                if rng.chance(70) {
                    put!(&mut s, "{dep} = \"{}\"\n", rng.between(1, 4));
                }
            }
        }
        Lang::Python => {
            put!(&mut s, "[project]\nname = \"{project}\"\nversion = \"0.{}.{}\"\nrequires-python = \">=3.10\"\ndependencies = [\n", rng.below(9), rng.below(20));
            for dep in [
                "httpx",
                "pydantic",
                "fastapi",
                "sqlalchemy",
                "rich",
                "typer",
            ] {
                if rng.chance(70) {
                    put!(&mut s, "    \"{dep}>={}.0\",\n", rng.between(1, 3));
                }
            }
            s.push_str("]\n\n[tool.pytest.ini_options]\naddopts = \"-q\"\n");
        }
    }
    s
}

/// A README in markdown of about `target` bytes.
pub fn readme(rng: &mut Rng, project: &str, target: usize) -> String {
    let mut s = format!("# {project}\n\n{}\n", prose::paragraph(rng));
    while s.len() < target {
        put!(
            &mut s,
            "\n## {}\n\n{}\n",
            prose::heading(rng),
            prose::paragraph(rng)
        );
        if rng.chance(40) {
            put!(
                &mut s,
                "\n```sh\n{} {}\n```\n",
                rng.pick(&["cargo run --", "python -m", "make", "./scripts/"]),
                words::snake(rng)
            );
        }
        if rng.chance(30) {
            put!(&mut s, "\n{}\n", prose::list(rng));
        }
    }
    s
}

/// A source file of `lang` of about `target` bytes.
pub fn source(rng: &mut Rng, lang: Lang, target: usize) -> String {
    match lang {
        Lang::Rust => rust_source(rng, target),
        Lang::Python => python_source(rng, target),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cat_n_numbers_lines_like_cat() {
        assert_eq!(cat_n("a\n\nb\n", 1), "     1\ta\n     2\t\n     3\tb\n");
        assert_eq!(cat_n("x", 120), "   120\tx\n");
    }

    #[test]
    fn sources_reach_their_target_and_look_like_code() {
        let mut rng = Rng::new(11);
        let rs = source(&mut rng, Lang::Rust, 20_000);
        assert!(rs.len() >= 20_000);
        assert!(rs.contains("pub fn ") && rs.contains("use std::"));
        assert!(rs.ends_with("}\n"));
        let py = source(&mut rng, Lang::Python, 3_000);
        assert!(py.len() >= 3_000);
        assert!(py.contains("def ") && py.contains("import "));
    }

    #[test]
    fn rust_braces_balance() {
        let mut rng = Rng::new(12);
        let rs = source(&mut rng, Lang::Rust, 50_000);
        let open = rs.matches('{').count() - rs.matches("{{").count();
        let close = rs.matches('}').count() - rs.matches("}}").count();
        assert_eq!(open, close);
    }
}
