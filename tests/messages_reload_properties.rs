//! Property test of the proxy's hidden tool rounds on Anthropic Messages, over generated
//! conversations: the model's loop (rounds of the proxy's `context_read` calls, signed thinking
//! in every answer, sometimes a mixed last round that also calls the client's tool) is played
//! out; the client holds the merged messages it was shown (those the proxy kept re-serialized
//! by its SDK: keys reordered; the body pretty-printed); the restore finds every kept record and writes the upstream
//! transcript back into the client's bytes. The result must be exactly the conversation the
//! model had, accepted by the strict mock on a model whose thinking binds the prefix (so every
//! block, signature and the tools are as the model saw them), with pairing valid and the
//! client's breakpoints, no more; sent without the restore, the mock refuses it.

use context_proxy::context::adapter::messages_added::restored;
use context_proxy::mock::rules;
use context_proxy::proxy_tools::hidden::Transcript;
use context_proxy::proxy_tools::hidden_rounds::{key, restorations, shown, Rounds};
use context_proxy::proxy_tools::{messages_definitions, ToolNames};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const MODEL: &str = "claude-opus-5-5";

/// One exchange of the conversation: the rounds of the proxy's calls alone, whether each
/// answer also says something, and whether the last answer calls the client's tool too.
#[derive(Debug, Clone)]
struct Exchange {
    rounds: usize,
    texts: Vec<bool>,
    mixed: bool,
}

fn exchange() -> impl Strategy<Value = Exchange> {
    (
        0usize..3,
        prop::collection::vec(any::<bool>(), 4),
        any::<bool>(),
    )
        .prop_map(|(rounds, texts, mixed)| Exchange {
            rounds,
            texts,
            mixed,
        })
}

fn names() -> ToolNames {
    ToolNames {
        read: "context_read".into(),
        search: "context_search".into(),
    }
}

fn is_proxy(name: &str) -> bool {
    names().tool(name).is_some()
}

/// The request the model answers: the client's tool and the proxy's, a marked system prompt,
/// `messages`.
fn request(messages: &[Value]) -> Value {
    let mut tools = vec![json!({"name": "Bash", "input_schema": {"type": "object"}})];
    tools.extend(messages_definitions(&names()));
    json!({
        "model": MODEL,
        "max_tokens": 1024,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": [{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
        "tools": tools,
        "messages": messages,
    })
}

/// One answer of the model to `upstream`: signed thinking, maybe text, then `calls`.
fn answer(upstream: &[Value], thought: String, text: Option<String>, calls: Vec<Value>) -> Value {
    let mut content = vec![rules::signed_thinking(&request(upstream), &thought)];
    if let Some(text) = text {
        content.push(json!({"type": "text", "text": text}));
    }
    content.extend(calls);
    json!({"role": "assistant", "content": content})
}

fn read(id: &str) -> Value {
    json!({"type": "tool_use", "id": id, "name": "context_read", "input": {"ref": "ctx_abc", "offset": 1}})
}

fn result(id: &str, text: &str) -> Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": text})
}

/// `value` as an SDK may send it back: every object's keys in reverse order.
fn resent(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map.iter().rev() {
                out.insert(k.clone(), resent(v));
            }
            Value::Object(out)
        }
        Value::Array(list) => Value::Array(list.iter().map(resent).collect()),
        other => other.clone(),
    }
}

struct Played {
    /// What the model saw.
    upstream: Vec<Value>,
    /// What the client holds.
    client: Vec<Value>,
    /// What the proxy kept.
    kept: Vec<Rounds>,
}

fn play(exchanges: &[Exchange]) -> Played {
    let task = json!({"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]});
    let mut upstream = vec![task.clone()];
    let mut client = vec![task];
    let mut kept = Vec::new();
    for (e, ex) in exchanges.iter().enumerate() {
        let before = Transcript::of(&client);
        let start = upstream.len();
        let text = |r: usize| ex.texts[r % ex.texts.len()].then(|| format!("step {e}.{r}"));
        for r in 0..ex.rounds {
            let id = format!("toolu_p{e}_{r}");
            let a = answer(
                &upstream,
                format!("read more {e}.{r}"),
                text(r),
                vec![read(&id)],
            );
            upstream.push(a);
            upstream.push(json!({"role": "user", "content": [result(&id, "line 1: x")]}));
        }
        let mut calls = Vec::new();
        let (own, theirs) = (format!("toolu_c{e}"), format!("toolu_q{e}"));
        if ex.mixed {
            calls.push(read(&theirs));
            calls.push(
                json!({"type": "tool_use", "id": own, "name": "Bash", "input": {"command": "ls"}}),
            );
        }
        let last = answer(
            &upstream,
            format!("answer {e}"),
            Some(format!("done {e}")),
            calls,
        );
        upstream.push(last);
        let assistants: Vec<Value> = upstream[start..].to_vec();
        let merged = shown(&assistants, &is_proxy);
        let results = if ex.mixed {
            vec![result(&theirs, "line 2: y")]
        } else {
            Vec::new()
        };
        if ex.rounds > 0 || ex.mixed {
            kept.push(Rounds {
                key: key(before, &merged),
                messages: assistants,
                results: results.clone(),
            });
            // A message the proxy puts back may come as the client's SDK re-serialized it.
            client.push(resent(&merged));
        } else {
            client.push(merged);
        }
        if ex.mixed {
            client.push(json!({"role": "user", "content": [result(&own, "a.rs")]}));
            let mut both = results;
            both.push(result(&own, "a.rs"));
            upstream.push(json!({"role": "user", "content": both}));
        } else {
            let next = json!({"role": "user", "content": format!("next {e}")});
            client.push(next.clone());
            upstream.push(next);
        }
    }
    Played {
        upstream,
        client,
        kept,
    }
}

fn breakpoints(raw: &[u8]) -> usize {
    std::str::from_utf8(raw)
        .unwrap()
        .matches("\"cache_control\"")
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn restored_conversations_are_the_models_and_accepted(
        exchanges in prop::collection::vec(exchange(), 1..4),
    ) {
        let played = play(&exchanges);
        let mut body = request(&played.client);
        // The newest message marked, as Claude Code does.
        if let Some(Value::Array(content)) = body["messages"]
            .as_array_mut()
            .and_then(|m| m.last_mut())
            .and_then(|m| m.get_mut("content"))
        {
            if let Some(Value::Object(block)) = content.last_mut() {
                block.insert("cache_control".into(), json!({"type": "ephemeral"}));
            }
        }
        let raw = serde_json::to_vec_pretty(&body).unwrap();
        let client = body["messages"].as_array().unwrap().clone();
        let found = restorations(&played.kept, &client);
        prop_assert_eq!(found.len(), played.kept.len());
        let out = if found.is_empty() {
            raw.clone()
        } else {
            restored(&raw, &client, &found).unwrap()
        };
        let back: Value = serde_json::from_slice(&out).unwrap();
        let messages = back["messages"].as_array().unwrap();
        // The model's conversation (the client's marker aside).
        let mut unmarked = messages.clone();
        if let Some(Value::Array(content)) = unmarked.last_mut().and_then(|m| m.get_mut("content")) {
            if let Some(Value::Object(block)) = content.last_mut() {
                block.remove("cache_control");
            }
        }
        prop_assert_eq!(&unmarked, &played.upstream);
        prop_assert_eq!(breakpoints(&out), breakpoints(&raw));
        prop_assert!(breakpoints(&out) <= 4);
        if let Err(e) = rules::check_messages(&back) {
            return Err(TestCaseError::fail(format!("refused: {e}")));
        }
        // Without the restore, a merged message with a round in it is refused.
        if exchanges.iter().any(|e| e.rounds > 0) {
            prop_assert!(rules::check_messages(&body).is_err());
        }
    }
}
