//! What the proxy tells its operators: metrics (`/metrics`), logging, and the summarizer's
//! counters. A leaf: it imports no module of the proxy above `wire`, so every layer may record.

pub mod calls;
pub mod logging;
pub mod metrics;
pub mod summarizer_stats;
