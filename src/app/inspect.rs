//! The `inspect` subcommand: what a store holds, read directly with the configuration's store
//! settings and proxy keys, printed as JSON (the same views as `GET /v1/context/sessions`).

use serde_json::{json, Value};

use crate::app::config::ValidConfig;
use crate::auth::KeyNames;
use crate::sessions::{list, parse_tenant, session_detail, InspectError};
use crate::store::SessionId;

/// The `inspect` subcommand: opens the configured store and prints every tenant's sessions
/// (or those of `tenant`, a tenant id or a proxy key's name), or one session's detail (in every
/// tenant that has it), as JSON, naming each tenant's proxy key when it is one.
pub async fn run_cli(
    config: &ValidConfig,
    tenant: Option<&str>,
    session: Option<&str>,
) -> Result<Value, InspectError> {
    let names = KeyNames::of(&config.auth, &config.keys)
        .map_err(|e| InspectError::BadRequest(e.to_string()))?;
    let tenant = tenant.map(|t| parse_tenant(t, Some(&names))).transpose()?;
    let store = crate::store::open(&config.store).await?;
    let out = match session {
        None => list(store.as_ref(), tenant.as_ref(), Some(&names)).await,
        Some(id) => {
            let session =
                SessionId::parse(id).map_err(|_| InspectError::NotInStore(id.to_string()))?;
            let mut found = Vec::new();
            for (t, s) in store.list_sessions(tenant.as_ref()).await? {
                if s == session {
                    if let Some(detail) =
                        session_detail(store.as_ref(), &t, &s, Some(&names)).await?
                    {
                        found.push(detail);
                    }
                }
            }
            if found.is_empty() {
                Err(InspectError::NotInStore(id.chars().take(100).collect()))
            } else {
                Ok(json!({"object": "list", "data": found}))
            }
        }
    };
    store.close().await;
    out
}
