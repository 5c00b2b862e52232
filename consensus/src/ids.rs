//! The names every part of the ledger shares: node ids and the rule for
//! node names. A leaf: it names no other module.

/// A member's id in the ledger and in Raft.
pub type NodeId = u64;

/// The longest name (node, tenant, region label) the ledger keeps, so
/// that names stay safe in paths, labels and metrics.
pub const MAX_NAME: usize = 63;

/// Checks a node name: DNS-label-like so it is safe in paths, labels and
/// metrics.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!(
            "node name must be 1-{MAX_NAME} characters, got {}",
            name.len()
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err(format!(
            "node name '{name}' may only contain letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}
