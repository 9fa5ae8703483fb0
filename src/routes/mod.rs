//! What the proxy answers: the chat-completions request path (`chat`), every other `/v1/…`
//! route forwarded verbatim (`passthrough`), and the `/v1/context/…` inspection API
//! (`context_api`), and the page that shows what the proxy did (`ui`).

pub mod chat;
pub mod context_api;
pub mod messages;
pub mod passthrough;
pub mod shared;
pub mod ui;
