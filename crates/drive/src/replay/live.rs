//! Thinking fed back: on a model binding each thinking block to the conversation before it,
//! a recorded session's thinking was signed after the conversation as the recording's
//! upstream saw it, not as this replay's proxy forwards it. A live client sends back the
//! blocks it was answered with; so does the replay: each answer's thinking block replaces the
//! recorded one in the session's later requests (the assistant message it opened), so that a
//! proxy's edits meet the signatures they produced, as with Claude Code.

use std::borrow::Cow;

use serde_json::Value;

/// The thinking blocks a session's answers opened with, by assistant message (0: the first).
#[derive(Debug, Default)]
pub struct LiveThinking {
    blocks: Vec<Option<Value>>,
}

fn assistant_messages(body: &Value) -> impl Iterator<Item = &Value> {
    body.get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
}

impl LiveThinking {
    /// Whether a request of `model` needs it (its signatures bind the prefix).
    pub fn needed(body: &[u8]) -> bool {
        serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|b| b.get("model").and_then(Value::as_str).map(str::to_owned))
            .is_some_and(|m| context_proxy_mock::rules::preserved_thinking(&m))
    }

    /// `body` with each assistant message's opening thinking block replaced by the one its
    /// answer gave, when one was seen; and how many assistant messages it holds (the answer to
    /// it opens the next).
    pub fn apply<'b>(&self, body: &'b bytes::Bytes) -> (Cow<'b, bytes::Bytes>, usize) {
        let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
            return (Cow::Borrowed(body), 0);
        };
        let mut changed = false;
        let mut n = 0;
        if let Some(Value::Array(messages)) = value.get_mut("messages") {
            for message in messages
                .iter_mut()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
            {
                let live = self.blocks.get(n).and_then(Option::as_ref);
                n += 1;
                let (Some(live), Some(Value::Array(content))) = (live, message.get_mut("content"))
                else {
                    continue;
                };
                if let Some(block) = content
                    .iter_mut()
                    .find(|b| b.get("type").and_then(Value::as_str) == Some("thinking"))
                {
                    if block != live {
                        *block = live.clone();
                        changed = true;
                    }
                }
            }
        }
        debug_assert_eq!(n, assistant_messages(&value).count());
        if !changed {
            return (Cow::Borrowed(body), n);
        }
        (Cow::Owned(bytes::Bytes::from(value.to_string())), n)
    }

    /// The answer to a request holding `ordinal` assistant messages opened with `block`.
    pub fn answered(&mut self, ordinal: usize, block: Option<Value>) {
        if self.blocks.len() <= ordinal {
            self.blocks.resize(ordinal + 1, None);
        }
        self.blocks[ordinal] = block;
    }
}

/// The thinking block an Anthropic answer opens with (JSON, or rebuilt from its SSE events).
pub fn answer_thinking(answer: &[u8]) -> Option<Value> {
    if let Ok(json) = serde_json::from_slice::<Value>(answer) {
        let first = json.get("content")?.as_array()?.first()?;
        return (first.get("type")? == "thinking").then(|| first.clone());
    }
    let text = std::str::from_utf8(answer).ok()?;
    let (mut thinking, mut signature, mut index) = (String::new(), String::new(), None);
    for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
        let Ok(event) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        match event.get("type").and_then(Value::as_str) {
            Some("content_block_start")
                if index.is_none() && event["content_block"]["type"] == "thinking" =>
            {
                index = event.get("index").cloned();
            }
            Some("content_block_delta")
                if index.is_some() && event.get("index") == index.as_ref() =>
            {
                let delta = &event["delta"];
                if let Some(t) = delta.get("thinking").and_then(Value::as_str) {
                    thinking.push_str(t);
                }
                if let Some(s) = delta.get("signature").and_then(Value::as_str) {
                    signature.push_str(s);
                }
            }
            _ => {}
        }
    }
    index?;
    Some(serde_json::json!({"type": "thinking", "thinking": thinking, "signature": signature}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_feed_the_later_requests() {
        let sse = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n\
                   event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n\
                   event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqX\"}}\n\n";
        let block = answer_thinking(sse.as_bytes()).unwrap();
        assert_eq!(
            block,
            serde_json::json!({"type":"thinking","thinking":"hm","signature":"EqX"})
        );
        let json = br#"{"content":[{"type":"thinking","thinking":"a","signature":"s"},{"type":"text","text":"x"}]}"#;
        assert_eq!(answer_thinking(json).unwrap()["signature"], "s");
        let mut live = LiveThinking::default();
        let first = bytes::Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"q"}]}"#,
        );
        let (same, n) = live.apply(&first);
        assert!(matches!(same, Cow::Borrowed(_)));
        live.answered(n, Some(block.clone()));
        let second = bytes::Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"old","signature":"o"},{"type":"text","text":"a"}]},{"role":"user","content":"r"}]}"#,
        );
        let (fed, n) = live.apply(&second);
        assert_eq!(n, 1);
        let v: Value = serde_json::from_slice(&fed).unwrap();
        assert_eq!(v["messages"][1]["content"][0], block);
        assert_eq!(v["messages"][1]["content"][1]["text"], "a");
    }
}
