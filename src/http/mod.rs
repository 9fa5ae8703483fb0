//! HTTP plumbing shared by every route: the body type, hop-by-hop headers, reading a request
//! body under its limits, and the client-facing error.

pub mod body;
pub mod error;
pub mod headers;
pub mod request_body;
