//! The `context-proxy` binary.

fn main() {}
