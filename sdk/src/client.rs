//! A small blocking-free HTTP client over the API. Every call returns a typed
//! error carrying the server's message, so the CLI can print one clear line.

use crate::types::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the Shoal API at {url}: {}", causes(.source))]
    Connect {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("refusing to send a token in clear text to {url}: a node off this machine is reached over https")]
    ClearText { url: String },
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("unexpected answer from {url}: {message}")]
    Decode { url: String, message: String },
}

/// An error and its causes on one line: reqwest's own message hides why a
/// connection failed (refused, a certificate the cluster CA did not sign).
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

/// Whether a token may go to `url`: over https anywhere, over plain http
/// only to this machine's loopback.
fn may_carry_token(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return false;
    };
    let host = parsed
        .host_str()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    match parsed.scheme() {
        "https" => true,
        "http" => {
            host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        _ => false,
    }
}

/// [`Client::job_log_chunk`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogChunk {
    pub bytes: Vec<u8>,
    pub start: u64,
    pub rotations: u64,
}

/// Talks to one node's HTTP API with a bearer token.
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    /// Sent as [`crate::REGION_HEADER`]: the node forwards the request to
    /// that region (`--region R|auto`).
    region: Option<String>,
}

impl Client {
    pub fn new(base: impl Into<String>, token: Option<String>) -> Self {
        // No redirects: the API sends none, and one could carry the token
        // to another scheme.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self::with_http(base, token, http)
    }

    /// A client over `http`, e.g. one whose TLS trusts only the cluster CA.
    pub fn with_http(
        base: impl Into<String>,
        token: Option<String>,
        http: reqwest::Client,
    ) -> Self {
        let base = base.into().trim_end_matches('/').to_string();
        Client {
            base,
            token,
            http,
            region: None,
        }
    }

    /// The same client, asking the node to run each request in `region`
    /// (a peer region's name, or [`crate::AUTO_REGION`] for a submission).
    pub fn in_region(&self, region: Option<&str>) -> Self {
        let mut c = self.clone();
        c.region = region.map(str::to_string);
        c
    }

    /// The region [`Client::in_region`] asked for.
    pub fn region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    /// The same credentials and TLS trust, talking to another node. The
    /// token goes along over https, or to plain-http loopback only when this
    /// client talks plain-http loopback itself (a one-machine cluster): a
    /// loopback URL a remote member published is the *caller's* loopback,
    /// where anyone on this machine may listen.
    pub fn at(&self, base: impl Into<String>) -> Self {
        let base = base.into();
        let local_cluster = self.base.starts_with("http://") && may_carry_token(&self.base);
        let token = self
            .token
            .clone()
            .filter(|_| base.starts_with("https://") || local_cluster);
        Self::with_http(base, token, self.http.clone()).in_region(self.region.as_deref())
    }

    fn authorize(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        let req = match &self.region {
            Some(r) => req.header(crate::REGION_HEADER, r),
            None => req,
        };
        match &self.token {
            Some(_) if !may_carry_token(url) => Err(ClientError::ClearText {
                url: url.to_string(),
            }),
            Some(t) => Ok(req.bearer_auth(t)),
            None => Ok(req),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<T, ClientError> {
        let req = self.authorize(req, url)?;
        let resp = req.send().await.map_err(|source| ClientError::Connect {
            url: url.to_string(),
            source,
        })?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| ClientError::Decode {
            url: url.to_string(),
            message: e.to_string(),
        })?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<ApiErrorBody>(&bytes) {
                Ok(body) => ClientError::Api {
                    status: status.as_u16(),
                    code: body.code,
                    message: body.message,
                },
                Err(_) => ClientError::Api {
                    status: status.as_u16(),
                    code: "http".into(),
                    message: format!("{} returned HTTP {}", url, status),
                },
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
            url: url.to_string(),
            message: e.to_string(),
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = format!("{}{}", self.base, path);
        self.send(self.http.get(&url), &url).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let url = format!("{}{}", self.base, path);
        self.send(self.http.post(&url).json(body), &url).await
    }

    /// The raw body of `GET path`.
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let url = format!("{}{}", self.base, path);
        let bytes = self.get_raw(self.http.get(&url), &url).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `shoal regions`: this region and its peers, as this node sees them.
    pub async fn regions(&self) -> Result<Vec<crate::RegionInfo>, ClientError> {
        self.get("/v1/federation/regions").await
    }

    /// What this region tells its peers (`GET /v1/federation/summary`).
    pub async fn region_summary(&self) -> Result<crate::RegionSummary, ClientError> {
        self.get("/v1/federation/summary").await
    }

    /// `shoal federation join URL` with the other region's admin token (admin).
    pub async fn federation_join(
        &self,
        req: &crate::FederationJoinRequest,
    ) -> Result<crate::FederationJoinResponse, ClientError> {
        self.post("/v1/federation/join", req).await
    }

    /// `shoal federation leave REGION` (admin).
    pub async fn federation_leave(
        &self,
        region: &str,
    ) -> Result<crate::FederationLeaveResponse, ClientError> {
        self.post(
            &format!("/v1/federation/regions/{region}/leave"),
            &serde_json::json!({}),
        )
        .await
    }

    /// `shoal federation failover REGION` (admin): takes over now the jobs
    /// of REGION this region holds checkpoint copies of.
    pub async fn federation_failover(
        &self,
        region: &str,
    ) -> Result<crate::FailoverResponse, ClientError> {
        self.post(
            &format!("/v1/federation/regions/{region}/failover"),
            &serde_json::json!({}),
        )
        .await
    }

    /// A joining region registers itself with this one (admin of this one).
    pub async fn federation_register(
        &self,
        req: &crate::PeerRegisterRequest,
    ) -> Result<crate::PeerRegisterResponse, ClientError> {
        self.post("/v1/federation/peers", req).await
    }

    /// A peer region says it leaves (with the secret this region gave it).
    pub async fn federation_unregister(&self) -> Result<WriteResponse, ClientError> {
        self.post("/v1/federation/peers/leave", &serde_json::json!({}))
            .await
    }

    pub async fn status(&self) -> Result<StatusResponse, ClientError> {
        self.get("/v1/status").await
    }

    /// The cluster CA and any rotation in progress (admin only).
    pub async fn ca_status(&self) -> Result<CaStatus, ClientError> {
        self.get("/v1/ca").await
    }

    /// Starts a rotation to a new cluster CA (admin only); refused while
    /// one is in progress.
    pub async fn rotate_ca(&self) -> Result<CaRotateResponse, ClientError> {
        self.post("/v1/ca/rotate", &serde_json::json!({})).await
    }

    pub async fn nodes(&self) -> Result<Vec<NodeInfo>, ClientError> {
        self.get("/v1/nodes").await
    }

    pub async fn peers(&self) -> Result<Vec<PeerView>, ClientError> {
        self.get("/v1/peers").await
    }

    /// A single-use join token valid for `ttl_s` (the server's default when
    /// `None`).
    pub async fn create_token(
        &self,
        ttl_s: Option<u64>,
    ) -> Result<TokenCreateResponse, ClientError> {
        self.create_join_token(&TokenCreateRequest {
            ttl_s,
            uses: None,
            voter: false,
        })
        .await
    }

    pub async fn create_join_token(
        &self,
        req: &TokenCreateRequest,
    ) -> Result<TokenCreateResponse, ClientError> {
        self.post("/v1/tokens", req).await
    }

    /// Join tokens, without their secrets (admin only).
    pub async fn join_tokens(&self) -> Result<Vec<JoinTokenInfo>, ClientError> {
        self.get("/v1/tokens").await
    }

    pub async fn revoke_join_token(&self, id: &str) -> Result<WriteResponse, ClientError> {
        self.post("/v1/tokens/revoke", &TokenRevokeRequest { id: id.into() })
            .await
    }

    pub async fn create_api_token(
        &self,
        req: &ApiTokenCreateRequest,
    ) -> Result<ApiTokenCreateResponse, ClientError> {
        self.post("/v1/api-tokens", req).await
    }

    /// API tokens, without their secrets (admin only).
    pub async fn api_tokens(&self) -> Result<Vec<ApiTokenInfo>, ClientError> {
        self.get("/v1/api-tokens").await
    }

    /// Revokes the API token with this id or name.
    pub async fn revoke_api_token(&self, id: &str) -> Result<WriteResponse, ClientError> {
        self.post(
            "/v1/api-tokens/revoke",
            &TokenRevokeRequest { id: id.into() },
        )
        .await
    }

    /// Gives the bootstrap admin token (named `admin`) a new secret.
    pub async fn rotate_admin_token(&self) -> Result<AdminTokenRotateResponse, ClientError> {
        self.post("/v1/api-tokens/rotate-admin", &serde_json::json!({}))
            .await
    }

    pub async fn put_attr(&self, key: &str, value: &str) -> Result<WriteResponse, ClientError> {
        self.post(
            "/v1/attrs",
            &AttrPut {
                key: key.into(),
                value: value.into(),
            },
        )
        .await
    }

    pub async fn attrs(
        &self,
        prefix: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, ClientError> {
        let url = format!("{}/v1/attrs", self.base);
        self.send(self.http.get(&url).query(&[("prefix", prefix)]), &url)
            .await
    }

    /// Drains a node (`drain = true`) or returns it to service.
    /// `shoal gpu drain|undrain NODE:IDX`.
    pub async fn drain_gpu(
        &self,
        node: &str,
        gpu: u32,
        drain: bool,
        reason: Option<&str>,
    ) -> Result<WriteResponse, ClientError> {
        let action = if drain { "drain" } else { "undrain" };
        self.post(
            &format!("/v1/nodes/{node}/gpus/{gpu}/{action}"),
            &serde_json::json!({ "reason": reason }),
        )
        .await
    }

    pub async fn drain_node(&self, node: &str, drain: bool) -> Result<WriteResponse, ClientError> {
        let action = if drain { "drain" } else { "undrain" };
        self.post(
            &format!("/v1/nodes/{node}/{action}"),
            &serde_json::json!({}),
        )
        .await
    }

    pub async fn remove_node(&self, node: &str) -> Result<WriteResponse, ClientError> {
        self.post(
            &format!("/v1/nodes/{}/remove", node),
            &serde_json::json!({}),
        )
        .await
    }

    pub async fn submit_job(
        &self,
        req: &JobSubmitRequest,
    ) -> Result<JobSubmitResponse, ClientError> {
        self.post("/v1/jobs", req).await
    }

    /// Where and when `req` would start; nothing is submitted (`--test-only`).
    pub async fn test_job(
        &self,
        req: &JobSubmitRequest,
    ) -> Result<crate::JobTestOnlyResponse, ClientError> {
        self.post("/v1/jobs/test-only", req).await
    }

    /// Jobs, filtered by tenant and state when given.
    pub async fn jobs(
        &self,
        tenant: Option<&str>,
        state: Option<&str>,
    ) -> Result<Vec<JobInfo>, ClientError> {
        let url = format!("{}/v1/jobs", self.base);
        let mut query = Vec::new();
        if let Some(t) = tenant {
            query.push(("tenant", t));
        }
        if let Some(s) = state {
            query.push(("state", s));
        }
        self.send(self.http.get(&url).query(&query), &url).await
    }

    pub async fn job(&self, id: u64) -> Result<JobInfo, ClientError> {
        self.get(&format!("/v1/jobs/{id}")).await
    }

    pub async fn cancel_job(&self, id: u64) -> Result<WriteResponse, ClientError> {
        self.post(&format!("/v1/jobs/{id}/cancel"), &serde_json::json!({}))
            .await
    }

    /// Sends `signal` (`USR1`, `SIGTERM`, `10`) to every rank of a running
    /// job, which goes on running (`scancel --signal`).
    pub async fn signal_job(&self, id: u64, signal: &str) -> Result<WriteResponse, ClientError> {
        self.post(
            &format!("/v1/jobs/{id}/signal"),
            &crate::JobSignalRequest {
                signal: signal.to_string(),
            },
        )
        .await
    }

    /// User names and their tenants (`sacctmgr list user`); a tenant token
    /// sees those of its own tenants.
    pub async fn users(&self) -> Result<Vec<crate::UserInfo>, ClientError> {
        self.get("/v1/users").await
    }

    /// Maps `name` to `tenant`, or removes it with `None` (admin).
    pub async fn set_user(
        &self,
        name: &str,
        tenant: Option<&str>,
    ) -> Result<WriteResponse, ClientError> {
        self.post(
            "/v1/users",
            &crate::UserInfo {
                name: name.to_string(),
                tenant: tenant.map(str::to_string),
            },
        )
        .await
    }

    /// Stops a running job and queues it again (`scontrol requeue`).
    pub async fn requeue_job(&self, id: u64) -> Result<WriteResponse, ClientError> {
        self.post(&format!("/v1/jobs/{id}/requeue"), &serde_json::json!({}))
            .await
    }

    /// A new time limit for a job that has not ended (`scontrol update
    /// JobId=N TimeLimit=T`); a tenant token may only lower it.
    pub async fn set_time_limit(
        &self,
        id: u64,
        time_limit_s: u64,
    ) -> Result<WriteResponse, ClientError> {
        self.post(
            &format!("/v1/jobs/{id}/time-limit"),
            &crate::JobTimeLimitRequest { time_limit_s },
        )
        .await
    }

    /// Keeps a waiting job from the scheduler until released (`scontrol hold`).
    pub async fn hold_job(&self, id: u64) -> Result<WriteResponse, ClientError> {
        self.post(&format!("/v1/jobs/{id}/hold"), &serde_json::json!({}))
            .await
    }

    /// Lets a held job be scheduled again (`scontrol release`).
    pub async fn release_job(&self, id: u64) -> Result<WriteResponse, ClientError> {
        self.post(&format!("/v1/jobs/{id}/release"), &serde_json::json!({}))
            .await
    }

    pub async fn create_tenant(&self, req: &TenantRequest) -> Result<WriteResponse, ClientError> {
        self.post("/v1/tenants", req).await
    }

    pub async fn set_tenant(&self, req: &TenantRequest) -> Result<WriteResponse, ClientError> {
        self.post(&format!("/v1/tenants/{}", req.name), req).await
    }

    pub async fn tenants(&self) -> Result<Vec<TenantInfo>, ClientError> {
        self.get("/v1/tenants").await
    }

    /// `shoal tenant adopt NAME --from REGION` (admin): this region's own
    /// tenant `name` becomes the one `from` shares across regions.
    pub async fn adopt_tenant(&self, name: &str, from: &str) -> Result<WriteResponse, ClientError> {
        self.post(
            &format!("/v1/tenants/{name}/adopt"),
            &crate::federation::TenantAdoptRequest { from: from.into() },
        )
        .await
    }

    /// Tenants capped across regions (`shoal tenant global`).
    pub async fn global_tenants(
        &self,
    ) -> Result<Vec<crate::federation::GlobalTenantInfo>, ClientError> {
        self.get("/v1/global-tenants").await
    }

    pub async fn quota(&self) -> Result<Vec<QuotaInfo>, ClientError> {
        self.get("/v1/quota").await
    }

    pub async fn checkpoints(&self, id: u64) -> Result<Vec<CheckpointInfo>, ClientError> {
        self.get(&format!("/v1/jobs/{id}/checkpoints")).await
    }

    /// Stores a chunk frame on this node (verified by the node).
    pub async fn put_chunk(&self, id_hex: &str, frame: Vec<u8>) -> Result<(), ClientError> {
        let url = format!("{}/v1/chunks/{id_hex}", self.base);
        let req = self
            .http
            .put(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(frame);
        self.get_raw(req, &url).await.map(|_| ())
    }

    /// Which of these chunks this node holds.
    pub async fn has_chunks(&self, ids_hex: &[String]) -> Result<Vec<bool>, ClientError> {
        self.post("/v1/chunks/has", &ids_hex).await
    }

    pub async fn put_object(&self, req: &ObjectPut) -> Result<WriteResponse, ClientError> {
        self.post("/v1/objects", req).await
    }

    /// Records an object whose chunks this node holds, once it has copied
    /// them to more nodes of its region ([`ObjectImport`]).
    pub async fn import_object(&self, req: &ObjectImport) -> Result<ObjectImported, ClientError> {
        let url = format!("{}/v1/objects/import", self.base);
        let patience = Duration::from_secs(30) + req.replication_allowance();
        self.send(self.http.post(&url).json(req).timeout(patience), &url)
            .await
    }

    /// Objects at or below `path`.
    pub async fn objects(&self, path: &str) -> Result<Vec<ObjectInfo>, ClientError> {
        let url = format!("{}/v1/objects", self.base);
        self.send(self.http.get(&url).query(&[("path", path)]), &url)
            .await
    }

    pub async fn remove_object(&self, path: &str) -> Result<WriteResponse, ClientError> {
        self.post("/v1/objects/rm", &serde_json::json!({ "path": path }))
            .await
    }

    /// Events with an id above `after`, oldest first.
    pub async fn events(&self, after: u64) -> Result<Vec<EventInfo>, ClientError> {
        self.get(&format!("/v1/events?after={after}")).await
    }

    /// Injects a fault into a simulated GPU of this node.
    pub async fn gpu_fault(&self, gpu: u32, fault: &str) -> Result<serde_json::Value, ClientError> {
        self.post(
            "/v1/debug/gpu-fault",
            &GpuFaultRequest {
                gpu,
                fault: fault.to_string(),
            },
        )
        .await
    }

    /// The node's `/metrics` text (OpenMetrics).
    pub async fn metrics_text(&self) -> Result<String, ClientError> {
        let url = format!("{}/metrics", self.base);
        let bytes = self.get_raw(self.http.get(&url), &url).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A stored chunk frame from this node's chunk store (hex chunk id).
    pub async fn chunk(&self, id_hex: &str) -> Result<Vec<u8>, ClientError> {
        let url = format!("{}/v1/chunks/{id_hex}", self.base);
        self.get_raw(self.http.get(&url), &url).await
    }

    /// A chunk frame by id, which the node fetches from member `holder` of
    /// its region when it does not hold the chunk itself: how a chunk of
    /// another region's object is read through a node of that region.
    pub async fn chunk_from(&self, id_hex: &str, holder: u64) -> Result<Vec<u8>, ClientError> {
        let url = format!("{}/v1/chunks/{id_hex}", self.base);
        let req = self.http.get(&url).query(&[("from", holder)]);
        self.get_raw(req, &url).await
    }

    /// Up to 4 MiB of a rank's log on this node from `offset`: the bytes,
    /// the offset they start at (0 instead of `offset` when the file is
    /// shorter: it was rotated), and how often the log was rotated so far.
    pub async fn job_log_chunk(
        &self,
        id: u64,
        rank: u32,
        offset: u64,
    ) -> Result<LogChunk, ClientError> {
        let url = format!("{}/v1/jobs/{id}/logs", self.base);
        let req = self
            .http
            .get(&url)
            .query(&[("rank", rank as u64), ("offset", offset)]);
        let (headers, bytes) = self.get_raw_with_headers(req, &url).await?;
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
        };
        let start = header(crate::LOG_START_HEADER).unwrap_or(offset);
        let rotations = header(crate::LOG_ROTATIONS_HEADER).unwrap_or(0);
        Ok(LogChunk {
            bytes,
            start,
            rotations,
        })
    }

    /// Raw bytes of a rank's log on this node, from `offset`.
    pub async fn job_log(&self, id: u64, rank: u32, offset: u64) -> Result<Vec<u8>, ClientError> {
        let url = format!("{}/v1/jobs/{id}/logs", self.base);
        let req = self
            .http
            .get(&url)
            .query(&[("rank", rank as u64), ("offset", offset)]);
        self.get_raw(req, &url).await
    }

    /// A consistent backup of the ledger (`GET /v1/snapshot`, admin only),
    /// written to `out` as it arrives; returns the bytes written.
    pub async fn snapshot_to(
        &self,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<u64, ClientError> {
        let url = format!("{}/v1/snapshot", self.base);
        let req = self.authorize(self.http.get(&url), &url)?;
        let mut resp = req.send().await.map_err(|source| ClientError::Connect {
            url: url.clone(),
            source,
        })?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp.bytes().await.unwrap_or_default();
            let (code, message) = match serde_json::from_slice::<ApiErrorBody>(&bytes) {
                Ok(b) => (b.code, b.message),
                Err(_) => ("http".into(), format!("{url} returned HTTP {status}")),
            };
            return Err(ClientError::Api {
                status: status.as_u16(),
                code,
                message,
            });
        }
        let decode = |message: String| ClientError::Decode {
            url: url.clone(),
            message,
        };
        let mut written = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| decode(e.to_string()))? {
            out.write_all(&chunk)
                .map_err(|e| decode(format!("cannot write the snapshot: {e}")))?;
            written += chunk.len() as u64;
        }
        Ok(written)
    }

    async fn get_raw(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<Vec<u8>, ClientError> {
        self.get_raw_with_headers(req, url)
            .await
            .map(|(_, bytes)| bytes)
    }

    /// A raw GET's headers and body; an error status is a [`ClientError::Api`].
    async fn get_raw_with_headers(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<(reqwest::header::HeaderMap, Vec<u8>), ClientError> {
        let url = url.to_string();
        let req = self.authorize(req, &url)?;
        let resp = req.send().await.map_err(|source| ClientError::Connect {
            url: url.clone(),
            source,
        })?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(|e| ClientError::Decode {
            url: url.clone(),
            message: e.to_string(),
        })?;
        if !status.is_success() {
            let message = serde_json::from_slice::<ApiErrorBody>(&bytes)
                .map(|b| b.message)
                .unwrap_or_else(|_| format!("{url} returned HTTP {status}"));
            return Err(ClientError::Api {
                status: status.as_u16(),
                code: "http".into(),
                message,
            });
        }
        Ok((headers, bytes.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_in_clear_text_only_to_loopback() {
        for ok in [
            "https://10.0.0.1:7070/v1/status",
            "https://node-a:7070/",
            "http://127.0.0.1:7070/v1/status",
            "http://127.0.0.5:1/",
            "http://[::1]:7070/",
            "http://localhost:7070/",
        ] {
            assert!(may_carry_token(ok), "{ok}");
        }
        for refused in [
            "http://10.0.0.1:7070/v1/status",
            "http://0.0.0.0:7070/",
            "http://node-a:7070/",
            "http://localhost.evil.example/",
            "ftp://127.0.0.1/",
            "not a url",
        ] {
            assert!(!may_carry_token(refused), "{refused}");
        }
    }

    #[test]
    fn a_token_follows_to_other_nodes_only_over_https() {
        let local = Client::new("http://127.0.0.1:7070", Some("secret".into()));
        assert_eq!(local.at("http://127.0.0.1:7071").token(), Some("secret"));
        let remote = Client::new("https://10.0.0.1:7070", Some("secret".into()));
        assert_eq!(remote.at("https://10.0.0.2:7070").token(), Some("secret"));
        assert_eq!(remote.at("http://127.0.0.1:7071").token(), None);
    }

    #[tokio::test]
    async fn a_client_refuses_before_it_connects() {
        let c = Client::new("http://192.0.2.1:7070", Some("secret".into()));
        match c.status().await {
            Err(ClientError::ClearText { url }) => assert!(url.contains("192.0.2.1")),
            other => panic!("expected a clear-text refusal, got {other:?}"),
        }
    }
}
