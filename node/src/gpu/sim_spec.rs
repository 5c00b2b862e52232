//! The `--sim-gpus` specification: `8xH100-80GB` or `4xA100-40GB,2xL4`.

use shoal_sdk::GpuInfo;

/// Parses `8xH100-80GB` or `4xA100-40GB,2xL4` into an inventory. UUIDs are
/// derived from the node name so they are stable across restarts and unique
/// across nodes.
pub fn parse_sim_gpus(spec: &str, node_name: &str) -> Result<Vec<GpuInfo>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (count, model) = part.split_once(['x', 'X']).ok_or_else(|| {
            format!("invalid --sim-gpus entry '{part}': expected COUNTxMODEL, e.g. 8xH100-80GB")
        })?;
        let count: u32 = count
            .parse()
            .map_err(|_| format!("invalid GPU count '{count}' in --sim-gpus entry '{part}'"))?;
        if count == 0 || count > 64 {
            return Err(format!("--sim-gpus entry '{part}': count must be 1-64"));
        }
        if model.is_empty() {
            return Err(format!("--sim-gpus entry '{part}' names no model"));
        }
        let memory_mb = memory_of(model);
        for _ in 0..count {
            let index = out.len() as u32;
            let h = blake3::hash(format!("{node_name}/{index}/{model}").as_bytes()).to_hex();
            let uuid = format!(
                "GPU-{}-{}-{}-{}-{}",
                &h[0..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..32]
            );
            out.push(GpuInfo {
                index,
                model: model.to_string(),
                memory_mb,
                uuid,
                allocated_to: None,
                numa_node: None,
                nvlink_peers: Vec::new(),
                mig_enabled: false,
                health: String::new(),
                health_reason: None,
            });
        }
    }
    if out.is_empty() {
        return Err("--sim-gpus is empty: expected e.g. 8xH100-80GB".into());
    }
    Ok(out)
}

/// Memory from a `-80GB` suffix, else from well-known models.
fn memory_of(model: &str) -> u64 {
    if let Some(gb) = model
        .rsplit_once('-')
        .and_then(|(_, s)| s.strip_suffix("GB"))
        .and_then(|n| n.parse::<u64>().ok())
    {
        return gb * 1024;
    }
    match model {
        m if m.starts_with("H200") => 141 * 1024,
        m if m.starts_with("H100") => 80 * 1024,
        m if m.starts_with("A100") => 40 * 1024,
        m if m.starts_with("L40") => 48 * 1024,
        m if m.starts_with("L4") => 24 * 1024,
        _ => 16 * 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mixed_specs() {
        let g = parse_sim_gpus("4xA100-40GB,2xL4", "n1").expect("valid");
        assert_eq!(g.len(), 6);
        assert_eq!(g[0].memory_mb, 40 * 1024);
        assert_eq!(g[5].model, "L4");
        assert_eq!(g[5].index, 5);
        assert_eq!(g[5].memory_mb, 24 * 1024);
        let other = parse_sim_gpus("4xA100-40GB,2xL4", "n2").expect("valid");
        assert_ne!(g[0].uuid, other[0].uuid);
    }

    #[test]
    fn rejects_nonsense() {
        for bad in ["", "H100", "0xH100", "ax", "8x"] {
            assert!(parse_sim_gpus(bad, "n").is_err(), "{bad}");
        }
    }
}
