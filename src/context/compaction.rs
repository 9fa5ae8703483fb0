//! Compaction the way the Responses API asks for it (`POST /v1/responses/compact`, or a
//! request whose final input item is `{"type":"compaction_trigger"}`; `docs/responses-wire.md`),
//! made by the proxy: the summary is the summarizer's, and the `compaction` item the client gets
//! is sealed by the proxy. When that item comes back as input, [`expand`] puts the summary
//! message in its place before the request goes on, so any Responses upstream serves it.
//!
//! The seal: `encrypted_content` is [`SEAL_PREFIX`] and the reference of a record in the store.
//! The record holds the summary and the message standing for it; its reference is the SHA-256
//! of its bytes, so a changed byte names nothing (tamper-evident), and the store answers a
//! reference only to the tenant that stored it (tenant-bound). It is no encryption: the summary
//! is the proxy's, readable in its store. A `compaction` item the proxy did not seal (OpenAI's
//! own) is never touched.
//!
//! When no summary can be had (no summarizer, its failure or timeout), the item is sealed all
//! the same around the marker alone ([`seal`] with no summary): the originals are stored and
//! readable with `context_read`, as after a move-out, so an upstream without compaction never
//! sees the trigger.
//!
//! This module decides and builds; the route asks the summarizer and answers.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::adapter::responses::item_type;
use super::adapter::{Adapter, Responses};
use super::markers::{self, Readback};
use super::session::Identity;
use crate::store::{ContentKind, ContentRef, Store, StoreError, Tenant};

/// What opens the `encrypted_content` of a compaction item the proxy sealed.
pub const SEAL_PREFIX: &str = "context-proxy.compaction.v1:";

/// The type of the input item asking for a compaction.
pub const TRIGGER: &str = "compaction_trigger";

/// Whether `body` asks for a compaction through its input: `Ok(true)` when its final input item
/// is the one `compaction_trigger`; an error naming the item when a trigger stands elsewhere or
/// twice (the API's rule: "Must be the final input item").
pub fn trigger(body: &Value) -> Result<bool, String> {
    let Some(items) = body.get("input").and_then(Value::as_array) else {
        return Ok(false);
    };
    let at: Vec<usize> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| item_type(item) == Some(TRIGGER))
        .map(|(i, _)| i)
        .collect();
    match at.as_slice() {
        [] => Ok(false),
        [i] if *i + 1 == items.len() => Ok(true),
        [i] => Err(format!(
            "input[{i}] is a `compaction_trigger`, which must be the final input item \
             (the input has {} items): move it to the end",
            items.len()
        )),
        [_, second, ..] => Err(format!(
            "input holds {} `compaction_trigger` items (the second is input[{second}]): send \
             exactly one, as the final input item",
            at.len()
        )),
    }
}

/// The record a sealed item names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Always [`RECORD_KIND`]: a reference to any other stored content is no compaction.
    pub kind: String,
    /// What the next compaction merges as its previous summary: the summary as the summarizer
    /// wrote it, or, for an item sealed without one, the text of its message (the marker, and
    /// the summary before it), so that no marker is lost.
    pub summary: String,
    /// The input item standing for what was compacted (a user message: marker and summary).
    pub message: Value,
}

/// The `kind` of a compaction record.
pub const RECORD_KIND: &str = "context-proxy.compaction";

/// The text standing for a compacted span: the marker naming the stored originals
/// (`transcript`, `items` items of `tokens` tokens), then the summary when there is one.
pub fn message_text(
    summary: Option<&str>,
    transcript: &ContentRef,
    items: usize,
    tokens: usize,
) -> String {
    let marker = markers::offloaded(items, tokens, transcript, &Readback::default());
    match summary {
        Some(summary) => super::summary::message_text(&marker, summary),
        None => marker,
    }
}

/// The input item carrying `text`: a user message (the role a move-out's marker has).
fn message(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// The compaction item sealing `reference` (a stored [`Record`]).
pub fn sealed_item(reference: &ContentRef) -> Value {
    let digest = Sha256::digest(reference.as_str().as_bytes());
    let id: String = digest[..24].iter().map(|b| format!("{b:02x}")).collect();
    json!({
        "type": "compaction",
        "id": format!("cmp_{id}"),
        "encrypted_content": format!("{SEAL_PREFIX}{reference}"),
    })
}

/// The reference a compaction item names when the proxy sealed it: `None` for any other item
/// (another maker's compaction among them), `Some(Err)` for a seal that names no valid
/// reference.
pub fn seal_of(item: &Value) -> Option<Result<ContentRef, String>> {
    if item_type(item) != Some("compaction") {
        return None;
    }
    let sealed = item
        .get("encrypted_content")?
        .as_str()?
        .strip_prefix(SEAL_PREFIX)?;
    Some(ContentRef::parse(sealed).map_err(|e| e.to_string()))
}

/// Why a sealed item cannot be expanded.
#[derive(Debug, thiserror::Error)]
pub enum ExpandError {
    /// Not a record of this tenant's (changed, expired, another tenant's, or no compaction).
    #[error(
        "input[{index}] is a compaction item sealed by context-proxy that it cannot open \
         (changed, expired from its store, or made for another API key): compact the \
         conversation again from its full history"
    )]
    Unknown { index: usize },
    #[error("the context store cannot be read: {0}")]
    Store(#[from] StoreError),
}

/// The proxy's sealed items of `body`'s input, with their records, in input order.
pub async fn records(
    store: &dyn Store,
    tenant: &Tenant,
    body: &Value,
) -> Result<Vec<(usize, Record)>, ExpandError> {
    let Some(items) = body.get("input").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let Some(seal) = seal_of(item) else { continue };
        let reference = seal.map_err(|_| ExpandError::Unknown { index })?;
        let record = store
            .get_content(tenant, &reference)
            .await?
            .and_then(|text| serde_json::from_str::<Record>(&text).ok())
            .filter(|r| r.kind == RECORD_KIND)
            .ok_or(ExpandError::Unknown { index })?;
        found.push((index, record));
    }
    Ok(found)
}

/// The stored content `records`' messages name (the originals behind their markers), each once:
/// what the proxy's tools are offered for once the items are expanded.
pub fn named_refs(records: &[(usize, Record)]) -> Vec<ContentRef> {
    let mut refs: Vec<ContentRef> = Vec::new();
    for (_, record) in records {
        let text = record.message.to_string();
        let words = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        for reference in words.filter_map(|w| ContentRef::parse(w).ok()) {
            if !refs.contains(&reference) {
                refs.push(reference);
            }
        }
    }
    refs
}

/// Puts each record's message in place of its sealed item; the number replaced.
pub fn expand(body: &mut Value, records: &[(usize, Record)]) -> usize {
    let Some(items) = body.get_mut("input").and_then(Value::as_array_mut) else {
        return 0;
    };
    let mut replaced = 0;
    for (index, record) in records {
        if let Some(slot) = items.get_mut(*index) {
            *slot = record.message.clone();
            replaced += 1;
        }
    }
    replaced
}

/// What a compaction covers, read from the request before its sealed items are expanded.
#[derive(Debug)]
pub struct Span {
    /// The input items, the trigger left out (what the summary is remembered against).
    pub items: Vec<Value>,
    /// Where the newly covered items start: after the proxy's last sealed item.
    pub from: usize,
    /// The summary of that sealed item (what the new one merges).
    pub previous: Option<String>,
    /// The user messages kept in the answer of `/responses/compact`, in order.
    pub kept: Vec<Value>,
}

/// The span of `body` to compact, given its sealed items' `records`. A string `input` is one
/// user message.
pub fn span(body: &Value, records: &[(usize, Record)]) -> Span {
    let mut items = match body.get("input") {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::String(text)) => vec![json!({"role": "user", "content": text})],
        _ => Vec::new(),
    };
    if items.last().and_then(item_type) == Some(TRIGGER) {
        items.pop();
    }
    let last = records.iter().rfind(|(i, _)| *i < items.len());
    let kept = items
        .iter()
        .enumerate()
        .filter(|(i, item)| {
            !records.iter().any(|(at, _)| at == i)
                && Responses.kind(item) == super::model::Kind::User
        })
        .map(|(_, item)| item.clone())
        .collect();
    Span {
        from: last.map_or(0, |(i, _)| i + 1),
        previous: last.map(|(_, r)| r.summary.clone()),
        items,
        kept,
    }
}

/// Stores what a compaction needs and gives its sealed item: the newly covered items (one
/// line each, readable back through the marker) and the [`Record`]. Without a `summary` the
/// message is the marker alone, followed by the previous compaction's text when there is one.
pub async fn seal(
    store: &dyn Store,
    identity: &Identity,
    span: &Span,
    summary: Option<&str>,
    tokens: usize,
) -> Result<(Value, Record), StoreError> {
    let covered = &span.items[span.from.min(span.items.len())..];
    let lines: String = covered
        .iter()
        .map(|item| Responses.line(item) + "\n")
        .collect();
    let transcript = store
        .put_content(
            &identity.tenant,
            &identity.session,
            ContentKind::Messages,
            &lines,
        )
        .await?;
    let record = match summary {
        Some(summary) => Record {
            kind: RECORD_KIND.into(),
            summary: summary.to_owned(),
            message: message(&message_text(
                Some(summary),
                &transcript,
                covered.len(),
                tokens,
            )),
        },
        None => {
            let text = message_text(span.previous.as_deref(), &transcript, covered.len(), tokens);
            Record {
                kind: RECORD_KIND.into(),
                message: message(&text),
                summary: text,
            }
        }
    };
    let text = json!({"kind": record.kind, "summary": record.summary, "message": record.message})
        .to_string();
    let reference = store
        .put_content(
            &identity.tenant,
            &identity.session,
            ContentKind::Messages,
            &text,
        )
        .await?;
    Ok((sealed_item(&reference), record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Backend, StoreConfig};

    fn input(items: Value) -> Value {
        json!({"model": "m", "input": items})
    }

    #[test]
    fn a_trigger_counts_only_as_the_one_final_item() {
        let user = json!({"role": "user", "content": "hi"});
        let t = json!({"type": "compaction_trigger"});
        assert_eq!(trigger(&input(json!([user]))), Ok(false));
        assert_eq!(trigger(&input(json!([user, t]))), Ok(true));
        assert_eq!(trigger(&json!({"input": "text"})), Ok(false));
        let misplaced = trigger(&input(json!([t, user]))).unwrap_err();
        assert!(misplaced.contains("input[0]") && misplaced.contains("final"));
        let twice = trigger(&input(json!([user, t, t]))).unwrap_err();
        assert!(twice.contains("2 `compaction_trigger`"), "{twice}");
    }

    #[test]
    fn only_the_proxys_seal_is_opened() {
        let r = ContentRef::of("x");
        let item = sealed_item(&r);
        assert_eq!(seal_of(&item), Some(Ok(r.clone())));
        assert_eq!(item, sealed_item(&r), "the same record, the same item");
        assert!(item["id"].as_str().unwrap().starts_with("cmp_"));
        let openai = json!({"type": "compaction", "encrypted_content": "gAAAAB"});
        assert_eq!(seal_of(&openai), None);
        let message = json!({"role": "user", "content": format!("{SEAL_PREFIX}{r}")});
        assert_eq!(seal_of(&message), None);
        let bad = json!({"type": "compaction", "encrypted_content": format!("{SEAL_PREFIX}ctx_x")});
        assert!(matches!(seal_of(&bad), Some(Err(_))));
    }

    #[tokio::test]
    async fn a_sealed_item_expands_for_its_tenant_only() {
        let store = crate::store::open(&StoreConfig {
            backend: Backend::Memory,
            ..StoreConfig::default()
        })
        .await
        .unwrap();
        let tenant = Tenant::from_api_key(Some("sk-a"));
        let identity = super::super::session::identify(tenant.clone(), Some("s"), &[]);
        let body = input(json!([
            {"role": "user", "content": "fix the bug"},
            {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
            {"type": "compaction_trigger"}
        ]));
        let first = span(&body, &[]);
        assert_eq!((first.items.len(), first.from, first.kept.len()), (3, 0, 1));
        let (item, record) = seal(
            store.as_ref(),
            &identity,
            &first,
            Some("## Task overview\nFix."),
            40,
        )
        .await
        .unwrap();
        let text = record.message["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("## Task overview\nFix.") && text.contains("ctx_"));

        // Next turn: the kept message, the sealed item, new work.
        let mut next = input(json!([
            {"role": "user", "content": "fix the bug"},
            item,
            {"role": "user", "content": "now the tests"},
            {"type": "compaction_trigger"}
        ]));
        let found = records(store.as_ref(), &tenant, &next).await.unwrap();
        assert_eq!(found.len(), 1);
        let second = span(&next, &found);
        assert_eq!(second.from, 2);
        assert_eq!(second.previous.as_deref(), Some("## Task overview\nFix."));
        assert_eq!(
            second.kept.len(),
            2,
            "the expanded summary is not a kept message"
        );
        let named = named_refs(&found);
        assert_eq!(named.len(), 1, "the stored originals: {named:?}");
        assert!(text.contains(named[0].as_str()));
        assert_eq!(expand(&mut next, &found), 1);
        assert_eq!(next["input"][1], record.message);

        // Another tenant, a changed byte, a reference to other content: not opened.
        let other = Tenant::from_api_key(Some("sk-b"));
        let sealed = input(json!([item]));
        assert!(matches!(
            records(store.as_ref(), &other, &sealed).await,
            Err(ExpandError::Unknown { index: 0 })
        ));
        let content = item["encrypted_content"].as_str().unwrap();
        let changed = format!("{}A", &content[..content.len() - 1]);
        let changed = if changed == content {
            format!("{}B", &content[..content.len() - 1])
        } else {
            changed
        };
        let tampered = input(json!([{"type": "compaction", "encrypted_content": changed}]));
        assert!(records(store.as_ref(), &tenant, &tampered).await.is_err());
        let plain = store
            .put_content(&tenant, &identity.session, ContentKind::ToolResult, "[1]")
            .await
            .unwrap();
        let foreign = input(json!([sealed_item(&plain)]));
        assert!(records(store.as_ref(), &tenant, &foreign).await.is_err());
    }
}
