//! Content-addressed chunk storage (BLAKE3, zstd), manifests and replica
//! placement. Built in the checkpoint-replication work; this crate currently
//! only fixes the chunk identity so that the wire and the ledger agree on it.

/// A chunk's identity: the BLAKE3 hash of its plain (uncompressed) bytes.
pub fn chunk_id(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunk_id_is_blake3_hex() {
        assert_eq!(super::chunk_id(b"").len(), 64);
        assert_ne!(super::chunk_id(b"a"), super::chunk_id(b"b"));
    }
}
