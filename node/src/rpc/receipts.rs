//! Upload receipts: which tenant sent this node which chunk, lately.
//!
//! A chunk id is the BLAKE3 of its content, so naming one proves nothing: a
//! tenant that commits a manifest naming another tenant's chunk, without
//! ever sending it, would be served content it never had, or learn that
//! someone stores it. So a tenant's manifest may name a chunk none of its
//! own objects named before only if the tenant itself uploaded that chunk
//! to each of the object's holders (`PUT /v1/chunks/{id}` as that tenant),
//! which proves it holds the content. Holders keep a receipt per (tenant,
//! chunk) for [`KEEP_MS`], at most [`MAX_RECEIPTS`] per tenant (its oldest
//! first out); `shoal cp` uploads and commits within seconds. Pure: takes
//! `now`.

use shoal_storage::chunk::ChunkId;
use std::collections::{HashMap, VecDeque};

/// How long a receipt proves an upload: far longer than an upload of a
/// large object takes between its first chunk and its commit.
pub const KEEP_MS: u64 = 6 * 3600 * 1000;
/// Receipts kept per tenant at most (about 100 bytes each): one tenant's
/// uploads never push out another's.
pub const MAX_RECEIPTS: usize = 1 << 20;

/// One tenant's receipts: when each chunk was last sent, and the order to
/// forget them in (with stale entries a later upload renewed).
#[derive(Default)]
struct TenantReceipts {
    at: HashMap<ChunkId, u64>,
    order: VecDeque<(u64, ChunkId)>,
}

impl TenantReceipts {
    fn drop_oldest(&mut self) {
        if let Some((at, id)) = self.order.pop_front() {
            if self.at.get(&id) == Some(&at) {
                self.at.remove(&id);
            }
        }
    }
}

/// This node's receipts.
pub struct UploadReceipts {
    max: usize,
    tenants: HashMap<String, TenantReceipts>,
}

impl Default for UploadReceipts {
    fn default() -> Self {
        UploadReceipts::new(MAX_RECEIPTS)
    }
}

impl UploadReceipts {
    /// Keeps at most `max` receipts per tenant.
    pub fn new(max: usize) -> Self {
        UploadReceipts {
            max,
            tenants: HashMap::new(),
        }
    }

    /// `tenant` sent this node chunk `id` at `now_ms`.
    pub fn record(&mut self, tenant: &str, id: ChunkId, now_ms: u64) {
        let cutoff = now_ms.saturating_sub(KEEP_MS);
        let max = self.max;
        let receipts = self.tenants.entry(tenant.to_string()).or_default();
        while receipts.order.front().is_some_and(|(at, _)| *at < cutoff) {
            receipts.drop_oldest();
        }
        receipts.at.insert(id, now_ms);
        receipts.order.push_back((now_ms, id));
        // Re-uploads leave stale entries in `order`: bound both.
        while receipts.at.len() > max || receipts.order.len() > 2 * max {
            receipts.drop_oldest();
        }
    }

    /// For each of `ids`, whether `tenant` uploaded it here within
    /// [`KEEP_MS`] of `now_ms`.
    pub fn uploaded(&self, tenant: &str, ids: &[ChunkId], now_ms: u64) -> Vec<bool> {
        let since = now_ms.saturating_sub(KEEP_MS);
        let receipts = self.tenants.get(tenant);
        ids.iter()
            .map(|id| {
                receipts
                    .and_then(|r| r.at.get(id))
                    .is_some_and(|at| *at >= since)
            })
            .collect()
    }

    /// Receipts kept for `tenant`.
    pub fn len_of(&self, tenant: &str) -> usize {
        self.tenants.get(tenant).map_or(0, |r| r.at.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ChunkId {
        ChunkId::of(&[n])
    }

    #[test]
    fn a_receipt_is_the_uploaders_own_and_expires() {
        let mut r = UploadReceipts::default();
        r.record("alpha", id(1), 1_000);
        assert_eq!(r.uploaded("alpha", &[id(1), id(2)], 2_000), [true, false]);
        assert_eq!(r.uploaded("beta", &[id(1)], 2_000), [false]);
        assert_eq!(r.uploaded("alpha", &[id(1)], 1_000 + KEEP_MS + 1), [false]);
        // A later upload renews it; the old entry's expiry does not remove it.
        r.record("alpha", id(1), 5_000);
        r.record("alpha", id(3), 1_001 + KEEP_MS);
        assert_eq!(r.uploaded("alpha", &[id(1)], 1_001 + KEEP_MS), [true]);
        assert_eq!(r.len_of("alpha"), 2);
    }

    #[test]
    fn receipts_stay_bounded() {
        let mut r = UploadReceipts::new(100);
        r.record("b", id(7), 1);
        for n in 0..1_000u64 {
            r.record("t", ChunkId::of(&n.to_le_bytes()), 1);
            r.record("t", ChunkId::of(&0u64.to_le_bytes()), 1);
        }
        assert!(r.len_of("t") <= 100);
        assert!(r.tenants["t"].order.len() <= 200);
        // The newest are kept, and another tenant's are not pushed out.
        assert_eq!(
            r.uploaded("t", &[ChunkId::of(&999u64.to_le_bytes())], 2),
            [true]
        );
        assert_eq!(r.uploaded("b", &[id(7)], 2), [true]);
    }
}
