//! What the proxy answers: the chat-completions request path (`chat`), every other `/v1/…`
//! route forwarded verbatim (`passthrough`), and the `/v1/context/…` inspection API
//! (`context_api`).

pub mod chat;
pub mod context_api;
pub mod passthrough;
pub mod shared;
