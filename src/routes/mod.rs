//! What the proxy answers: the managed request path (`chat`: chat completions, and the
//! Responses API through `responses`; their tool loop in `tool_loop`), every other `/v1/…`
//! route forwarded verbatim (`passthrough`), and the `/v1/context/…` inspection API
//! (`context_api`), and the page that shows what the proxy did (`ui`).

pub mod chat;
pub mod context_api;
pub mod messages;
pub mod passthrough;
pub mod responses;
pub mod shared;
pub mod tool_loop;
pub mod ui;
