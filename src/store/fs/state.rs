//! State records, `<session>/state/<key>`: small values replaced whole by an atomic write.

use std::io::Read;

use super::tree::{io_error, refresh_on_read, Tree};
use super::STATE_DIR;
use crate::store::{SessionId, StateKey, StoreError, Tenant};

impl Tree {
    pub(super) fn put_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let session_dir = self.session_dir(tenant, session);
        let state_dir = session_dir.join(STATE_DIR);
        self.make_dir(&self.tenant_dir(tenant))?;
        self.make_dir(&session_dir)?;
        self.make_dir(&state_dir)?;
        self.write_atomic(&state_dir, key.as_str(), value, now)
    }

    pub(super) fn get_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let now = self.clock.now();
        let path = self
            .session_dir(tenant, session)
            .join(STATE_DIR)
            .join(key.as_str());
        let Some(mut file) = self.open_live(&path, now)? else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(io_error("read", &path))?;
        refresh_on_read(&file, &path, now);
        Ok(Some(bytes))
    }
}
