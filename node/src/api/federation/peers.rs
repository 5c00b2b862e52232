//! The routes between regions and about them: this region's summary and
//! peers, joining and leaving, adopting a peer's tenant, failing a region
//! over, and a forwarded rank log.

use super::*;

/// `GET /v1/federation/summary`: this region, for its peers. Served after
/// a ReadIndex read: a peer renews its region lease from this answer, so
/// it must show every takeover committed before it was asked
/// ([`crate::federation::lease`]).
pub async fn summary(State(app): State<Arc<Node>>) -> Response {
    if let Err(e) = fresh_ledger(&app).await {
        return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e);
    }
    match fed::local_summary(&app) {
        Ok(s) => Json::<RegionSummary>(s).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e),
    }
}

/// `GET /v1/federation/regions` (`shoal regions`): this region, then its
/// peers as this node last heard them.
pub async fn regions(State(app): State<Arc<Node>>) -> Response {
    let local = match fed::local_summary(&app) {
        Ok(s) => s,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e),
    };
    let now = crate::clock::wall_ms();
    let tracker = app.federation().tracker();
    let mut rows: Vec<RegionInfo> = vec![crate::federation::view::summary_row(&local, true)];
    rows.extend(fed::peers(&app).iter().map(|p| tracker.info(&p.name, now)));
    Json(rows).into_response()
}

fn own_bundle(app: &Node) -> Result<PeerBundle, Box<Response>> {
    let d = app.ledger().read().map_err(|e| {
        Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.message,
        ))
    })?;
    let cluster = d.ledger.cluster.as_ref().ok_or_else(|| {
        Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the cluster is not bootstrapped yet",
        ))
    })?;
    Ok(PeerBundle {
        region: cluster.region.clone(),
        cluster_id: cluster.cluster_id.clone(),
        ca_cert_pem: cluster.ca_cert_pem.clone(),
        api_urls: d
            .ledger
            .active_members()
            .filter(|m| m.state == shoal_sdk::MemberState::Alive)
            .map(|m| m.spec.api_url())
            .take(shoal_consensus::federation::MAX_PEER_URLS)
            .collect(),
    })
}

/// Records the peer region of `bundle` in the ledger, with the secret this
/// region presents to it: the secret goes to this node's data directory
/// first and the ledger gets only its hash (the other members fetch it
/// from here, `crate::federation::secrets`); while a member speaks an older protocol the
/// ledger keeps the secret itself, as those members read it from there.
/// Returns the peer's name.
async fn add_peer(
    app: &Node,
    caller: &Caller,
    bundle: &PeerBundle,
    outbound_secret: String,
    inbound_token_hash: String,
) -> Result<String, Response> {
    let since = shoal_consensus::federation::SEALED_SECRETS_SINCE_PROTOCOL;
    let sealed = match app.ledger().read() {
        Ok(d) => d.ledger.effective_protocol().is_some_and(|p| p >= since),
        Err(e) => {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.message,
            ))
        }
    };
    let kept = if sealed {
        // The name becomes a file name: checked before anything is written.
        shoal_consensus::federation::validate_region_name(&bundle.region)
            .map_err(|e| error(StatusCode::BAD_REQUEST, "invalid", e))?;
        crate::federation::secrets::store(app.data_dir(), &bundle.region, &outbound_secret)
            .map_err(|e| {
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("cannot keep the secret for region {}: {e}", bundle.region),
                )
            })?;
        identity::hash_secret(&outbound_secret)
    } else {
        outbound_secret
    };
    let peer = record(bundle, kept, inbound_token_hash);
    let name = peer.name.clone();
    commit(app, caller, Command::AddPeerRegion { peer }).await?;
    Ok(name)
}

fn record(
    bundle: &PeerBundle,
    outbound_secret_hash: String,
    inbound_token_hash: String,
) -> PeerRegion {
    PeerRegion {
        name: bundle.region.clone(),
        cluster_id: bundle.cluster_id.clone(),
        ca_cert_pem: bundle.ca_cert_pem.clone(),
        api_urls: bundle.api_urls.clone(),
        outbound_secret_hash,
        inbound_token_hash,
        joined_at_ms: 0,
    }
}

/// Pulls the new peer's summary at once, so `shoal regions` shows it
/// without waiting for the next round.
fn refresh_soon(app: &Arc<Node>, region: String) {
    let app = app.clone();
    tokio::spawn(async move {
        if let Ok(peer) = fed::peer_named(&app, &region) {
            let _ = fed::refresh_peer(&app, &peer).await;
        }
    });
}

/// `POST /v1/federation/join` (`SHOAL_PEER_TOKEN=T shoal federation join URL`):
/// registers this region with the one at `url` (admin there, proven by
/// `token`), then records it here.
pub async fn join(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<FederationJoinRequest>,
) -> Response {
    if let Err(r) = require_admin(&caller, "federation join") {
        return *r;
    }
    let url = req.url.trim_end_matches('/').to_string();
    if url.starts_with("https://") && req.ca_pem.is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("{url} is https: the join needs the CA it must chain to"),
        );
    }
    let bundle = match own_bundle(&app) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let (secret_for_peer, inbound_hash) = identity::new_api_token();
    let body = match serde_json::to_vec(&PeerRegisterRequest {
        bundle: bundle.clone(),
        secret: secret_for_peer,
    }) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    };
    let target = PeerTarget {
        region: format!("at {url}"),
        urls: vec![url.clone()],
        ca_pem: req.ca_pem.clone().unwrap_or_default(),
        secret: req.token.clone(),
        wan_delay: Default::default(),
    };
    let request = PeerRequest {
        method: reqwest::Method::POST,
        path: "/v1/federation/peers",
        body: Some(body),
        tenant: None,
        binary: false,
    };
    let resp = match app
        .federation()
        .send(&target, &request, fed::request_timeout(&app))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::GATEWAY_TIMEOUT,
                "region_unreachable",
                e.to_string(),
            )
        }
    };
    if resp.status != 200 {
        let why = serde_json::from_slice::<ApiErrorBody>(&resp.body)
            .map(|b| b.message)
            .unwrap_or_else(|_| format!("HTTP {}", resp.status));
        let status = if resp.status == 401 || resp.status == 403 {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::BAD_GATEWAY
        };
        return error(
            status,
            "rejected",
            format!("the region at {url} refused the join: {why}"),
        );
    }
    let answer: PeerRegisterResponse = match serde_json::from_slice(&resp.body) {
        Ok(a) => a,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                "internal",
                format!("{url} answered the join with no bundle: {e}"),
            )
        }
    };
    let name = match add_peer(&app, &caller, &answer.bundle, answer.secret, inbound_hash).await {
        Ok(name) => name,
        Err(r) => return r,
    };
    refresh_soon(&app, name.clone());
    Json(FederationJoinResponse {
        region: name,
        cluster_id: answer.bundle.cluster_id,
    })
    .into_response()
}

/// `POST /v1/federation/peers` (admin of this region): a joining region
/// registers itself; the answer is this region's bundle and the secret the
/// joiner presents from now on.
pub async fn register(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<PeerRegisterRequest>,
) -> Response {
    if let Err(r) = require_admin(&caller, "registering a peer region") {
        return *r;
    }
    let bundle = match own_bundle(&app) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let (secret, inbound_hash) = identity::new_api_token();
    let name = match add_peer(&app, &caller, &req.bundle, req.secret, inbound_hash).await {
        Ok(name) => name,
        Err(r) => return r,
    };
    refresh_soon(&app, name);
    Json(PeerRegisterResponse { bundle, secret }).into_response()
}

/// `POST /v1/federation/peers/leave`: the calling peer region leaves.
pub async fn peer_leaves(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let Some(region) = caller.peer_region.clone() else {
        return error(StatusCode::FORBIDDEN, "forbidden", "only a peer region's credential says it leaves; an admin runs `shoal federation leave REGION`");
    };
    match commit(&app, &caller, Command::RemovePeerRegion { name: region }).await {
        Ok(index) => Json(WriteResponse { index }).into_response(),
        Err(r) => r,
    }
}

/// `POST /v1/federation/regions/{region}/leave` (`shoal federation leave
/// REGION`, admin): tells the peer (bounded; an unreachable one is
/// forgotten anyway) and forgets it here.
pub async fn leave(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Path(region): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&caller, "federation leave") {
        return *r;
    }
    let peer = match fed::peer_named(&app, &region) {
        Ok(p) => p,
        Err(why) => return error(StatusCode::NOT_FOUND, "not_found", why),
    };
    let request = PeerRequest {
        method: reqwest::Method::POST,
        path: "/v1/federation/peers/leave",
        body: Some(b"{}".to_vec()),
        tenant: None,
        binary: false,
    };
    let told = app
        .federation()
        .send(
            &fed::target(&app, &peer),
            &request,
            fed::request_timeout(&app),
        )
        .await
        .is_ok_and(|r| r.status == 200);
    match commit(
        &app,
        &caller,
        Command::RemovePeerRegion {
            name: region.clone(),
        },
    )
    .await
    {
        Ok(index) => Json(FederationLeaveResponse {
            region,
            peer_told: told,
            index,
        })
        .into_response(),
        Err(r) => r,
    }
}

/// A forwarded `logs` request for a rank this node did not run: fetched
/// from the member that ran it (a peer region reaches only some node of
/// this one). `None` when this node is that member or none is known.
pub async fn rank_log(
    app: &Node,
    caller: &Caller,
    id: u64,
    rank: u32,
    offset: u64,
) -> Option<Response> {
    let (url, ca_pem) = {
        let d = app.ledger().read().ok()?;
        let job = d.ledger.workload.jobs.get(&id)?;
        let info = crate::views::job_info(&d.ledger, job);
        let name = info.nodes.get(rank as usize)?;
        let member = d.ledger.member_by_name_or_id(name)?;
        if member.id == app.id() {
            return None;
        }
        (
            member.spec.api_url(),
            d.ledger.cluster.as_ref()?.ca_cert_pem.clone(),
        )
    };
    let target = PeerTarget {
        region: fed::local_region(app),
        urls: vec![url],
        ca_pem,
        secret: caller.token.0.clone(),
        wan_delay: Default::default(),
    };
    let path = format!("/v1/jobs/{id}/logs?rank={rank}&offset={offset}");
    let request = PeerRequest {
        method: reqwest::Method::GET,
        path: &path,
        body: None,
        tenant: caller.tenant.as_deref(),
        binary: false,
    };
    let resp = app
        .federation()
        .send(&target, &request, fed::request_timeout(app))
        .await
        .ok()?;
    Some(passthrough(resp))
}

/// Waits until this node has applied everything the leader had committed
/// when asked (a linearizable read), within the cross-region timeout.
async fn fresh_ledger(app: &Node) -> Result<(), String> {
    let limit = fed::request_timeout(app);
    let status = tokio::time::timeout(limit, app.ledger().status())
        .await
        .map_err(|_| "this node cannot reach its region's leader".to_string())?
        .map_err(|e| e.message)?;
    app.ledger()
        .raft()
        .wait(Some(limit))
        .applied_index_at_least(Some(status.commit_index), "a fresh ledger")
        .await
        .map(|_| ())
        .map_err(|e| format!("this node's ledger lags its region's leader: {e}"))
}

/// `POST /v1/tenants/{name}/adopt` (`shoal tenant adopt NAME --from
/// REGION`, admin): this region's own tenant NAME becomes the one REGION
/// shares across regions, as REGION's latest summary defines it. The
/// leader adopts a shared tenant on its own only when this region has no
/// tenant of the name: a name is no identity across regions.
pub async fn adopt_tenant(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Json(req): Json<shoal_sdk::TenantAdoptRequest>,
) -> Response {
    if let Err(r) = require_admin(&caller, "tenant adopt") {
        return *r;
    }
    let home = req.from;
    if let Err(why) = fed::peer_named(&app, &home) {
        return error(StatusCode::NOT_FOUND, "not_found", why);
    }
    let report = app.federation().update(|t| {
        t.status(&home)
            .and_then(|p| p.summary.as_ref())
            .and_then(|s| s.global_tenants.iter().find(|r| r.tenant == name).cloned())
    });
    let Some(report) = report else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("region {home} shares no tenant '{name}' across regions (as its latest summary here says)"),
        );
    };
    if report.home != home {
        return error(
            StatusCode::CONFLICT,
            "rejected",
            format!(
                "tenant '{name}' of region {home} is {name}@{}: adopt it --from {}",
                report.home, report.home
            ),
        );
    }
    let planned = match app.ledger().read() {
        Ok(d) => {
            let since = shoal_consensus::federation::global_tenants::CONSENT_SINCE_PROTOCOL;
            if d.ledger.effective_protocol().is_none_or(|p| p < since) {
                return error(
                    StatusCode::CONFLICT,
                    "rejected",
                    format!("tenant adopt needs every member at protocol {since} or newer: upgrade every node first"),
                );
            }
            d.ledger.plan_consented_adoption(&report)
        }
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.message),
    };
    let cmd = match planned {
        Ok(cmd) => cmd,
        Err(why) => return error(StatusCode::CONFLICT, "rejected", why),
    };
    match commit(&app, &caller, cmd).await {
        Ok(index) => Json(WriteResponse { index }).into_response(),
        Err(r) => r,
    }
}

/// `POST /v1/federation/regions/{region}/failover` (`shoal federation
/// failover REGION`, admin): takes over now every job of REGION this region
/// holds a copy of, without waiting for `region_failover_after_ms`; each
/// still starts only after REGION's lease on it has run out.
pub async fn failover(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Path(region): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&caller, "federation failover") {
        return *r;
    }
    if let Err(why) = fed::peer_named(&app, &region) {
        return error(StatusCode::NOT_FOUND, "not_found", why);
    }
    let pending: Vec<u64> = match app.ledger().read() {
        Ok(d) => d
            .ledger
            .federation
            .foreign
            .get(&region)
            .map(|jobs| {
                jobs.iter()
                    .filter(|(_, j)| j.adopted_as.is_none())
                    .map(|(id, _)| *id)
                    .collect()
            })
            .unwrap_or_default(),
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.message),
    };
    let wait_ms = app.config().federation.takeover_wait_ms();
    let mut adopted = Vec::new();
    let mut refused = Vec::new();
    for origin_job in pending {
        let cmd = Command::AdoptForeignJob {
            origin: region.clone(),
            origin_job,
            wait_ms,
        };
        match app.ledger().write_as(&caller.token, cmd).await {
            Ok((LedgerResponse::JobId(id), _)) => adopted.push(shoal_sdk::AdoptedJob {
                origin: region.clone(),
                origin_job,
                job: id,
            }),
            Ok((LedgerResponse::Rejected(why) | LedgerResponse::Denied(why), _)) => {
                refused.push(format!("{region}:{origin_job}: {why}"))
            }
            Ok((other, _)) => refused.push(format!("{region}:{origin_job}: {other:?}")),
            Err(e) => refused.push(format!("{region}:{origin_job}: {}", e.message)),
        }
    }
    Json(shoal_sdk::FailoverResponse {
        region,
        adopted,
        refused,
        starts_after_ms: wait_ms,
    })
    .into_response()
}
