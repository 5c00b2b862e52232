//! `shoal ca rotate` and `shoal ca status`: replace the cluster CA without
//! downtime, and follow the rotation (docs/security.md, "CA rotation").

use super::emit;
use crate::cli::api;
use crate::views::rfc3339;
use clap::Subcommand;
use shoal_sdk::{CaStatus, Client};

#[derive(Subcommand, Debug)]
pub enum CaCmd {
    /// Start a rotation to a new cluster CA: every node trusts both, renews
    /// its certificate with the new one, then the old one is retired
    /// (admin only; refused while a rotation is in progress)
    Rotate,
    /// The cluster CA, the phase of a rotation in progress, and which CA
    /// signed each member's certificate
    Status,
}

pub(super) async fn run(client: &Client, cmd: &CaCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        CaCmd::Rotate => {
            let r = client.rotate_ca().await.map_err(api)?;
            emit(json, &r, || {
                format!(
                    "CA rotation started: new CA {} (replacing {}); every node now learns to trust it, renews its certificate, and the old CA is retired — follow it with `shoal ca status`\n",
                    r.new_fingerprint, r.old_fingerprint
                )
            })
        }
        CaCmd::Status => {
            let s = client.ca_status().await.map_err(api)?;
            emit(json, &s, || format_status(&s))
        }
    }
}

/// `3f2a9c1b0d4e7a51 (new)`: a fingerprint as the table shows it.
fn label(s: &CaStatus, fp: &str) -> String {
    let short = shoal_consensus::ca::short(fp);
    let role = if s.new_fingerprint.as_deref() == Some(fp) {
        " (new)"
    } else if s.old_fingerprint.as_deref() == Some(fp) {
        " (old)"
    } else {
        ""
    };
    format!("{short}{role}")
}

pub fn format_status(s: &CaStatus) -> String {
    let mut out = String::new();
    let since = |ms: Option<u64>| ms.map(rfc3339).unwrap_or_else(|| "-".into());
    match s.phase.as_str() {
        "stable" => out.push_str(&format!(
            "phase    stable ({} rotation{} so far)\n",
            s.rotations,
            if s.rotations == 1 { "" } else { "s" }
        )),
        phase => out.push_str(&format!(
            "phase    {phase} (rotation started {}, this phase since {})\n",
            since(s.started_at_ms),
            since(s.phase_since_ms)
        )),
    }
    out.push_str(&format!("signing  {}\n", s.signing_fingerprint));
    out.push_str(&format!(
        "trusted  {}\n",
        s.trusted
            .iter()
            .map(|f| label(s, f))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(&format!(
        "{:<6}{:<20}{:<10}{:<26}{}\n",
        "ID", "NAME", "STATE", "CERT CA", "TRUSTS"
    ));
    for m in &s.members {
        let trusts = if m.trusts.is_empty() {
            "-".to_string()
        } else {
            m.trusts
                .iter()
                .map(|f| label(s, f))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&format!(
            "{:<6}{:<20}{:<10}{:<26}{}\n",
            m.id,
            m.name,
            m.state.to_string(),
            m.cert_ca
                .as_deref()
                .map_or_else(|| "-".into(), |f| label(s, f)),
            trusts
        ));
    }
    for why in &s.waiting_for {
        out.push_str(&format!("waiting  {why}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_sdk::{MemberCa, MemberState};

    #[test]
    fn the_status_names_each_ca_by_its_role() {
        let old = "a".repeat(64);
        let new = "b".repeat(64);
        let s = CaStatus {
            phase: "reissuing".into(),
            signing_fingerprint: new.clone(),
            trusted: vec![old.clone(), new.clone()],
            old_fingerprint: Some(old.clone()),
            new_fingerprint: Some(new.clone()),
            started_at_ms: Some(0),
            phase_since_ms: Some(1000),
            rotations: 1,
            members: vec![MemberCa {
                id: 3,
                name: "n3".into(),
                state: MemberState::Down,
                cert_ca: Some(old.clone()),
                trusts: vec![old.clone(), new.clone()],
                reported_at_ms: Some(0),
            }],
            waiting_for: vec!["node 3 (n3, down) has no certificate from the new CA yet".into()],
            trusted_pem: String::new(),
        };
        let text = format_status(&s);
        assert!(text.contains("phase    reissuing"), "{text}");
        assert!(
            text.contains("aaaaaaaaaaaaaaaa (old), bbbbbbbbbbbbbbbb (new)"),
            "{text}"
        );
        assert!(text.contains("waiting  node 3 (n3, down)"), "{text}");
    }
}
