//! `context-proxy check-config` and the environment overrides, through the real binary: the
//! effective configuration printed with secrets masked, every wrong key or value named with
//! what is allowed, and `CONTEXT_PROXY_<SECTION>__<KEY>` winning over the file.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

fn check(text: &str, env: &[(&str, &str)]) -> (Output, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .arg("check-config")
        .arg(&path)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

#[test]
fn the_effective_config_is_printed_with_overrides_and_secrets_masked() {
    let (out, stdout, stderr) = check(
        "[context]\nmode = \"auto\"\n[store]\nbackend = \"memory\"\nredis_url = \"redis://:hunter2@db:6379\"\n",
        &[
            ("CONTEXT_PROXY_CONTEXT__MODE", "off"),
            ("CONTEXT_PROXY_CONTEXT__KEEP_RECENT_MESSAGES", "9"),
        ],
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("mode = \"off\""), "{stdout}");
    assert!(stdout.contains("keep_recent_messages = 9"), "{stdout}");
    assert!(stdout.contains("CONTEXT_PROXY_CONTEXT__MODE"), "{stdout}");
    assert!(!stdout.contains("hunter2"), "{stdout}");
}

/// What `check-config` prints can be used as a config file: checked again, it prints the same.
#[test]
fn the_printed_configuration_is_a_config_file_of_the_same_configuration() {
    let (out, stdout, stderr) = check(
        "[[upstreams]]\nname = \"main\"\nbase_url = \"http://a/v1\"\n\
         [[upstreams]]\nname = \"cheap\"\nbase_url = \"http://b/v1\"\nmodels = [\"mini-*\"]\n\
         [context]\nmode = \"compress\"\n[context.summarizer]\nenabled = true\nupstream = \"cheap\"\n\
         [store]\nbackend = \"memory\"\n",
        &[("CONTEXT_PROXY_CONTEXT__KEEP_RECENT_MESSAGES", "9")],
    );
    assert!(out.status.success(), "{stderr}");
    let body = |report: &str| report[report.find("\n\n").unwrap() + 2..].to_string();
    let printed = body(&stdout);
    let (out, again, stderr) = check(&printed, &[]);
    assert!(out.status.success(), "{stderr}\n{printed}");
    assert_eq!(body(&again), printed);
    assert!(printed.contains("keep_recent_messages = 9"), "{printed}");
    assert!(printed.contains("upstream = \"cheap\""), "{printed}");
    // Every default is there.
    assert!(printed.contains("max_connections = 10000"), "{printed}");
}

#[test]
fn every_wrong_key_or_value_is_named_with_what_is_allowed() {
    for (text, env, expected) in [
        (
            "[context]\nmode = \"sideways\"\n",
            vec![],
            vec!["mode", "compact"],
        ),
        (
            "[store]\nbakend = \"fs\"\n",
            vec![],
            vec!["bakend", "backend"],
        ),
        (
            "[context]\ntrigger_ratio = 2.0\n",
            vec![],
            vec!["trigger_ratio"],
        ),
        (
            "[server]\nmax_connections = 0\n",
            vec![],
            vec!["server.max_connections"],
        ),
        (
            "[upstream]\napi_key_env = \"CP_CHECK_KEY\"\n",
            vec![("CP_CHECK_KEY", "sk-x")],
            vec!["open_relay"],
        ),
        (
            "[[upstreams]]\nname = \"main\"\nbase_url = \"http://a/v1\"\n\
             [[upstreams]]\nname = \"cheap\"\nbase_url = \"http://b/v1\"\n\
             [context.summarizer]\nenabled = true\nupstream = \"chaep\"\n",
            vec![],
            vec!["context.summarizer.upstream", "chaep", "cheap, main"],
        ),
        (
            "",
            vec![("CONTEXT_PROXY_STORE__BACKEND", "floppy")],
            vec!["CONTEXT_PROXY_STORE__BACKEND", "memory", "redis"],
        ),
    ] {
        let (out, _, stderr) = check(text, &env);
        assert!(!out.status.success(), "{text} was accepted");
        for word in expected {
            assert!(
                stderr.contains(word),
                "{word} missing for {text:?}: {stderr}"
            );
        }
    }
}

#[test]
fn the_server_reads_the_overrides_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:1\"\n[store]\nbackend = \"memory\"\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .arg("--config")
        .arg(&path)
        .env("CONTEXT_PROXY_SERVER__LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    // Port 0 from the environment, not port 1 from the file.
    assert!(first.contains("listening on http://127.0.0.1:"), "{first}");
    assert!(!first.trim_end().ends_with(":1"), "{first}");
}

/// A base URL without a version path (`http://host:port`, where Ollama-style servers want
/// `http://host:port/v1`) is accepted, with a warning in `check-config` and at start-up.
#[test]
fn a_base_url_without_a_version_path_is_warned_about() {
    let (out, stdout, stderr) = check(
        "[upstream]\nbase_url = \"http://127.0.0.1:11434\"\n[store]\nbackend = \"memory\"\n",
        &[],
    );
    assert!(out.status.success(), "{stderr}");
    let header = &stdout[..stdout.find("\n\n").unwrap()];
    assert!(
        header.contains("# warning: upstreams[0] (default).base_url \"http://127.0.0.1:11434\" has no version path segment"),
        "{stdout}"
    );
    assert!(header.contains("http://127.0.0.1:11434/v1?"), "{stdout}");
    let (_, fine, _) = check(
        "[upstream]\nbase_url = \"http://127.0.0.1:11434/v1\"\n[store]\nbackend = \"memory\"\n",
        &[],
    );
    assert!(!fine.contains("warning"), "{fine}");

    // The server starts, and says so on stderr before it listens.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        "[server]\ndrain_window_ms = 0\n[store]\nbackend = \"memory\"\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .arg("--config")
        .arg(&path)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("listening on http://"), "{first}");
    // SIGTERM: the proxy exits cleanly, flushing its log writer.
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(child.wait().unwrap().success());
    let mut logs = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut logs).unwrap();
    let line = logs
        .lines()
        .find(|l| l.contains("no version path segment"))
        .unwrap_or_else(|| panic!("no warning in:\n{logs}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("http://127.0.0.1:9/v1?"), "{line}");
}
