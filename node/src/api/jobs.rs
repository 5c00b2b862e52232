//! Job routes: submit (and `--test-only`), list, show, cancel, signal, requeue, time limit, hold and release, logs, checkpoints.

use super::*;

pub(super) async fn submit_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(mut req): Json<JobSubmitRequest>,
) -> Result<Json<JobSubmitResponse>, ApiError> {
    if req.tenant.is_none() {
        req.tenant = caller.tenant.clone();
    }
    let mut spec = views::job_spec(&req).map_err(bad_request)?;
    {
        let data = app.ledger().read()?;
        spec.choice = views::node_choice(&data.ledger, &req).map_err(bad_request)?;
        if spec.ckpt_region_copies > 0 && data.ledger.global_tenant_id(&spec.tenant).is_none() {
            return Err(bad_request(format!(
                "--ckpt-replicas: another region keeps copies only of a tenant shared across \
                 regions, and tenant '{}' is local to this one (give it caps across regions in \
                 its home region: `shoal tenant set {} --global-gpus N`)",
                spec.tenant, spec.tenant
            )));
        }
    }
    match write_as(
        &app,
        &caller,
        "POST /v1/jobs",
        Command::SubmitJob { spec },
        String::new,
    )
    .await?
    .0
    {
        LedgerResponse::JobId(id) => Ok(Json(JobSubmitResponse {
            id,
            // A peer region forwarded it: its submitter prints REGION:ID.
            region: caller
                .peer_region
                .as_ref()
                .map(|_| crate::regions::local_region(&app)),
        })),
        _ => Err(unexpected()),
    }
}

/// `--test-only`: where and when the job would start, from this node's
/// replica of the ledger; nothing is written. A tenant token may ask only
/// about its own tenant's jobs, as it may only submit those.
pub(super) async fn test_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(mut req): Json<JobSubmitRequest>,
) -> Result<Json<shoal_sdk::JobTestOnlyResponse>, ApiError> {
    if req.tenant.is_none() {
        req.tenant = caller.tenant.clone();
    }
    let mut spec = views::job_spec(&req).map_err(bad_request)?;
    let data = app.ledger().read()?;
    let ledger = &data.ledger;
    if let Some(scope) = scope::scope(&caller) {
        if !scope::sees_tenant(ledger, &caller, &spec.tenant) {
            return Err(forbidden(format!(
                "permission denied: a token of tenant '{scope}' cannot submit jobs for tenant '{}'",
                spec.tenant
            )));
        }
    }
    spec.choice = views::node_choice(ledger, &req).map_err(bad_request)?;
    let now_ms = crate::clock::wall_ms();
    let trial = shoal_consensus::ledger::trial_start(
        ledger,
        &spec,
        now_ms,
        app.config().scheduler.policy,
        None,
    )
    .map_err(|message| {
        ApiError(
            StatusCode::CONFLICT,
            ApiErrorBody {
                code: "rejected".into(),
                message,
            },
        )
    })?;
    Ok(Json(views::test_only(ledger, &trial, now_ms)))
}

#[derive(serde::Deserialize)]
pub(super) struct JobQuery {
    tenant: Option<String>,
    state: Option<String>,
}

pub(super) async fn list_jobs(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<JobQuery>,
) -> Result<Json<Vec<JobInfo>>, ApiError> {
    match app
        .ledger()
        .query(ProtoQuery::Jobs {
            tenant: q.tenant,
            state: q.state,
        })
        .await?
    {
        ProtoResponse::Jobs(jobs) => {
            let d = app.ledger().read()?;
            Ok(Json(scope::jobs(&d.ledger, &caller, jobs)))
        }
        _ => Err(unexpected()),
    }
}

/// The job `id`, if the caller may see it; another tenant's job answers
/// exactly as a job that does not exist, and the attempt (through `route`)
/// is an audit event.
pub(super) async fn visible_job(
    app: &Arc<Node>,
    caller: &Caller,
    id: u64,
    route: &str,
) -> Result<JobInfo, ApiError> {
    let hidden = || ApiError::from(WireError::new(ErrorCode::NotFound, format!("no job {id}")));
    match app.ledger().query(ProtoQuery::Job(id)).await {
        Ok(ProtoResponse::Jobs(mut jobs)) if jobs.len() == 1 => {
            let job = jobs.remove(0);
            let sees = scope::sees_tenant(&app.ledger().read()?.ledger, caller, &job.tenant);
            if sees {
                Ok(job)
            } else {
                audit_hidden(
                    app,
                    caller,
                    route,
                    StatusCode::NOT_FOUND,
                    format!("job {id} of tenant '{}'", job.tenant),
                );
                Err(hidden())
            }
        }
        Ok(_) => Err(unexpected()),
        Err(e) if e.code == ErrorCode::NotFound => Err(hidden()),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn show_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<JobInfo>, ApiError> {
    Ok(Json(
        visible_job(&app, &caller, id, "GET /v1/jobs/{id}").await?,
    ))
}

pub(super) async fn cancel_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<WriteResponse>, ApiError> {
    job_write(
        &app,
        &caller,
        "POST /v1/jobs/{id}/cancel",
        id,
        Command::CancelJob { job: id },
    )
    .await
}

pub(super) async fn signal_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
    Json(req): Json<shoal_sdk::JobSignalRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    let signal = shoal_consensus::workload::WarnSignal::parse(&req.signal)
        .map_err(|e| bad_request(e.replace("--signal", "signal")))?
        .signal;
    job_write(
        &app,
        &caller,
        "POST /v1/jobs/{id}/signal",
        id,
        Command::SignalJob { job: id, signal },
    )
    .await
}

pub(super) async fn requeue_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<WriteResponse>, ApiError> {
    job_write(
        &app,
        &caller,
        "POST /v1/jobs/{id}/requeue",
        id,
        Command::RequeueJob { job: id },
    )
    .await
}

pub(super) async fn set_time_limit(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
    Json(req): Json<shoal_sdk::JobTimeLimitRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    job_write(
        &app,
        &caller,
        "POST /v1/jobs/{id}/time-limit",
        id,
        Command::SetTimeLimit {
            job: id,
            time_limit_s: req.time_limit_s,
        },
    )
    .await
}

/// A write about job `id` in the caller's name, answered with its index;
/// another tenant's job is hidden (and audited) as [`write_as`] does.
pub(super) async fn job_write(
    app: &AppState,
    caller: &Caller,
    route: &str,
    id: u64,
    cmd: Command,
) -> Result<Json<WriteResponse>, ApiError> {
    let (_, index) = write_as(app, caller, route, cmd, || job_resource(app, id)).await?;
    Ok(Json(WriteResponse { index }))
}

pub(super) async fn hold_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_hold(app, caller, id, true).await
}

pub(super) async fn release_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_hold(app, caller, id, false).await
}

pub(super) async fn set_hold(
    app: AppState,
    caller: Caller,
    id: u64,
    hold: bool,
) -> Result<Json<WriteResponse>, ApiError> {
    let route = if hold {
        "POST /v1/jobs/{id}/hold"
    } else {
        "POST /v1/jobs/{id}/release"
    };
    job_write(&app, &caller, route, id, Command::HoldJob { job: id, hold }).await
}

#[derive(serde::Deserialize)]
pub(super) struct LogQuery {
    #[serde(default)]
    rank: u32,
    /// Byte offset to read from, for `shoal logs -f`.
    #[serde(default)]
    offset: u64,
}

/// A rank's log: from this node's files, else relayed from the member that
/// ran the rank (the CLI asks that member directly).
pub(super) async fn job_logs(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
    Query(q): Query<LogQuery>,
) -> Result<Response, ApiError> {
    use std::io::{Read, Seek, SeekFrom};
    if caller.tenant.is_some() {
        visible_job(&app, &caller, id, "GET /v1/jobs/{id}/logs").await?;
    }
    let path = crate::executor::log_path(&app.config().jobs_dir(), id, q.rank);
    if !path.exists() {
        // Ran on another member: this node fetches it from there, with the
        // caller's own credential (so that member scopes it the same way),
        // for a peer region, which reaches only some node of this one, and
        // for the dashboard, which talks to the node serving it.
        if let Some(resp) =
            crate::api::federation::rank_log(&app, &caller, id, q.rank, q.offset).await
        {
            return Ok(resp);
        }
    }
    let mut file = std::fs::File::open(&path).map_err(|_| {
        ApiError(
            StatusCode::NOT_FOUND,
            ApiErrorBody {
                code: "not_found".into(),
                message: format!("node {} has no log of job {id} rank {}", app.name(), q.rank),
            },
        )
    })?;
    let len = file
        .metadata()
        .map(|m| m.len())
        .map_err(|e| bad_request(format!("cannot read {}: {e}", path.display())))?;
    // Past the end: the log was rotated since the caller's last read, and
    // the current file starts again at 0 (`x-shoal-log-start` says so;
    // `x-shoal-log-rotations` counts rotations, for a caller whose offset
    // fits the new file too).
    let start = if q.offset > len { 0 } else { q.offset };
    let rotations = crate::executor::log_rotations(&path);
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(start))
        .and_then(|_| file.take(4 << 20).read_to_end(&mut bytes))
        .map_err(|e| bad_request(format!("cannot read {}: {e}", path.display())))?;
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (
                axum::http::header::HeaderName::from_static(shoal_sdk::LOG_START_HEADER),
                start.to_string(),
            ),
            (
                axum::http::header::HeaderName::from_static(shoal_sdk::LOG_ROTATIONS_HEADER),
                rotations.to_string(),
            ),
        ],
        bytes,
    )
        .into_response())
}

pub(super) async fn list_checkpoints(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<Vec<shoal_sdk::CheckpointInfo>>, ApiError> {
    if caller.tenant.is_some() {
        visible_job(&app, &caller, id, "GET /v1/jobs/{id}/checkpoints").await?;
    }
    match app.ledger().query(ProtoQuery::Checkpoints(id)).await? {
        ProtoResponse::Checkpoints(c) => Ok(Json(c)),
        _ => Err(unexpected()),
    }
}
