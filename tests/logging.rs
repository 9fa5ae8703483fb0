//! The real binary's logs at info level: one line per request carrying its id, in JSON when
//! configured, and never an API key or a message's content.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use context_proxy::mock::{MockConfig, MockUpstream, Reply};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn info_logs_carry_request_ids_but_no_keys_or_contents() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    mock.push(Reply::text("REPLY-CONTENT-77"));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[log]\nformat = \"json\"\nlevel = \"info\"\n[store]\nbackend = \"memory\"\n[upstream]\nbase_url = \"{}\"\napi_key_env = \"CP_TEST_UPSTREAM_KEY\"\n[[keys]]\nname = \"client-one\"\nsha256 = \"{}\"\n",
            mock.base_url(),
            sha256_hex("sk-CLIENT-SECRET-456")
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args(["--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .env("CP_TEST_UPSTREAM_KEY", "sk-UPSTREAM-SECRET-123")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first.trim().rsplit("http://").next().unwrap().to_string();

    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer sk-CLIENT-SECRET-456")
        .header("x-context-request-id", "req-test-42")
        .json(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "MESSAGE-CONTENT-99"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("REPLY-CONTENT-77"));
    assert_eq!(
        mock.received()[0].headers["authorization"],
        "Bearer sk-UPSTREAM-SECRET-123"
    );
    // A key the proxy does not know: refused, and not logged either.
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer sk-WRONG-KEY-789")
        .json(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(mock.received().len(), 1);

    // SIGTERM: the proxy drains and exits, flushing its log writer.
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "proxy exited with {status}");
    let mut logs = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();

    for secret in [
        "sk-UPSTREAM-SECRET-123",
        "sk-CLIENT-SECRET-456",
        "sk-WRONG-KEY-789",
        "MESSAGE-CONTENT-99",
        "REPLY-CONTENT-77",
    ] {
        assert!(
            !logs.contains(secret),
            "{secret} appears in the logs:\n{logs}"
        );
    }
    let lines: Vec<Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let request_line = lines
        .iter()
        .find(|l| l["message"] == "response" && l["path"] == "/v1/chat/completions")
        .unwrap_or_else(|| panic!("no per-request line in:\n{logs}"));
    assert_eq!(request_line["span"]["id"], "req-test-42", "{request_line}");
    assert_eq!(request_line["status"], 200);
}
