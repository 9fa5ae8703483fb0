//! The sample traffic generator: seeded, deterministic agent sessions in the OpenAI
//! chat-completions format, which the benchmarks replay through the proxy.
//!
//! Everything is synthesized from a seed by the generator's own PRNG, so the same
//! configuration gives byte-identical sessions on every platform.

pub mod rng;
