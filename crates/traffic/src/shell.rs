//! What commands print: `cargo test` and `pytest` runs, compiler errors, `ls -la` listings,
//! `rg` results, `git status`/`diff`/`log`, application logs and stack traces.
//!
//! Each function returns the text a run-command tool would capture, sized by its arguments.

use super::code::{self, Lang};
use super::prose;
use super::rng::Rng;
use super::words::{self, put, Instant};

/// About `n` distinct tests of a project (module path and test name), sorted as test runners
/// list them.
pub fn test_names(rng: &mut Rng, lang: Lang, files: &[String], n: usize) -> Vec<String> {
    let mut names: Vec<String> = (0..n)
        .map(|_| {
            let file = rng.pick_ref(files);
            let stem = file
                .rsplit('/')
                .next()
                .unwrap_or(file)
                .trim_end_matches(".rs")
                .trim_end_matches(".py");
            let stem = stem.strip_prefix("test_").unwrap_or(stem);
            match lang {
                Lang::Rust => format!("{stem}::tests::{}", words::fn_name(rng)),
                Lang::Python => format!("tests/test_{stem}.py::test_{}", words::fn_name(rng)),
            }
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A test run over `tests`, each with whether it fails; `log_lines` extra lines of captured
/// output (e.g. `--nocapture` or `-s`) make it large.
pub fn test_run(
    rng: &mut Rng,
    lang: Lang,
    project: &str,
    tests: &[(String, bool)],
    log_lines: usize,
) -> String {
    match lang {
        Lang::Rust => cargo_test(rng, project, tests, log_lines),
        Lang::Python => pytest(rng, project, tests, log_lines),
    }
}

fn failed(tests: &[(String, bool)]) -> impl Iterator<Item = &String> {
    tests.iter().filter(|t| t.1).map(|t| &t.0)
}

fn cargo_test(rng: &mut Rng, project: &str, tests: &[(String, bool)], log_lines: usize) -> String {
    let failures = failed(tests).count();
    let mut s = String::new();
    if rng.chance(60) {
        for _ in 0..rng.between(1, 12) {
            put!(
                &mut s,
                "   Compiling {}-{} v{}.{}.{}\n",
                rng.pick(words::NOUNS),
                rng.pick(words::VERBS),
                rng.below(3),
                rng.below(30),
                rng.below(10)
            );
        }
        put!(
            &mut s,
            "   Compiling {project} v0.1.0 (/workspace/{project})\n"
        );
    }
    put!(
        &mut s,
        "    Finished `test` profile [unoptimized + debuginfo] target(s) in {}.{:02}s\n     Running unittests src/lib.rs (target/debug/deps/{}-{})\n\nrunning {} tests\n",
        rng.between(0, 90),
        rng.below(100),
        project.replace('-', "_"),
        rng.hex(16),
        tests.len()
    );
    let mut at = Instant::random(rng);
    for (t, fails) in tests {
        let ok = if *fails { "FAILED" } else { "ok" };
        put!(&mut s, "test {t} ... {ok}\n");
    }
    for _ in 0..log_lines {
        at = at.plus_ms(rng.below(40));
        s.push_str(&log_line(rng, at));
    }
    if failures > 0 {
        s.push_str("\nfailures:\n\n");
        for t in failed(tests) {
            put!(&mut s, "---- {t} stdout ----\n");
            s.push_str(&rust_panic(rng));
            s.push('\n');
        }
        s.push_str("\nfailures:\n");
        for t in failed(tests) {
            put!(&mut s, "    {t}\n");
        }
    }
    put!(
        &mut s,
        "\ntest result: {}. {} passed; {} failed; {} ignored; 0 measured; 0 filtered out; finished in {}.{:02}s\n",
        if failures > 0 { "FAILED" } else { "ok" },
        tests.len() - failures,
        failures,
        rng.between(0, 3),
        rng.between(0, 40),
        rng.below(100)
    );
    if failures > 0 {
        s.push_str("\nerror: test failed, to rerun pass `--lib`\n");
    }
    s
}

fn pytest(rng: &mut Rng, project: &str, tests: &[(String, bool)], log_lines: usize) -> String {
    let failures = failed(tests).count();
    let mut s = String::from(
        "============================= test session starts ==============================\n",
    );
    put!(
        &mut s,
        "platform linux -- Python 3.{}.{}, pytest-8.{}.{}, pluggy-1.5.0\nrootdir: /workspace/{project}\nconfigfile: pyproject.toml\ncollected {} items\n\n",
        rng.between(10, 12),
        rng.below(10),
        rng.below(4),
        rng.below(5),
        tests.len()
    );
    let mut by_file: Vec<(String, String)> = Vec::new();
    for (t, fails) in tests {
        let file = t.split("::").next().unwrap_or(t).to_string();
        let mark = if *fails {
            "F"
        } else if rng.chance(3) {
            "s"
        } else {
            "."
        };
        match by_file.last_mut() {
            Some((f, marks)) if *f == file => marks.push_str(mark),
            _ => by_file.push((file, mark.to_string())),
        }
    }
    let mut done = 0;
    for (file, marks) in &by_file {
        done += marks.len();
        put!(
            &mut s,
            "{file} {marks:<40} [{:>3}%]\n",
            done * 100 / tests.len().max(1)
        );
    }
    if failures > 0 {
        s.push_str(
            "\n=================================== FAILURES ===================================\n",
        );
        for t in failed(tests) {
            let name = t.rsplit("::").next().unwrap_or(t);
            put!(
                &mut s,
                "_____________________________ {name} _____________________________\n\n"
            );
            s.push_str(&python_traceback(rng));
            if log_lines > 0 {
                s.push_str("----------------------------- Captured log call ------------------------------\n");
                let mut at = Instant::random(rng);
                for _ in 0..log_lines / failures.max(1) {
                    at = at.plus_ms(rng.below(40));
                    s.push_str(&log_line(rng, at));
                }
            }
        }
        s.push_str(
            "=========================== short test summary info ============================\n",
        );
        for t in failed(tests) {
            put!(
                &mut s,
                "FAILED {t} - AssertionError: assert {} == {}\n",
                rng.below(100),
                rng.below(100)
            );
        }
    }
    put!(
        &mut s,
        "========================= {} failed, {} passed in {}.{:02}s =========================\n",
        failures,
        tests.len() - failures,
        rng.between(0, 60),
        rng.below(100)
    );
    s
}

/// A Rust panic message as a failing test prints it.
pub fn rust_panic(rng: &mut Rng) -> String {
    let file = format!("src/{}.rs", words::snake(rng));
    let mut s = format!(
        "\nthread '{}' panicked at {file}:{}:{}:\n",
        words::fn_name(rng),
        rng.between(10, 900),
        rng.between(5, 40)
    );
    if rng.chance(60) {
        put!(
            &mut s,
            "assertion `left == right` failed\n  left: {}\n right: {}\n",
            rng.below(1000),
            rng.below(1000)
        );
    } else {
        put!(
            &mut s,
            "called `Result::unwrap()` on an `Err` value: {}(\"{}\")\n",
            words::camel(rng),
            prose::sentence(rng)
        );
    }
    s.push_str("note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n");
    s
}

/// A Python traceback ending in an assertion or exception.
pub fn python_traceback(rng: &mut Rng) -> String {
    let mut s = String::from("Traceback (most recent call last):\n");
    for _ in 0..rng.between(2, 9) {
        put!(
            &mut s,
            "  File \"/workspace/src/{}.py\", line {}, in {}\n    {}\n",
            words::snake(rng),
            rng.between(5, 800),
            words::fn_name(rng),
            code::statement(rng, Lang::Python)
        );
    }
    put!(
        &mut s,
        "{}Error: {}\n",
        words::camel(rng),
        prose::sentence(rng)
    );
    s
}

/// Compiler output with `errors` errors and some warnings.
pub fn build_errors(rng: &mut Rng, lang: Lang, files: &[String], errors: usize) -> String {
    let mut s = String::new();
    for i in 0..errors + rng.between(0, 3) {
        let file = rng.pick_ref(files);
        let line = rng.between(5, 900);
        let stmt = code::statement(rng, lang);
        match lang {
            Lang::Rust => {
                let (kind, code) = if i < errors {
                    (
                        "error",
                        rng.pick(&[
                            "[E0308]: mismatched types",
                            "[E0425]: cannot find value `x` in this scope",
                            "[E0599]: no method named `len` found for enum `Option`",
                            "[E0382]: borrow of moved value: `state`",
                        ]),
                    )
                } else {
                    ("warning", "unused variable: `tmp`")
                };
                put!(&mut s, "{kind}{code}\n  --> {file}:{line}:{}\n   |\n{line:>3} |     {stmt}\n   |     {}\n\n", rng.between(5, 30), "^".repeat(rng.between(3, 20)));
            }
            Lang::Python => {
                put!(
                    &mut s,
                    "{file}:{line}: error: {}  [{}]\n",
                    prose::sentence(rng),
                    rng.pick(&["arg-type", "attr-defined", "return-value", "union-attr"])
                );
            }
        }
    }
    match lang {
        Lang::Rust => put!(
            &mut s,
            "error: could not compile `app` (lib) due to {errors} previous errors\n"
        ),
        Lang::Python => put!(
            &mut s,
            "Found {errors} errors in {} files (checked {} source files)\n",
            errors.min(files.len()),
            files.len()
        ),
    }
    s
}

/// An application log line at `at`.
pub fn log_line(rng: &mut Rng, at: Instant) -> String {
    let level = rng.pick(&["INFO", "INFO", "INFO", "DEBUG", "DEBUG", "WARN", "ERROR"]);
    match rng.below(3) {
        0 => format!(
            "{} {level:<5} server::http: request completed method={} path=/api/v1/{}/{} status={} latency_ms={}\n",
            at.iso_ms(),
            rng.pick(&["GET", "GET", "POST", "PUT", "DELETE"]),
            rng.pick(words::NOUNS),
            rng.between(1, 99_999),
            rng.pick(&[200, 200, 200, 201, 204, 400, 404, 500]),
            rng.log_uniform(1, 5_000)
        ),
        1 => format!(
            "{} {level:<5} {}::{}: {} {}={}\n",
            at.iso_ms(),
            words::snake(rng),
            words::snake(rng),
            prose::sentence(rng),
            words::snake(rng),
            rng.between(0, 100_000)
        ),
        _ => format!(
            "{} {level:<5} worker{{id={}}}: {} {} in {}ms\n",
            at.iso_ms(),
            rng.below(16),
            rng.pick(words::VERBS),
            words::snake(rng),
            rng.log_uniform(1, 10_000)
        ),
    }
}

/// An application log of about `target` bytes, with an occasional stack trace.
pub fn app_log(rng: &mut Rng, lang: Lang, target: usize) -> String {
    let mut s = String::with_capacity(target + 1024);
    let mut at = Instant::random(rng);
    while s.len() < target {
        at = at.plus_ms(rng.below(2_000));
        s.push_str(&log_line(rng, at));
        if rng.chance(1) {
            match lang {
                Lang::Rust => s.push_str(&rust_panic(rng)),
                Lang::Python => s.push_str(&python_traceback(rng)),
            }
        }
    }
    s
}

/// `ls -la` of a directory holding `entries` (name, is a directory, size in bytes).
pub fn ls_la(rng: &mut Rng, entries: &[(String, bool, usize)]) -> String {
    let mut s = format!("total {}\n", entries.len() * 4 + 8);
    let at = Instant::random(rng);
    put!(
        &mut s,
        "drwxr-xr-x  {} dev dev  4096 {} .\n",
        entries.len() + 2,
        at.ls()
    );
    put!(
        &mut s,
        "drwxr-xr-x  {} dev dev  4096 {} ..\n",
        rng.between(3, 12),
        at.ls()
    );
    for (name, dir, size) in entries {
        let when = at.plus_ms(rng.below(30 * 86_400_000)).ls();
        if *dir {
            put!(
                &mut s,
                "drwxr-xr-x  {} dev dev  4096 {when} {name}\n",
                rng.between(2, 9)
            );
        } else {
            put!(&mut s, "-rw-r--r--  1 dev dev {size:>5} {when} {name}\n");
        }
    }
    s
}

/// `rg -n` output: `hits` matching lines spread over `files`.
pub fn grep(rng: &mut Rng, lang: Lang, files: &[String], pattern: &str, hits: usize) -> String {
    let mut s = String::new();
    for _ in 0..hits {
        let stmt = code::statement(rng, lang);
        put!(
            &mut s,
            "{}:{}:    {} {pattern}\n",
            rng.pick_ref(files),
            rng.between(1, 1500),
            stmt
        );
    }
    s
}

/// `git diff` for `paths`, one or more hunks each.
pub fn git_diff(rng: &mut Rng, lang: Lang, paths: &[String]) -> String {
    let mut s = String::new();
    for path in paths {
        put!(
            &mut s,
            "diff --git a/{path} b/{path}\nindex {}..{} 100644\n--- a/{path}\n+++ b/{path}\n",
            rng.hex(7),
            rng.hex(7)
        );
        for _ in 0..rng.between(1, 4) {
            let at = rng.between(1, 600);
            let (del, add) = (rng.between(0, 6), rng.between(1, 9));
            put!(
                &mut s,
                "@@ -{at},{} +{at},{} @@ {} {}(\n",
                del + 6,
                add + 6,
                match lang {
                    Lang::Rust => "fn",
                    Lang::Python => "def",
                },
                words::fn_name(rng)
            );
            for _ in 0..3 {
                put!(&mut s, "     {}\n", code::statement(rng, lang));
            }
            for _ in 0..del {
                put!(&mut s, "-    {}\n", code::statement(rng, lang));
            }
            for _ in 0..add {
                put!(&mut s, "+    {}\n", code::statement(rng, lang));
            }
            for _ in 0..3 {
                put!(&mut s, "     {}\n", code::statement(rng, lang));
            }
        }
    }
    s
}

/// `git status` with `modified` files and a few untracked ones.
pub fn git_status(rng: &mut Rng, modified: &[String]) -> String {
    let mut s = String::from("On branch ");
    put!(
        &mut s,
        "{}\n",
        rng.pick(&["main", "fix/flaky-test", "feature/streaming", "dev"])
    );
    if modified.is_empty() {
        s.push_str("nothing to commit, working tree clean\n");
        return s;
    }
    s.push_str("Changes not staged for commit:\n  (use \"git add <file>...\" to update what will be committed)\n  (use \"git restore <file>...\" to discard changes in working directory)\n");
    for m in modified {
        put!(&mut s, "\tmodified:   {m}\n");
    }
    if rng.chance(40) {
        put!(&mut s, "\nUntracked files:\n  (use \"git add <file>...\" to include in what will be committed)\n\t{}.tmp\n", words::snake(rng));
    }
    s.push_str("\nno changes added to commit (use \"git add\" and/or \"git commit -a\")\n");
    s
}

/// `git log --oneline -n N`.
pub fn git_log(rng: &mut Rng, n: usize) -> String {
    let mut s = String::new();
    for _ in 0..n {
        let sentence = prose::sentence(rng);
        let subject: String = sentence
            .split(' ')
            .take(rng.between(3, 9))
            .collect::<Vec<_>>()
            .join(" ");
        put!(&mut s, "{} {}\n", rng.hex(7), subject.trim_end_matches('.'));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Vec<String> {
        vec!["src/lib.rs".into(), "src/store.rs".into()]
    }

    #[test]
    fn cargo_test_reports_its_counts() {
        let mut rng = Rng::new(1);
        let names = test_names(&mut rng, Lang::Rust, &files(), 10);
        let tests: Vec<(String, bool)> = names
            .into_iter()
            .enumerate()
            .map(|(i, t)| (t, i == 3 || i == 7))
            .collect();
        let out = test_run(&mut rng, Lang::Rust, "app", &tests, 0);
        assert!(out.contains("running 10 tests"));
        assert!(out.contains("test result: FAILED. 8 passed; 2 failed;"));
        assert_eq!(out.matches(" ... FAILED").count(), 2);
        assert!(out.contains(&format!("test {} ... FAILED", tests[3].0)));
        assert!(out.contains(&format!("---- {} stdout ----", tests[7].0)));
    }

    #[test]
    fn pytest_reports_its_counts() {
        let mut rng = Rng::new(2);
        let names = test_names(&mut rng, Lang::Python, &files(), 7);
        let tests: Vec<(String, bool)> = names
            .into_iter()
            .enumerate()
            .map(|(i, t)| (t, i == 0))
            .collect();
        let out = test_run(&mut rng, Lang::Python, "app", &tests, 30);
        assert!(out.contains("collected 7 items"));
        assert!(out.contains("1 failed, 6 passed"));
        assert!(out.contains("Traceback (most recent call last):"));
    }

    #[test]
    fn logs_reach_their_target() {
        let mut rng = Rng::new(3);
        let log = app_log(&mut rng, Lang::Rust, 50_000);
        assert!(log.len() >= 50_000);
        assert!(log.starts_with("20"), "{}", &log[..40]);
    }
}
