//! `context-proxy --demo` through the real binary, as a new user runs it: it listens, shows a
//! scripted long session being managed (the headers of every request, some rewritten), says
//! where to look next (the page too), and every command it prints works while it keeps
//! serving.

mod common;

use std::time::Duration;

use common::WAIT;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

/// Longest the scripted session may take in a debug build.
const SESSION_TIME: Duration = Duration::from_secs(120);

#[tokio::test]
async fn the_demo_shows_a_managed_session_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndrain_window_ms = 0\n[store]\nbackend = \"fs\"\npath = {:?}\nfsync = false\n",
            dir.path().join("data").display().to_string()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args(["--demo", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env("CONTEXT_PROXY_UI__ENABLED", "true")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().unwrap();
    let addr = first
        .strip_prefix("context-proxy listening on http://")
        .unwrap_or_else(|| panic!("first line: {first:?}"))
        .to_string();
    let mut shown = Vec::new();
    tokio::time::timeout(SESSION_TIME, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let done = line == "Ctrl-C stops it.";
            shown.push(line);
            if done {
                return;
            }
        }
        panic!("the demo ended early:\n{}", shown.join("\n"));
    })
    .await
    .unwrap_or_else(|_| panic!("the demo did not finish:\n{}", shown.join("\n")));
    let text = shown.join("\n");

    // A line per request: turn, tokens before, tokens after, actions.
    let turns: Vec<(u64, u64, String)> = shown
        .iter()
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            cols.next()?.parse::<usize>().ok()?;
            let n = |s: &str| s.replace(',', "").parse::<u64>().ok();
            let before = n(cols.next()?)?;
            let after = n(cols.next()?)?;
            Some((before, after, cols.next()?.to_string()))
        })
        .collect();
    assert!(turns.len() >= 20, "{text}");
    assert_eq!(turns[0].2, "none", "{text}");
    let rewritten: Vec<_> = turns.iter().filter(|t| t.1 < t.0).collect();
    assert!(
        !rewritten.is_empty(),
        "nothing of the product is visible:\n{text}"
    );
    assert!(
        rewritten.iter().all(|t| t.2 != "none"),
        "a rewritten request says none:\n{text}"
    );
    assert!(text.contains("x-context-tokens-before"), "{text}");
    assert!(text.contains("fewer"), "{text}");

    // Every command it printed works while the proxy keeps serving.
    let client = reqwest::Client::new();
    assert!(text.contains(&format!(
        "curl -s http://{addr}/v1/context/sessions/demo -H 'authorization: Bearer sk-demo'"
    )));
    let detail: Value = client
        .get(format!("http://{addr}/v1/context/sessions/demo"))
        .header("authorization", "Bearer sk-demo")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(detail["id"], "demo", "{detail}");
    assert!(detail["stored_refs"].as_u64().unwrap() > 0, "{detail}");

    // The page it names shows the session to the key the demo sent.
    assert!(text.contains(&format!(
        "http://{addr}/ui/ in a browser, logged in with sk-demo"
    )));
    let page = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = page
        .post(format!("http://{addr}/ui/login"))
        .header("origin", format!("http://{addr}"))
        .form(&[("key", "sk-demo")])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    let cookie = login.headers()["set-cookie"].to_str().unwrap();
    let list = page
        .get(format!("http://{addr}/ui/"))
        .header("cookie", cookie.split(';').next().unwrap())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(list.contains("s=demo\">demo</a>"), "{list}");

    let inspect = format!("context-proxy --config {} inspect demo", config.display());
    assert!(text.contains(&inspect), "{text}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args(["--config"])
        .arg(&config)
        .args(["inspect", "demo"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(found["data"][0]["id"], "demo");

    // The README's request, as printed (no key at all).
    assert!(text.contains("\"content\":\"hello\""), "{text}");
    let resp = client
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-context-actions"], "none");

    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the demo did not stop")
        .unwrap();
    assert!(status.success(), "{status}");
}
