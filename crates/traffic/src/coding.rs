//! The coding agent: one task per user turn on a synthetic Rust or Python workspace, worked
//! through with long runs of tool calls — reading (sometimes large) files, searching, editing,
//! running tests, builds and git — then a summary.
//!
//! The workspace is consistent within a session: a file read twice shows the same text unless
//! it was edited in between, and test failures go away as edits are made.

use serde_json::json;

use super::chat::{ToolCall, Transcript};
use super::code::{self, Lang};
use super::prose;
use super::records;
use super::rng::{Rng, SizeClass};
use super::shell;
use super::words::{self, put};

/// Models a coding agent is run with.
pub const MODELS: &[&str] = &["gpt-4.1", "gpt-4o", "gpt-4.1-mini"];

/// Sizes of source files in bytes: mostly a few KB, a tail of very large generated modules.
const SOURCE_SIZES: &[SizeClass] = &[
    (15, 150, 1_500),
    (45, 1_500, 10_000),
    (30, 10_000, 40_000),
    (8, 40_000, 120_000),
    (2, 120_000, 320_000),
];

/// Sizes of logs and captured test output.
const LOG_SIZES: &[SizeClass] = &[
    (40, 4_000, 30_000),
    (45, 30_000, 120_000),
    (15, 120_000, 320_000),
];

struct Workspace {
    lang: Lang,
    name: String,
    files: Vec<String>,
    contents: Vec<Option<String>>,
    tests: Vec<String>,
    /// Indices into `tests` of the tests that fail now.
    failing: Vec<usize>,
    read: Vec<usize>,
    modified: Vec<usize>,
    /// What the command tool returns when a command prints nothing.
    empty_output: &'static str,
    /// Whether the command tool appends the exit code.
    exit_codes: bool,
}

/// What the agent runs through `run_command`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Test,
    Build,
    Status,
    Diff,
    Log,
    Find,
    Count,
    TailLog,
    Quiet,
    Issues,
    Tiny,
    Commit,
}

impl Command {
    const ALL: [Command; 12] = [
        Command::Test,
        Command::Build,
        Command::Status,
        Command::Diff,
        Command::Log,
        Command::Find,
        Command::Count,
        Command::TailLog,
        Command::Quiet,
        Command::Issues,
        Command::Tiny,
        Command::Commit,
    ];
}

/// Why the user wrote, which shapes what the agent does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    /// A task: long exploration, edits and test runs.
    Task,
    /// Commit the work: status, diff, commit.
    Commit,
    /// Update the README: read it, edit it.
    Readme,
    /// A question about the work: answered with at most a look at one file.
    Question,
}

impl Workspace {
    fn new(rng: &mut Rng) -> Workspace {
        let lang = if rng.chance(60) {
            Lang::Rust
        } else {
            Lang::Python
        };
        let name = format!("{}-{}", rng.pick(words::NOUNS), rng.pick(words::NOUNS));
        let mut files: Vec<String> = Vec::new();
        let add = |files: &mut Vec<String>, p: String| {
            if !files.contains(&p) {
                files.push(p);
            }
        };
        match lang {
            Lang::Rust => {
                for p in [
                    "Cargo.toml",
                    "Cargo.lock",
                    "README.md",
                    "src/lib.rs",
                    "src/main.rs",
                ] {
                    add(&mut files, p.to_string());
                }
                for _ in 0..rng.between(5, 30) {
                    let p = if rng.chance(30) {
                        format!("src/{}/{}.rs", rng.pick(words::NOUNS), words::snake(rng))
                    } else {
                        format!("src/{}.rs", words::snake(rng))
                    };
                    add(&mut files, p);
                }
                for _ in 0..rng.between(1, 4) {
                    add(&mut files, format!("tests/{}.rs", words::snake(rng)));
                }
            }
            Lang::Python => {
                let pkg = name.replace('-', "_");
                for p in ["pyproject.toml", "poetry.lock", "README.md"] {
                    add(&mut files, p.to_string());
                }
                add(&mut files, format!("src/{pkg}/__init__.py"));
                for _ in 0..rng.between(5, 30) {
                    add(&mut files, format!("src/{pkg}/{}.py", words::snake(rng)));
                }
                for _ in 0..rng.between(1, 6) {
                    add(&mut files, format!("tests/test_{}.py", words::snake(rng)));
                }
            }
        }
        let sources: Vec<String> = files.iter().filter(|f| is_source(f)).cloned().collect();
        let n_tests = rng.log_uniform(12, 400);
        let tests = shell::test_names(rng, lang, &sources, n_tests);
        Workspace {
            lang,
            name,
            contents: vec![None; files.len()],
            files,
            tests,
            failing: Vec::new(),
            read: Vec::new(),
            modified: Vec::new(),
            empty_output: rng.pick(&["", "(no output)", "Command completed with no output."]),
            exit_codes: rng.chance(50),
        }
    }

    /// Makes one to four tests fail (a bug to fix).
    fn break_tests(&mut self, rng: &mut Rng) {
        self.failing.clear();
        for _ in 0..rng.between(1, 4) {
            let t = rng.below(self.tests.len() as u64) as usize;
            if !self.failing.contains(&t) {
                self.failing.push(t);
            }
        }
    }

    fn content(&mut self, rng: &mut Rng, i: usize) -> &str {
        let path = self.files[i].clone();
        let lang = self.lang;
        let name = self.name.clone();
        self.contents[i].get_or_insert_with(|| {
            if path.ends_with(".lock") {
                let target = rng.log_uniform(20_000, 300_000);
                code::lock_file(rng, lang, target)
            } else if path.ends_with("README.md") {
                let target = rng.log_uniform(800, 12_000);
                code::readme(rng, &name, target)
            } else if path.ends_with(".toml") {
                code::manifest(rng, lang, &name)
            } else {
                let target = rng.size(SOURCE_SIZES);
                code::source(rng, lang, target)
            }
        })
    }

    fn sources(&self) -> Vec<String> {
        self.files
            .iter()
            .filter(|f| is_source(f))
            .cloned()
            .collect()
    }

    fn index_of(&self, path: &str) -> Option<usize> {
        self.files.iter().position(|f| f == path)
    }

    /// A file to look at: often one already read, sometimes the lock file.
    fn choose_file(&mut self, rng: &mut Rng) -> usize {
        if !self.read.is_empty() && rng.chance(15) {
            return rng.pick(&self.read);
        }
        let lock = self.files.iter().position(|f| f.ends_with(".lock"));
        match lock {
            Some(i) if rng.chance(3) => i,
            _ => loop {
                let i = rng.below(self.files.len() as u64) as usize;
                if Some(i) != lock {
                    break i;
                }
            },
        }
    }

    fn read_file(&mut self, rng: &mut Rng, i: usize) -> ToolCall {
        if !self.read.contains(&i) {
            self.read.push(i);
        }
        let path = self.files[i].clone();
        let text = self.content(rng, i).to_string();
        let lines = text.lines().count();
        if lines > 1500 && rng.chance(40) {
            let offset = rng.between(1, lines - 200);
            let limit = rng.between(100, 1500);
            let slice: String = text
                .lines()
                .skip(offset - 1)
                .take(limit)
                .flat_map(|l| [l, "\n"])
                .collect();
            let args = json!({"path": path, "offset": offset, "limit": limit});
            return ToolCall::new("read_file", args, code::cat_n(&slice, offset));
        }
        ToolCall::new("read_file", json!({"path": path}), code::cat_n(&text, 1))
    }

    fn search(&mut self, rng: &mut Rng) -> ToolCall {
        let pattern = match rng.below(3) {
            0 => words::fn_name(rng),
            1 => words::camel(rng),
            _ => format!("{}\\(", words::snake(rng)),
        };
        let hits = rng.size(&[(25, 1, 2), (50, 1, 40), (20, 40, 400), (5, 400, 3_000)]) - 1;
        let sources = self.sources();
        let out = if hits == 0 {
            String::new()
        } else {
            shell::grep(rng, self.lang, &sources, &pattern, hits)
        };
        let args = if rng.chance(40) {
            json!({"pattern": pattern, "path": "src"})
        } else {
            json!({"pattern": pattern})
        };
        ToolCall::new("search_code", args, out)
    }

    fn list_dir(&mut self, rng: &mut Rng) -> ToolCall {
        let dir = rng.pick(&["src", "tests", "."]);
        let prefix = if dir == "." {
            String::new()
        } else {
            format!("{dir}/")
        };
        let mut entries: Vec<(String, bool, usize)> = Vec::new();
        for f in &self.files {
            if let Some(rest) = f.strip_prefix(&prefix) {
                let (name, is_dir) = match rest.split_once('/') {
                    Some((d, _)) => (d.to_string(), true),
                    None => (rest.to_string(), false),
                };
                if !entries.iter().any(|e| e.0 == name) {
                    entries.push((name, is_dir, rng.log_uniform(100, 60_000)));
                }
            }
        }
        entries.sort();
        ToolCall::new(
            "list_dir",
            json!({"path": dir}),
            shell::ls_la(rng, &entries),
        )
    }

    /// A file the agent has read to edit, preferring source files.
    fn choose_edit(&mut self, rng: &mut Rng) -> usize {
        let read_sources: Vec<usize> = self
            .read
            .iter()
            .copied()
            .filter(|&i| is_source(&self.files[i]))
            .collect();
        if read_sources.is_empty() {
            let all = self.sources();
            let path = rng.pick_ref(&all).clone();
            self.index_of(&path).unwrap_or(0)
        } else {
            rng.pick(&read_sources)
        }
    }

    fn edit(&mut self, rng: &mut Rng, i: usize) -> ToolCall {
        let path = self.files[i].clone();
        let lang = self.lang;
        let text = self.content(rng, i).to_string();
        let prose_file = path.ends_with(".md");
        let candidates: Vec<&str> = text
            .lines()
            .filter(|l| {
                let l = l.trim();
                l.len() > 12
                    && (prose_file
                        || l.ends_with(';')
                        || (lang == Lang::Python && !l.ends_with(':') && !l.starts_with('"')))
            })
            .collect();
        let old = candidates
            .get(rng.below(candidates.len() as u64) as usize)
            .copied()
            .unwrap_or("")
            .to_string();
        let indent: String = old.chars().take_while(|c| *c == ' ').collect();
        let mut new = String::new();
        if prose_file {
            put!(&mut new, "{old}\n\n{}", prose::paragraph(rng));
        } else {
            for k in 0..rng.between(1, 8) {
                if k > 0 {
                    new.push('\n');
                }
                put!(&mut new, "{indent}{}", code::statement(rng, lang));
            }
        }
        if old.is_empty() || rng.chance(8) {
            let args = json!({"path": path, "old_string": format!("{} ", old.trim_end()), "new_string": new});
            let msg = format!("Error: old_string not found in {path}. Make sure it matches the file exactly, including whitespace.");
            return ToolCall::new("edit_file", args, msg);
        }
        if let Some(slot) = self.contents[i].as_mut() {
            *slot = slot.replacen(&old, &new, 1);
        }
        if !self.modified.contains(&i) {
            self.modified.push(i);
        }
        let result = match rng.below(3) {
            0 => "ok".to_string(),
            1 => format!("The file {path} has been updated."),
            _ => format!(
                "Edited {path}: replaced 1 occurrence ({} lines).",
                new.lines().count()
            ),
        };
        ToolCall::new(
            "edit_file",
            json!({"path": path, "old_string": old, "new_string": new}),
            result,
        )
    }

    fn write(&mut self, rng: &mut Rng) -> ToolCall {
        let path = match self.lang {
            Lang::Rust => format!("tests/{}.rs", words::snake(rng)),
            Lang::Python => format!("tests/test_{}.py", words::snake(rng)),
        };
        let target = rng.log_uniform(300, 6_000);
        let content = code::source(rng, self.lang, target);
        let result = format!("Wrote {} bytes to {path}", content.len());
        let args = json!({"path": path, "content": content});
        match self.index_of(&path) {
            Some(i) => self.contents[i] = Some(content),
            None => {
                self.files.push(path);
                self.contents.push(Some(content));
            }
        }
        let i = self.files.len() - 1;
        if !self.modified.contains(&i) {
            self.modified.push(i);
        }
        ToolCall::new("write_file", args, result)
    }

    fn choose_command(rng: &mut Rng, late: bool) -> Command {
        let weights: [u32; 12] = if late {
            [35, 8, 8, 8, 3, 4, 3, 2, 5, 2, 10, 2]
        } else {
            [8, 4, 10, 2, 6, 10, 6, 4, 6, 2, 6, 0]
        };
        Command::ALL[rng.weighted(&weights)]
    }

    fn modified_paths(&self) -> Vec<String> {
        self.modified
            .iter()
            .map(|&i| self.files[i].clone())
            .collect()
    }

    fn command(&mut self, rng: &mut Rng, which: Command) -> ToolCall {
        let lang = self.lang;
        let (command, output, code) = match which {
            Command::Test => self.test_command(rng),
            Command::Build => {
                let errors = if self.failing.is_empty() {
                    0
                } else {
                    rng.between(0, 6)
                };
                let cmd = match lang {
                    Lang::Rust => "cargo build 2>&1 | tail -n 80",
                    Lang::Python => "mypy src",
                };
                let out = if errors == 0 {
                    match lang {
                        Lang::Rust => format!("   Compiling {} v0.1.0 (/workspace/{})\n    Finished `dev` profile [unoptimized + debuginfo] target(s) in {}.{:02}s\n", self.name, self.name, rng.between(1, 80), rng.below(100)),
                        Lang::Python => format!("Success: no issues found in {} source files\n", self.files.len()),
                    }
                } else {
                    shell::build_errors(rng, lang, &self.sources(), errors)
                };
                (cmd.to_string(), out, u8::from(errors > 0))
            }
            Command::Status => (
                "git status".to_string(),
                shell::git_status(rng, &self.modified_paths()),
                0,
            ),
            Command::Diff => (
                "git diff".to_string(),
                shell::git_diff(rng, lang, &self.modified_paths()),
                0,
            ),
            Command::Log => {
                let n = rng.between(5, 40);
                (
                    format!("git log --oneline -n {n}"),
                    shell::git_log(rng, n),
                    0,
                )
            }
            Command::Find => {
                let ext = match lang {
                    Lang::Rust => "rs",
                    Lang::Python => "py",
                };
                let mut out = String::new();
                for f in self.files.iter().filter(|f| f.ends_with(ext)) {
                    put!(&mut out, "./{f}\n");
                }
                (
                    format!("find . -name '*.{ext}' -not -path './target/*'"),
                    out,
                    0,
                )
            }
            Command::Count => {
                let i = self.choose_file(rng);
                let path = self.files[i].clone();
                let lines = self.content(rng, i).lines().count();
                (format!("wc -l {path}"), format!("{lines:>6} {path}\n"), 0)
            }
            Command::TailLog => {
                let target = rng.size(LOG_SIZES);
                let n = target / 110;
                (
                    format!("tail -n {n} logs/app.log"),
                    shell::app_log(rng, lang, target),
                    0,
                )
            }
            Command::Quiet => {
                let formatter = match lang {
                    Lang::Rust => "cargo fmt",
                    Lang::Python => "ruff format src",
                };
                let cmd = rng.pick(&[
                    "mkdir -p tmp",
                    formatter,
                    "touch .env",
                    "git stash list",
                    "git add -A",
                ]);
                (cmd.to_string(), self.empty_output.to_string(), 0)
            }
            Command::Issues => {
                let target = rng.log_uniform(3_000, 150_000);
                let repo = format!("acme/{}", self.name);
                (
                    format!("curl -s 'https://api.github.com/repos/{repo}/issues?per_page=100'"),
                    records::issue_list(rng, &repo, target),
                    0,
                )
            }
            Command::Tiny => {
                let (cmd, out) = rng.pick(&[
                    ("echo $?", "0"),
                    (
                        "python -c \"import sys; print(sys.version_info[:2])\"",
                        "(3, 11)\n",
                    ),
                    ("which rg", "/usr/bin/rg\n"),
                    ("cat .nvmrc", "v20.11.1\n"),
                    ("git rev-parse --abbrev-ref HEAD", "main\n"),
                ]);
                (cmd.to_string(), out.to_string(), 0)
            }
            Command::Commit => {
                let subject = prose::sentence(rng);
                let subject = subject.trim_end_matches('.');
                let files = self.modified.len().max(1);
                let out = format!("[main {}] {subject}\n {files} file{} changed, {} insertions(+), {} deletions(-)\n", rng.hex(7), if files == 1 { "" } else { "s" }, rng.between(1, 300), rng.between(0, 120));
                self.modified.clear();
                (format!("git commit -am \"{subject}\""), out, 0)
            }
        };
        let mut output = output;
        if self.exit_codes {
            if !output.is_empty() && !output.ends_with('\n') {
                output.push('\n');
            }
            put!(&mut output, "[exit code: {code}]");
        }
        let args = if rng.chance(20) {
            json!({"command": command, "timeout_ms": 120_000})
        } else {
            json!({"command": command})
        };
        ToolCall::new("run_command", args, output)
    }

    fn test_command(&mut self, rng: &mut Rng) -> (String, String, u8) {
        if !self.modified.is_empty() && !self.failing.is_empty() && rng.chance(40) {
            self.failing.pop();
        }
        let verbose = rng.chance(15);
        let log_lines = if verbose {
            rng.size(LOG_SIZES) / 110
        } else {
            0
        };
        let subset = rng.chance(35);
        let range = if subset {
            let n = rng.between(1, 12).min(self.tests.len());
            let start = match self.failing.first() {
                Some(&f) if rng.chance(70) => f.saturating_sub(rng.below(n as u64) as usize),
                _ => rng.below((self.tests.len() - n + 1) as u64) as usize,
            };
            start..(start + n).min(self.tests.len())
        } else {
            0..self.tests.len()
        };
        let tests: Vec<(String, bool)> = range
            .map(|i| (self.tests[i].clone(), self.failing.contains(&i)))
            .collect();
        let fails = tests.iter().any(|t| t.1);
        let filter = tests
            .first()
            .and_then(|t| t.0.split("::").next())
            .unwrap_or("")
            .to_string();
        let cmd = match (self.lang, subset, verbose) {
            (Lang::Rust, false, false) => "cargo test".to_string(),
            (Lang::Rust, false, true) => "cargo test -- --nocapture".to_string(),
            (Lang::Rust, true, false) => format!("cargo test {filter}"),
            (Lang::Rust, true, true) => format!("cargo test {filter} -- --nocapture"),
            (Lang::Python, false, false) => "pytest -q".to_string(),
            (Lang::Python, false, true) => "pytest -s -q".to_string(),
            (Lang::Python, true, false) => format!("pytest {filter}"),
            (Lang::Python, true, true) => format!("pytest -s {filter}"),
        };
        let out = shell::test_run(rng, self.lang, &self.name, &tests, log_lines);
        (cmd, out, u8::from(fails))
    }

    /// One tool call suited to how far into the task the agent is.
    fn step(&mut self, rng: &mut Rng, late: bool) -> ToolCall {
        let weights: &[u32] = if late {
            &[25, 8, 2, 35, 25, 5]
        } else {
            &[40, 20, 12, 25, 3, 0]
        };
        match rng.weighted(weights) {
            0 => {
                let i = self.choose_file(rng);
                self.read_file(rng, i)
            }
            1 => self.search(rng),
            2 => self.list_dir(rng),
            3 => {
                let which = Workspace::choose_command(rng, late);
                self.command(rng, which)
            }
            4 => {
                let i = self.choose_edit(rng);
                self.edit(rng, i)
            }
            _ => self.write(rng),
        }
    }

    /// The tool rounds for a user turn of `intent`, at most `budget` of them.
    fn work(&mut self, rng: &mut Rng, t: &mut Transcript, intent: Intent, budget: usize) {
        let rounds: Vec<Vec<ToolCall>> = match intent {
            Intent::Commit => [Command::Status, Command::Diff, Command::Commit]
                .into_iter()
                .take(budget)
                .map(|c| vec![self.command(rng, c)])
                .collect(),
            Intent::Readme => {
                let readme = self.index_of("README.md").unwrap_or(0);
                let mut rounds = vec![
                    vec![self.read_file(rng, readme)],
                    vec![self.edit(rng, readme)],
                ];
                rounds.truncate(budget);
                rounds
            }
            Intent::Question => {
                if budget > 0 && rng.chance(50) {
                    let i = self.choose_file(rng);
                    vec![vec![self.read_file(rng, i)]]
                } else {
                    Vec::new()
                }
            }
            Intent::Task => {
                let steps = rng
                    .size(&[(30, 1, 6), (45, 6, 30), (25, 30, 120)])
                    .min(budget);
                let mut rounds = Vec::with_capacity(steps);
                for s in 0..steps {
                    let late = s * 3 >= steps;
                    let parallel = if !late && rng.chance(30) {
                        rng.between(2, 4)
                    } else {
                        1
                    };
                    let calls = if parallel > 1 {
                        let mut files: Vec<usize> = Vec::with_capacity(parallel);
                        for _ in 0..parallel {
                            let i = self.choose_file(rng);
                            if !files.contains(&i) {
                                files.push(i);
                            }
                        }
                        files.into_iter().map(|i| self.read_file(rng, i)).collect()
                    } else {
                        vec![self.step(rng, late)]
                    };
                    rounds.push(calls);
                }
                rounds
            }
        };
        for calls in rounds {
            let text = if rng.chance(12) {
                Some(note(rng, &calls[0]))
            } else {
                None
            };
            t.act(rng, text, calls);
        }
    }
}

fn is_source(path: &str) -> bool {
    path.ends_with(".rs") || path.ends_with(".py")
}

fn system_prompt(rng: &mut Rng, ws: &Workspace) -> String {
    let mut s = String::from("You are a coding agent working in a software repository on the user's machine. You can read files, search the code, edit files and run commands through the tools you are given.\n\n# Rules\n");
    let rules = [
        "Read the relevant code before you change it; never guess at the contents of a file.",
        "Prefer small, focused edits. Keep the existing style and public API unless asked.",
        "Run the tests after every change that could affect them, and read failures carefully.",
        "Do not run commands that need network access or that could destroy data.",
        "When you are done, summarize what you changed and why in a few short paragraphs.",
        "If a command fails, look at its output before trying again; do not repeat the same command blindly.",
        "Use the search tool instead of reading many files one by one when looking for a symbol.",
    ];
    for r in rules {
        put!(&mut s, "- {r}\n");
    }
    put!(
        &mut s,
        "\n# Environment\n- Working directory: /workspace/{}\n- Platform: linux\n- Shell: bash\n- Language: {}\n- Today's date: {}\n",
        ws.name,
        match ws.lang {
            Lang::Rust => "Rust (cargo)",
            Lang::Python => "Python 3.11 (pytest)",
        },
        words::Instant::random(rng).date()
    );
    if rng.chance(50) {
        s.push_str("\n# Project layout\n");
        for f in &ws.files {
            put!(&mut s, "{f}\n");
        }
    }
    s
}

/// A new task; may break tests, which the task then names.
fn task(rng: &mut Rng, ws: &mut Workspace) -> String {
    let sources = ws.sources();
    let file = rng.pick_ref(&sources).clone();
    match rng.below(6) {
        0 => {
            ws.break_tests(rng);
            let test = ws.tests[ws.failing[0]].clone();
            format!("The test `{test}` started failing after my last change. Can you find out why and fix it?")
        }
        1 => format!("Add a `--{}` option to the CLI. {}", words::snake(rng).replace('_', "-"), prose::sentence(rng)),
        2 => format!("Refactor `{file}` so that `{}` no longer reads the whole {} into memory. Keep the public API the same.", words::fn_name(rng), rng.pick(words::NOUNS)),
        3 => {
            ws.break_tests(rng);
            format!("Users report this: \"{}\" Please investigate, fix it, and add a regression test.", prose::sentence(rng))
        }
        4 => {
            ws.break_tests(rng);
            format!("{}\n\nHere is what I see when I run the tests:\n```\n{}```", prose::sentence(rng), shell::rust_panic(rng))
        }
        _ => format!("Can you review `{file}` and clean it up? {}", prose::sentence(rng)),
    }
}

fn follow_up(rng: &mut Rng, ws: &mut Workspace) -> (String, Intent) {
    match rng.weighted(&[12, 16, 12, 15, 10, 10, 25]) {
        0 => (
            "Thanks. Can you also update the README to mention this?".to_string(),
            Intent::Readme,
        ),
        1 => {
            ws.break_tests(rng);
            let errors = rng.between(1, 8);
            let log = shell::build_errors(rng, ws.lang, &ws.sources(), errors);
            (format!("CI is still red:\n```\n{log}```"), Intent::Task)
        }
        2 => (
            rng.pick(&["ok", "thanks!", "nice"]).to_string(),
            Intent::Question,
        ),
        3 => ("Looks good, please commit it.".to_string(), Intent::Commit),
        4 => (
            format!(
                "Why did you change `{}`? {}",
                words::fn_name(rng),
                prose::sentence(rng)
            ),
            Intent::Question,
        ),
        5 => {
            ws.break_tests(rng);
            let target = rng.log_uniform(2_000, 40_000);
            (
                format!(
                    "The nightly job failed with this log, can you take a look?\n\n{}",
                    shell::app_log(rng, ws.lang, target)
                ),
                Intent::Task,
            )
        }
        _ => (task(rng, ws), Intent::Task),
    }
}

fn summary(rng: &mut Rng, ws: &Workspace, intent: Intent) -> String {
    let n = rng.between(1, 3);
    let mut s = prose::sentences(rng, n);
    match intent {
        Intent::Question => return s,
        Intent::Commit => {
            put!(&mut s, "\n\nCommitted on `main`.");
            return s;
        }
        Intent::Readme | Intent::Task => {}
    }
    if !ws.modified.is_empty() {
        s.push_str("\n\nChanges:\n");
        for &i in ws.modified.iter().take(6) {
            put!(&mut s, "- `{}`: {}\n", ws.files[i], prose::sentence(rng));
        }
    }
    if ws.failing.is_empty() {
        put!(&mut s, "\nAll {} tests pass.", ws.tests.len());
    } else {
        put!(
            &mut s,
            "\n{} tests still fail; {}",
            ws.failing.len(),
            prose::sentence(rng)
        );
    }
    s
}

fn note(rng: &mut Rng, call: &ToolCall) -> String {
    let what = call
        .arguments
        .get("path")
        .or_else(|| call.arguments.get("command"))
        .or_else(|| call.arguments.get("pattern"));
    match what.and_then(|v| v.as_str()) {
        Some(w) => format!("Let me check `{w}`. {}", prose::sentence(rng)),
        None => prose::sentence(rng),
    }
}

/// Writes a coding session of exactly `requests` requests into `t`.
pub fn run(rng: &mut Rng, t: &mut Transcript, requests: usize) {
    let mut ws = Workspace::new(rng);
    t.system(system_prompt(rng, &ws));
    if rng.chance(30) {
        t.developer(format!(
            "# AGENTS.md\n\n{}\n\n{}",
            prose::list(rng),
            prose::paragraph(rng)
        ));
    }
    let mut first = true;
    while t.requests() < requests {
        let (text, intent) = if first {
            (task(rng, &mut ws), Intent::Task)
        } else {
            follow_up(rng, &mut ws)
        };
        first = false;
        t.user(text);
        let budget = requests - t.requests() - 1;
        ws.work(rng, t, intent, budget);
        t.reply(summary(rng, &ws, intent));
    }
}
