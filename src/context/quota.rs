//! Write quotas: how many bytes of new content one tenant, and all tenants together, may put in
//! the store per day, counted by this process. A request that would go over is forwarded
//! unmanaged (fail-open) and said so in a warning, a metric and its `x-context-actions` header;
//! the next UTC day starts from zero.
//!
//! Only content this process had not stored before counts: refreshing what a marker already
//! points to is free, and a request whose store write fails is refunded. With several replicas each counts its own writes, so the store as a whole
//! takes at most replicas × the quota per day, and at most retention × that in all.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::Tenant;

/// Tenants tracked before the counts are dropped (a bound on memory, not a quota).
const MAX_TENANTS: usize = 100_000;

/// Which quota a request would exceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// The tenant's own daily quota.
    Tenant,
    /// The quota of all tenants together.
    Store,
}

impl Exceeded {
    pub fn as_str(self) -> &'static str {
        match self {
            Exceeded::Tenant => "tenant",
            Exceeded::Store => "store",
        }
    }
}

/// Bytes stored today, per tenant and in all.
#[derive(Debug)]
pub struct Quotas {
    /// Bytes per tenant per day; 0 = no quota.
    per_tenant: u64,
    /// Bytes for all tenants per day; 0 = no quota.
    total: u64,
    /// One lock for the day's counts, so two requests cannot both take the last bytes.
    today: Mutex<Today>,
}

/// What was stored on `day`.
#[derive(Debug, Default)]
struct Today {
    day: u64,
    total: u64,
    used: HashMap<Tenant, u64>,
}

impl Quotas {
    pub fn new(per_tenant: u64, total: u64) -> Quotas {
        Quotas {
            per_tenant,
            total,
            today: Mutex::new(Today::default()),
        }
    }

    /// Charges `bytes` to `tenant` on `day` (days since the epoch, UTC), unless that would take
    /// it or the total over its quota; then nothing is charged.
    pub fn charge(&self, tenant: &Tenant, bytes: u64, day: u64) -> Result<(), Exceeded> {
        if bytes == 0 {
            return Ok(());
        }
        let mut today = self.today.lock().unwrap_or_else(|e| e.into_inner());
        if today.day != day {
            *today = Today {
                day,
                ..Today::default()
            };
        }
        if self.total > 0 && today.total.saturating_add(bytes) > self.total {
            return Err(Exceeded::Store);
        }
        let used = today.used.get(tenant).copied().unwrap_or(0);
        if self.per_tenant > 0 && used.saturating_add(bytes) > self.per_tenant {
            return Err(Exceeded::Tenant);
        }
        if today.used.len() >= MAX_TENANTS && !today.used.contains_key(tenant) {
            today.used.clear();
        }
        today
            .used
            .insert(tenant.clone(), used.saturating_add(bytes));
        today.total = today.total.saturating_add(bytes);
        Ok(())
    }

    /// Gives back `bytes` charged to `tenant` on `day` that were not stored after all (the
    /// store write failed): a failed request costs no quota. A refund for another day than
    /// the current one is dropped (its day's counts are gone).
    pub fn refund(&self, tenant: &Tenant, bytes: u64, day: u64) {
        let mut today = self.today.lock().unwrap_or_else(|e| e.into_inner());
        if today.day != day || bytes == 0 {
            return;
        }
        if let Some(used) = today.used.get_mut(tenant) {
            *used = used.saturating_sub(bytes);
        }
        today.total = today.total.saturating_sub(bytes);
    }
}

/// Days since the Unix epoch, UTC, of `now`.
pub fn day_of(now: std::time::SystemTime) -> u64 {
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> Tenant {
        Tenant::from_api_key(Some(name))
    }

    #[test]
    fn a_tenant_gets_its_quota_and_no_more_until_the_next_day() {
        let q = Quotas::new(100, 0);
        let (a, b) = (tenant("a"), tenant("b"));
        assert_eq!(q.charge(&a, 60, 1), Ok(()));
        assert_eq!(q.charge(&a, 41, 1), Err(Exceeded::Tenant));
        // A refused charge takes nothing: what is left can still be used.
        assert_eq!(q.charge(&a, 40, 1), Ok(()));
        assert_eq!(q.charge(&a, 1, 1), Err(Exceeded::Tenant));
        // Another tenant has its own quota.
        assert_eq!(q.charge(&b, 100, 1), Ok(()));
        // A new day starts from zero.
        assert_eq!(q.charge(&a, 100, 2), Ok(()));
    }

    #[test]
    fn a_refund_gives_back_what_was_not_stored_on_the_same_day() {
        let q = Quotas::new(100, 150);
        let (a, b) = (tenant("a"), tenant("b"));
        assert_eq!(q.charge(&a, 100, 3), Ok(()));
        assert_eq!(q.charge(&a, 1, 3), Err(Exceeded::Tenant));
        q.refund(&a, 60, 3);
        assert_eq!(q.charge(&a, 60, 3), Ok(()));
        assert_eq!(q.charge(&a, 1, 3), Err(Exceeded::Tenant));
        // Yesterday's refund gives nothing back today.
        q.refund(&a, 100, 2);
        assert_eq!(q.charge(&a, 1, 3), Err(Exceeded::Tenant));
        // The total is refunded too.
        assert_eq!(q.charge(&b, 50, 3), Ok(()));
        assert_eq!(q.charge(&b, 1, 3), Err(Exceeded::Store));
        q.refund(&b, 50, 3);
        assert_eq!(q.charge(&b, 50, 3), Ok(()));
        // More than was charged takes nothing below zero.
        q.refund(&b, u64::MAX, 3);
        assert_eq!(q.charge(&b, 1, 3), Ok(()));
        assert_eq!(q.charge(&b, 100, 3), Err(Exceeded::Tenant));
    }

    #[test]
    fn the_total_bounds_all_tenants_together() {
        let q = Quotas::new(0, 150);
        assert_eq!(q.charge(&tenant("a"), 100, 7), Ok(()));
        assert_eq!(q.charge(&tenant("b"), 51, 7), Err(Exceeded::Store));
        assert_eq!(q.charge(&tenant("b"), 50, 7), Ok(()));
        assert_eq!(q.charge(&tenant("c"), 1, 7), Err(Exceeded::Store));
        assert_eq!(q.charge(&tenant("c"), 1, 8), Ok(()));
    }

    #[test]
    fn zero_means_no_quota() {
        let q = Quotas::new(0, 0);
        assert_eq!(q.charge(&tenant("a"), u64::MAX, 1), Ok(()));
        assert_eq!(q.charge(&tenant("a"), u64::MAX, 1), Ok(()));
    }

    #[test]
    fn days_are_utc_days_since_the_epoch() {
        let at = |s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(day_of(at(0)), 0);
        assert_eq!(day_of(at(86_399)), 0);
        assert_eq!(day_of(at(86_400)), 1);
    }
}
