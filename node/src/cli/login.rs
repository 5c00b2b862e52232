//! Where the CLI connects and whom it trusts: `shoal login URL` records a
//! cluster's API URL, a token and the cluster CA in the user's settings file
//! (`$SHOAL_CLI_CONFIG`, else `$XDG_CONFIG_HOME/shoal/cli.toml`, else
//! `~/.config/shoal/cli.toml`, 0600), and every later command checks every
//! node it talks to (including the nodes `cp`, `logs` and `ckpt restore` are
//! sent to) against that CA before a token leaves the machine.

use crate::identity::{self, write_private};
use serde::{Deserialize, Serialize};
use shoal_mesh::api_tls::{api_client_config, der_to_pem, ApiServerVerifier, ApiTrust};
use shoal_mesh::tls::{fingerprint_der, pem_to_der};
use shoal_sdk::Client;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The user's CLI settings (`cli.toml`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct CliSettings {
    /// The API URL commands use without `--api` or `SHOAL_API`.
    pub api: Option<String>,
    /// The token sent to that API (and to the nodes it names).
    pub token: Option<String>,
    /// The cluster CA certificate(s), PEM.
    pub ca_pem: Option<String>,
    /// Its fingerprint, for people comparing with `shoal status`.
    pub ca_fingerprint: Option<String>,
    pub cluster_id: Option<String>,
}

/// The settings file's path; `None` without a home directory.
pub fn settings_path() -> Option<PathBuf> {
    let from_env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = from_env("SHOAL_CLI_CONFIG") {
        return Some(PathBuf::from(p));
    }
    let base = from_env("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| from_env("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("shoal").join("cli.toml"))
}

/// The settings, or the defaults when there is no file. A file that is
/// there but unreadable or invalid is an error, not silently ignored.
pub fn load_settings() -> anyhow::Result<CliSettings> {
    let Some(path) = settings_path() else {
        return Ok(CliSettings::default());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CliSettings::default()),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

fn save_settings(settings: &CliSettings) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let path = settings_path()
        .ok_or_else(|| anyhow::anyhow!("no home directory: set SHOAL_CLI_CONFIG to a file path"))?;
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    let text = toml::to_string(settings)?;
    write_private(&path, text.as_bytes(), 0o600)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// What the CLI was asked to use, before defaults.
pub struct Requested<'a> {
    pub api: Option<&'a str>,
    pub token: Option<&'a str>,
    pub data_dir: &'a Path,
}

/// The client for a command: the API URL (`--api`, `SHOAL_API`, the
/// settings, the agent running on the data dir, then loopback), the token (`--token-file`, `SHOAL_TOKEN`, the
/// settings' token when talking to the settings' API, then the data dir's
/// `admin.token`) and the CA every https node must chain to
/// (`SHOAL_CA_FILE`, the settings, then the data dir's identity).
pub fn connect(req: &Requested) -> anyhow::Result<Client> {
    let settings = load_settings()?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let api = req
        .api
        .map(str::to_string)
        .or_else(|| env("SHOAL_API"))
        .or_else(|| settings.api.clone())
        .or_else(|| local_agent_api(req.data_dir))
        .unwrap_or_else(|| "http://127.0.0.1:7070".into());
    let logged_in_here = settings.api.as_deref().map(same_api) == Some(same_api(&api));
    let token = req
        .token
        .map(str::to_string)
        .or_else(|| env("SHOAL_TOKEN"))
        .or_else(|| settings.token.clone().filter(|_| logged_in_here))
        .or_else(|| {
            std::fs::read_to_string(req.data_dir.join(identity::ADMIN_TOKEN_FILE))
                .ok()
                .map(|t| t.trim().to_string())
        });
    let trust = match trusted_ca(&settings, req.data_dir)? {
        Some(pem) => ApiTrust::Cas(pem),
        None => ApiTrust::Missing,
    };
    Ok(Client::with_http(api, token, http_client(trust)?))
}

/// A client of `url` that trusts `ca_pem` (PEM) for https and nothing
/// else: what the CLI builds, for tools and tests.
pub fn client_trusting(
    url: impl Into<String>,
    token: Option<String>,
    ca_pem: Option<String>,
) -> anyhow::Result<Client> {
    let trust = ca_pem.map(ApiTrust::Cas).unwrap_or(ApiTrust::Missing);
    Ok(Client::with_http(url, token, http_client(trust)?))
}

/// The HTTP client [`client_trusting`] wraps, for probes that read more
/// of a response than [`Client`] returns (its headers).
pub fn http_trusting(ca_pem: Option<String>) -> anyhow::Result<reqwest::Client> {
    http_client(ca_pem.map(ApiTrust::Cas).unwrap_or(ApiTrust::Missing))
}

/// The API URL the agent on `data_dir` published (`agent.json`): an
/// operator on a node needs no flags.
fn local_agent_api(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join(identity::RUNTIME_FILE)).ok()?;
    let info: identity::RuntimeInfo = serde_json::from_str(&text).ok()?;
    Some(info.api_url)
}

fn same_api(url: &str) -> String {
    url.trim_end_matches('/').to_ascii_lowercase()
}

fn trusted_ca(settings: &CliSettings, data_dir: &Path) -> anyhow::Result<Option<String>> {
    if let Some(path) = std::env::var_os("SHOAL_CA_FILE").filter(|p| !p.is_empty()) {
        let pem = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("SHOAL_CA_FILE {}: {e}", Path::new(&path).display()))?;
        return Ok(Some(pem));
    }
    if let Some(pem) = &settings.ca_pem {
        return Ok(Some(pem.clone()));
    }
    // An operator on a node: the node's own identity names the CA.
    Ok(identity::load_identity(data_dir)
        .ok()
        .flatten()
        .map(|id| id.credentials.ca_pem))
}

fn http_client(trust: ApiTrust) -> anyhow::Result<reqwest::Client> {
    let verifier = ApiServerVerifier::new(trust);
    http_client_with(verifier)
}

fn http_client_with(verifier: Arc<ApiServerVerifier>) -> anyhow::Result<reqwest::Client> {
    let tls = api_client_config(verifier)?;
    // No redirects: the API sends none, and one could carry the token to
    // plain http.
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()?)
}

/// What `shoal login` recorded.
#[derive(Serialize)]
struct LoginOutcome {
    api: String,
    cluster_id: String,
    ca_fingerprint: Option<String>,
    settings: String,
}

/// `shoal login URL`: checks the URL's node against the CA (pinned with
/// `--ca-fingerprint`, else the one it presents, trusted on first use and
/// said so), checks the token against the cluster, and records all three.
pub async fn login(
    url: &str,
    token: Option<String>,
    pin: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let url = url.trim_end_matches('/').to_string();
    let parsed = reqwest::Url::parse(&url).map_err(|e| {
        anyhow::anyhow!("{url} is not a URL ({e}): give e.g. https://10.0.0.5:7070")
    })?;
    let token = token.ok_or_else(|| {
        anyhow::anyhow!(
            "login needs a token: SHOAL_TOKEN or --token-file FILE (from `shoal token api` on the cluster)"
        )
    })?;
    let mut settings = load_settings()?;
    let ca_pem = match parsed.scheme() {
        "https" => Some(learn_ca(&url, pin, &settings).await?),
        "http" => {
            if pin.is_some() {
                anyhow::bail!("--ca-fingerprint needs an https URL; {url} is plain http");
            }
            None
        }
        other => {
            anyhow::bail!("{url}: the scheme must be https (or http on loopback), not {other}")
        }
    };
    let trust = ca_pem
        .clone()
        .map(ApiTrust::Cas)
        .unwrap_or(ApiTrust::Missing);
    let client = Client::with_http(url.clone(), Some(token.clone()), http_client(trust)?);
    let status = client
        .status()
        .await
        .map_err(|e| anyhow::anyhow!("the cluster did not accept the token: {e}"))?;
    let fingerprint = ca_pem
        .as_deref()
        .and_then(|pem| pem_to_der(pem).ok())
        .map(|der| fingerprint_der(&der));
    settings = CliSettings {
        api: Some(url.clone()),
        token: Some(token),
        ca_pem,
        ca_fingerprint: fingerprint.clone(),
        cluster_id: Some(status.cluster_id.clone()),
    };
    let path = save_settings(&settings)?;
    let outcome = LoginOutcome {
        api: url,
        cluster_id: status.cluster_id,
        ca_fingerprint: fingerprint,
        settings: path.display().to_string(),
    };
    super::emit(json, &outcome, || {
        format!(
            "logged in to cluster {} at {}\nsettings in {}\n",
            outcome.cluster_id, outcome.api, outcome.settings
        )
    })
}

/// The CA of another region's API at `url`, for `shoal federation join`:
/// the pinned one (`--ca-fingerprint`), else the one it presents (first
/// use, said on stderr); none for a plain-http loopback URL.
pub async fn peer_ca(url: &str, pin: Option<&str>) -> anyhow::Result<Option<String>> {
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        anyhow::anyhow!("{url} is not a URL ({e}): give e.g. https://10.1.0.5:7070")
    })?;
    match parsed.scheme() {
        "https" => Ok(Some(learn_ca(url, pin, &CliSettings::default()).await?)),
        "http" if pin.is_none() => Ok(None),
        "http" => anyhow::bail!("--ca-fingerprint needs an https URL; {url} is plain http"),
        other => {
            anyhow::bail!("{url}: the scheme must be https (or http on loopback), not {other}")
        }
    }
}

/// The CA the node at `url` is signed by: the pinned one, else the one the
/// settings already trust (a changed CA is refused, as ssh refuses a
/// changed host key), else whatever it presents (said on stderr).
async fn learn_ca(url: &str, pin: Option<&str>, settings: &CliSettings) -> anyhow::Result<String> {
    let known = settings.ca_pem.clone().filter(|_| pin.is_none());
    let trust = match (pin, &known) {
        (Some(fp), _) => ApiTrust::Pinned(fp.trim().to_string()),
        (None, Some(pem)) => ApiTrust::Cas(pem.clone()),
        (None, None) => ApiTrust::FirstUse,
    };
    let first_use = matches!(trust, ApiTrust::FirstUse);
    let verifier = ApiServerVerifier::new(trust);
    let probe = Client::with_http(url, None, http_client_with(verifier.clone())?);
    if let Err(e) = probe.get_text("/health").await {
        if known.is_some() {
            anyhow::bail!(
                "{url} is not signed by the cluster CA recorded at the last login ({e}); if the cluster really changed, pin the new one with --ca-fingerprint"
            );
        }
        anyhow::bail!("{e}");
    }
    let ca = verifier
        .seen_ca()
        .ok_or_else(|| anyhow::anyhow!("{url} presented no cluster CA"))?;
    if first_use {
        eprintln!(
            "trusting the cluster CA {} that {url} presented (first use): compare it with `shoal status` on a node, or pin it with --ca-fingerprint",
            fingerprint_der(ca.as_ref())
        );
    }
    Ok(match known {
        Some(pem) => pem,
        None => der_to_pem(ca.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_refuse_unknown_keys() {
        let s = CliSettings {
            api: Some("https://10.0.0.1:7070".into()),
            token: Some("t".into()),
            ca_pem: Some("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n".into()),
            ca_fingerprint: Some("ab".into()),
            cluster_id: Some("c".into()),
        };
        let text = toml::to_string(&s).expect("encode");
        assert_eq!(toml::from_str::<CliSettings>(&text).expect("decode"), s);
        assert!(toml::from_str::<CliSettings>("apii = \"x\"").is_err());
    }

    #[test]
    fn the_stored_token_goes_only_to_the_stored_api() {
        assert_eq!(same_api("https://A:1/"), same_api("https://a:1"));
        assert_ne!(same_api("https://a:1"), same_api("https://b:1"));
    }
}
