//! HTTP plumbing shared by every route: the body type, hop-by-hop headers, reading a request
//! body under its limits, relaying an upstream response, and the client-facing error.

pub mod body;
pub mod error;
pub mod headers;
pub mod relay;
pub mod request_body;
