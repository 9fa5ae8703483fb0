//! Token counting: what the upstream will bill for a chat-completions request, counted with the
//! real BPE tokenizers (o200k_base, cl100k_base) and remembered per message.
//!
//! - `encoding.rs` — the encodings, which one a model uses, the raw count of a string;
//! - `message.rs` — the billing rules for one message (OpenAI's published formula + estimates);
//! - `tools.rs` — the rules for tool definitions and `response_format` schemas;
//! - `json.rs` — reading fields of small JSON objects cheaply;
//! - `cache.rs` — the bounded concurrent cache of counts keyed by content hash;
//! - `counter.rs` — [`Counter`], which ties them together for a whole request;
//! - `prefix.rs` — the prefix a request shares with the previous one (what a prompt cache
//!   reads), for everything that prices a conversation.
//!
//! Everything here is pure computation: no I/O, no clock, and no error path. Counts are
//! estimates of `usage.prompt_tokens`, exact for the cases OpenAI published, documented
//! approximations elsewhere.
//!
//! The proxy counts requests with it; the mock upstream (`context-proxy-mock`) uses it to answer
//! `usage` as a real upstream would.

#![forbid(unsafe_code)]

mod cache;
mod counter;
mod encoding;
mod json;
mod message;
mod prefix;
mod settings;
mod tools;

pub use cache::stable_hash;
pub use counter::{Counter, RequestCount};
pub use encoding::{Encoding, UnknownEncoding};
pub use json::{field, str_field};
pub use message::{REPLY_PRIMING, TOKENS_PER_MESSAGE, TOKENS_PER_NAME, TOKENS_PER_TOOL_CALL};
pub use prefix::{head_tokens, shared_prefix, Parts, SharedPrefix};
pub use settings::CountSettings;
pub use tools::tools_tokens;
