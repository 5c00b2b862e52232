//! `shoal token create|ls|revoke` and `shoal token api [ls|revoke|rotate-admin]`.
//! A new secret is printed once, alone on stdout; listings never show one.

use super::{emit, print_json, ApiTokenArgs, ApiTokenCmd, TokenCmd};
use crate::cli::api;
use crate::views::rfc3339;
use shoal_sdk::units::parse_duration;
use shoal_sdk::{ApiTokenCreateRequest, ApiTokenInfo, Client, JoinTokenInfo, TokenCreateRequest};

fn ttl_s(ttl: &Option<String>) -> anyhow::Result<Option<u64>> {
    ttl.as_deref()
        .map(|t| {
            parse_duration(t)
                .map(|d| d.as_secs())
                .map_err(|e| anyhow::anyhow!("--ttl: {e}"))
        })
        .transpose()
}

/// `3600` → `1h`, `90` → `90s`: a lifetime as a user would write it.
pub fn format_ttl(s: u64) -> String {
    match s {
        s if s >= 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A timestamp to the second, or `-`.
fn when(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".into(), rfc3339)
}

pub(super) async fn run(client: &Client, cmd: &TokenCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        TokenCmd::Create { ttl, uses, voter } => {
            let t = client
                .create_join_token(&TokenCreateRequest {
                    ttl_s: ttl_s(ttl)?,
                    uses: *uses,
                    voter: *voter,
                })
                .await
                .map_err(api)?;
            emit(json, &t, || format!("{}\n", t.token))
        }
        TokenCmd::Ls => {
            let rows = client.join_tokens().await.map_err(api)?;
            emit(json, &rows, || format_join_tokens(&rows))
        }
        TokenCmd::Revoke { id } => {
            let r = client.revoke_join_token(id).await.map_err(api)?;
            emit(json, &r, || format!("join token {id} revoked\n"))
        }
        TokenCmd::Api(args) => api_tokens(client, args, json).await,
    }
}

async fn api_tokens(client: &Client, args: &ApiTokenArgs, json: bool) -> anyhow::Result<()> {
    match &args.cmd {
        None => {
            let t = client
                .create_api_token(&ApiTokenCreateRequest {
                    name: args.name.clone(),
                    tenant: args.tenant.clone(),
                    ttl_s: ttl_s(&args.ttl)?,
                })
                .await
                .map_err(api)?;
            emit(json, &t, || format!("{}\n", t.token))
        }
        Some(ApiTokenCmd::Ls) => {
            let rows = client.api_tokens().await.map_err(api)?;
            emit(json, &rows, || format_api_tokens(&rows))
        }
        Some(ApiTokenCmd::Revoke { id }) => {
            let r = client.revoke_api_token(id).await.map_err(api)?;
            emit(json, &r, || format!("API token {id} revoked\n"))
        }
        Some(ApiTokenCmd::RotateAdmin) => {
            let r = client.rotate_admin_token().await.map_err(api)?;
            if json {
                return print_json(&r);
            }
            println!("{}", r.token);
            match &r.admin_token_file {
                Some(path) => eprintln!("rewrote {path}; the old admin token is refused from now on"),
                None => eprintln!(
                    "the old admin token is refused from now on; the answering node has no admin.token to rewrite"
                ),
            }
            Ok(())
        }
    }
}

fn format_join_tokens(rows: &[JoinTokenInfo]) -> String {
    let mut out = format!(
        "{:<14}{:<9}{:>9}  {:<8}{:<22}{}\n",
        "ID", "STATE", "USES", "ADMITS", "EXPIRES", "CREATED"
    );
    for t in rows {
        out.push_str(&format!(
            "{:<14}{:<9}{:>9}  {:<8}{:<22}{}\n",
            t.id,
            t.state,
            format!("{}/{}", t.uses_left, t.max_uses),
            if t.voter { "voters" } else { "learners" },
            when(Some(t.expires_at_ms)),
            when(Some(t.created_at_ms)),
        ));
    }
    out
}

fn format_api_tokens(rows: &[ApiTokenInfo]) -> String {
    let mut out = format!(
        "{:<14}{:<20}{:<14}{:<9}{:<22}{:<22}{}\n",
        "ID", "NAME", "TENANT", "STATE", "CREATED", "EXPIRES", "LAST USED"
    );
    for t in rows {
        out.push_str(&format!(
            "{:<14}{:<20}{:<14}{:<9}{:<22}{:<22}{}\n",
            t.id,
            t.name,
            t.tenant.as_deref().unwrap_or("(admin)"),
            t.state,
            when(Some(t.created_at_ms)),
            t.expires_at_ms
                .map(|e| when(Some(e)))
                .unwrap_or_else(|| "never".into()),
            when(t.last_used_ms),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_print_as_written() {
        assert_eq!(format_ttl(3600), "1h");
        assert_eq!(format_ttl(86_400), "1d");
        assert_eq!(format_ttl(90), "90s");
        assert_eq!(format_ttl(1800), "30m");
    }

    #[test]
    fn listings_show_ids_states_and_uses_never_more() {
        let rows = [JoinTokenInfo {
            id: "3f2a9c1b0d4e".into(),
            uses_left: 1,
            max_uses: 2,
            created_at_ms: 1_700_000_000_123,
            expires_at_ms: 1_700_003_600_000,
            state: "active".into(),
            voter: true,
        }];
        let table = format_join_tokens(&rows);
        assert!(table.contains("3f2a9c1b0d4e"), "{table}");
        assert!(table.contains("1/2"), "{table}");
        assert!(table.contains("voters"), "{table}");
        assert!(table.contains("2023-11-14T22:13:20Z"), "{table}");
        let rows = [ApiTokenInfo {
            id: "aa".into(),
            name: "ci".into(),
            tenant: None,
            created_at_ms: 0,
            expires_at_ms: None,
            last_used_ms: None,
            state: "active".into(),
        }];
        let table = format_api_tokens(&rows);
        assert!(
            table.contains("(admin)") && table.contains("never"),
            "{table}"
        );
    }
}
