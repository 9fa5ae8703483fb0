//! The composition root: the whole configuration (read, overridden from the environment,
//! validated), the application state built from it, and the subcommands that need the whole
//! of it (`check-config`, `inspect`, `healthcheck`).

pub mod check_config;
pub mod config;
pub mod env_overrides;
pub mod healthcheck;
pub mod inspect;
pub mod serve;
pub mod state;
