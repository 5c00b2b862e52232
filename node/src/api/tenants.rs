//! Tenant routes: tenants and their limits, caps across regions, quota, and the Slurm user names tenants stand behind.

use super::*;

/// `sacctmgr list user`: the names this caller's tenants stand behind.
pub(super) async fn list_users(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<shoal_sdk::UserInfo>>, ApiError> {
    let data = app.ledger().read()?;
    let ledger = &data.ledger;
    Ok(Json(
        ledger
            .workload
            .users
            .iter()
            .filter(|(_, tenant)| scope::sees_tenant(ledger, &caller, tenant))
            .map(|(name, tenant)| shoal_sdk::UserInfo {
                name: name.clone(),
                tenant: Some(tenant.clone()),
            })
            .collect(),
    ))
}

/// `sacctmgr add|delete user` (admin: not a tenant write).
pub(super) async fn set_user(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<shoal_sdk::UserInfo>,
) -> Result<Json<WriteResponse>, ApiError> {
    let (_, index) = write_or_reject(
        &app,
        &caller,
        Command::SetUser {
            name: req.name,
            tenant: req.tenant,
        },
    )
    .await?;
    Ok(Json(WriteResponse { index }))
}

pub(super) async fn create_tenant(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<TenantRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    let limits = views::tenant_limits(&req).map_err(bad_request)?;
    let global = views::global_caps_change(&req).map_err(bad_request)?;
    let global = (global != (None, None)).then_some(global);
    if global.is_some() {
        global_caps_spoken(&app)?;
    }
    let (_, mut index) = write_or_reject(
        &app,
        &caller,
        Command::CreateTenant {
            name: req.name.clone(),
            limits,
        },
    )
    .await?;
    if let Some(change) = global {
        index = set_global_caps(&app, &caller, req.name, change).await?;
    }
    Ok(Json(WriteResponse { index }))
}

/// Tenants capped across regions need every member to know the commands.
pub(super) fn global_caps_spoken(app: &Node) -> Result<(), ApiError> {
    let spoken = app.ledger().read()?.ledger.effective_protocol();
    let since = shoal_consensus::federation::global_tenants::SINCE_PROTOCOL;
    if spoken.is_some_and(|p| p >= since) {
        return Ok(());
    }
    Err(WireError::new(
        ErrorCode::Rejected,
        format!(
            "caps across regions need every member at protocol {since} or newer (this cluster speaks {}): upgrade every node first",
            spoken.map_or("none".to_string(), |p| p.to_string())
        ),
    )
    .into())
}

pub(super) async fn set_global_caps(
    app: &Arc<Node>,
    caller: &Caller,
    tenant: String,
    (gpus, gpu_seconds): views::GlobalCapsChange,
) -> Result<u64, ApiError> {
    let cmd = Command::SetGlobalCaps {
        tenant,
        gpus,
        gpu_seconds,
    };
    let (_, index) = write_or_reject(app, caller, cmd).await?;
    Ok(index)
}

pub(super) async fn set_tenant(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Json(req): Json<TenantRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    let update = views::tenant_update(&req).map_err(bad_request)?;
    let global = views::global_caps_change(&req).map_err(bad_request)?;
    let global = (global != (None, None)).then_some(global);
    if global.is_some() {
        global_caps_spoken(&app)?;
    }
    let only_global =
        global.is_some() && update == shoal_consensus::workload::TenantUpdate::default();
    let mut index = 0;
    if !only_global {
        let cmd = Command::UpdateTenant {
            name: name.clone(),
            update,
        };
        index = write_or_reject(&app, &caller, cmd).await?.1;
    }
    if let Some(change) = global {
        index = set_global_caps(&app, &caller, name, change).await?;
    }
    Ok(Json(WriteResponse { index }))
}

/// `shoal tenant global`: the tenants capped across regions, this
/// region's share of each and the peers' from their latest summaries.
pub(super) async fn list_global_tenants(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<shoal_sdk::GlobalTenantInfo>>, ApiError> {
    let now = crate::clock::wall_ms();
    let tracker = app.federation().tracker();
    let summaries = tracker.summaries(now);
    let d = app.ledger().read()?;
    let ledger = &d.ledger;
    let me = ledger.region_name().to_string();
    let hours = |s: u64| s as f64 / 3600.0;
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    let row = |region: &str, r: &shoal_sdk::GlobalTenantReport, local: bool, reachable: bool| {
        shoal_sdk::GlobalTenantRegion {
            region: region.to_string(),
            share: r.gpus.as_ref().map(|a| clamp(a.share)),
            in_use: r.gpus.as_ref().map_or(0, |a| clamp(a.in_use)),
            demand: r.gpus.as_ref().map_or(0, |a| clamp(a.demand)),
            gpu_hours_share: r.gpu_seconds.as_ref().map(|a| hours(a.share)),
            gpu_hours_committed: r.gpu_seconds.as_ref().map_or(0.0, |a| hours(a.in_use)),
            local,
            reachable,
        }
    };
    let infos = ledger
        .global_reports()
        .into_iter()
        .filter(|r| scope::sees_tenant(ledger, &caller, &r.tenant))
        .map(|own| {
            let mut regions = vec![row(&me, &own, true, true)];
            for (summary, reachable, _) in &summaries {
                if let Some(r) = summary
                    .global_tenants
                    .iter()
                    .find(|r| r.tenant == own.tenant)
                {
                    regions.push(row(&summary.region, r, false, *reachable));
                }
            }
            shoal_sdk::GlobalTenantInfo {
                tenant: own.tenant.clone(),
                home: own.home.clone(),
                gpus: own.gpus.as_ref().map(|a| clamp(a.cap)),
                gpu_hours: own.gpu_seconds.as_ref().map(|a| hours(a.cap)),
                regions,
            }
        })
        .collect();
    Ok(Json(infos))
}

pub(super) async fn list_tenants(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<TenantInfo>>, ApiError> {
    match app.ledger().query(ProtoQuery::Tenants).await? {
        ProtoResponse::Tenants(t) => {
            let d = app.ledger().read()?;
            Ok(Json(scope::tenants(&d.ledger, &caller, t)))
        }
        _ => Err(unexpected()),
    }
}

pub(super) async fn quota(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<QuotaInfo>>, ApiError> {
    match app.ledger().query(ProtoQuery::Quota).await? {
        ProtoResponse::Quota(q) => {
            let d = app.ledger().read()?;
            Ok(Json(scope::quotas(&d.ledger, &caller, q)))
        }
        _ => Err(unexpected()),
    }
}
