//! `shoal cp`, `ls`, `stat`, `rm`: replicated copy into and out of the
//! `mesh:/` namespace. Uploads chunk on the client (BLAKE3 ids, zstd when it
//! pays), ask every target which chunks it already has, send only the rest
//! to `--replica` nodes spread across zones and racks, and record the object
//! in the ledger last: an interrupted copy leaves no destination, and a
//! re-run sends only what is missing. Downloads fetch from the holders in
//! parallel, verify every chunk and materialise the destination atomically.
//! Another region's `mesh://REGION/PATH` is reached through the node this
//! CLI talks to, which forwards to one node of REGION: an upload's chunks
//! cross once and that node copies them inside its region
//! ([`crate::api::import`]); a download reads every chunk through it.

use crate::cli::api;
use crate::cli::ckpt::HttpFetch;
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use shoal_sdk::{Client, MemberState, ObjectImport, ObjectInfo, ObjectPut};
use shoal_storage::chunk::encode_chunk;
use shoal_storage::manifest::{build_manifest, restore_manifest, ChunkRef, FileEntry, Manifest};
use shoal_storage::placement::{place_replicas, NodeInfo};
use shoal_storage::replicate::restore_from_nearest_replicas;
use shoal_storage::{ChunkStore, Chunker, StoreConfig};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// Copies of every chunk on distinct nodes
    #[arg(long, default_value_t = 3)]
    pub replica: u32,
    /// Copy directories recursively
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Replace an existing destination
    #[arg(long)]
    pub force: bool,
    /// Write fewer than --replica copies when too few nodes are alive
    #[arg(long)]
    pub allow_degraded: bool,
    /// Sources, then the destination; mesh paths are written mesh:/path
    #[arg(required = true, num_args = 2..)]
    pub paths: Vec<String>,
}

#[derive(Serialize, Debug, Default)]
pub struct CpSummary {
    pub bytes: u64,
    pub files: u64,
    pub chunks: u64,
    pub chunks_sent: u64,
    pub bytes_sent: u64,
    /// Chunk copies the targets already held (content addressing).
    pub deduplicated: u64,
    pub seconds: f64,
}

impl CpSummary {
    /// Counts an object recorded from `manifest`.
    fn count_object(&mut self, manifest: &Manifest) {
        self.bytes += manifest.total_bytes;
        self.files += manifest.files.len() as u64;
        self.chunks += manifest.unique_chunks().len() as u64;
    }

    /// Counts what one push to a target sent and found there already.
    fn count_push(&mut self, pushed: &Pushed) {
        self.chunks_sent += pushed.sent;
        self.bytes_sent += pushed.bytes;
        self.deduplicated += pushed.dedup;
    }
}

enum Location {
    Local(PathBuf),
    /// An object path; `region`: another region's, reached through this one.
    Mesh {
        region: Option<String>,
        path: String,
    },
}

/// The path part of a mesh URL, as written: `mesh:/PATH` is this region's,
/// `mesh://REGION/PATH` names a region. `None`: not a mesh URL.
fn split_mesh(s: &str) -> Option<(Option<&str>, &str)> {
    let rest = s.strip_prefix("mesh:")?;
    match rest.strip_prefix("//") {
        Some(named) => match named.split_once('/') {
            Some((region, path)) => Some((Some(region), path)),
            None => Some((Some(named), "/")),
        },
        None => Some((None, rest)),
    }
}

/// Where a mesh URL points: the region to ask (`None`: the one `client`
/// talks to) and the path there. `None` overall: a local path.
struct MeshTarget {
    region: Option<String>,
    path: String,
}

impl MeshTarget {
    /// `client`, or the same client forwarding to the named region.
    fn client(&self, client: &Client) -> Client {
        match &self.region {
            Some(r) => client.in_region(Some(r)),
            None => client.clone(),
        }
    }
}

/// Resolves mesh URL `s` against the region `client` talks to: a
/// `mesh://REGION/PATH` naming that region is a local path; another
/// region's is kept for forwarding (`ls`, `stat`, `rm`).
async fn mesh_target(client: &Client, s: &str) -> anyhow::Result<Option<MeshTarget>> {
    let Some((region, path)) = split_mesh(s) else {
        return Ok(None);
    };
    let Some(region) = region else {
        return Ok(Some(MeshTarget {
            region: None,
            path: path.to_string(),
        }));
    };
    let here = client.status().await.map_err(api)?.region;
    Ok(Some(MeshTarget {
        region: (region != here).then(|| region.to_string()),
        path: format!("/{path}"),
    }))
}

async fn location(client: &Client, s: &str) -> anyhow::Result<Location> {
    match mesh_target(client, s).await? {
        Some(target) => shoal_consensus::namespace::normalize(&target.path)
            .map(|path| Location::Mesh {
                region: target.region,
                path,
            })
            .map_err(anyhow::Error::msg),
        None => Ok(Location::Local(PathBuf::from(s))),
    }
}

fn base_name(path: &Path) -> anyhow::Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("{} has no file name", path.display()))
}

pub async fn cp(client: &Client, args: &CpArgs, json: bool) -> anyhow::Result<()> {
    if args.replica == 0 {
        anyhow::bail!("--replica must be at least 1");
    }
    let (dst_raw, srcs) = args
        .paths
        .split_last()
        .ok_or_else(|| anyhow::anyhow!("cp needs a source and a destination"))?;
    let dst = location(client, dst_raw).await?;
    let many = srcs.len() > 1 || dst_raw.ends_with('/');
    let started = Instant::now();
    let mut summary = CpSummary::default();
    for src_raw in srcs {
        let src = location(client, src_raw).await?;
        match (&src, &dst) {
            (Location::Local(from), Location::Mesh { region, path: to }) => {
                let to = if many {
                    format!("{to}/{}", base_name(from)?)
                } else {
                    to.clone()
                };
                match region {
                    None => upload(client, args, from, &to, &mut summary, json).await?,
                    Some(region) => {
                        upload_to_region(client, region, args, from, &to, &mut summary, json)
                            .await?
                    }
                }
            }
            (Location::Mesh { region, path: from }, Location::Local(to)) => {
                let to = if many || to.is_dir() {
                    to.join(from.rsplit('/').next().unwrap_or("object"))
                } else {
                    to.clone()
                };
                download_from(
                    client,
                    region.as_deref(),
                    args,
                    from,
                    &to,
                    &mut summary,
                    json,
                )
                .await?;
            }
            (
                Location::Mesh {
                    region: Some(_), ..
                },
                Location::Mesh { .. },
            )
            | (
                Location::Mesh { .. },
                Location::Mesh {
                    region: Some(_), ..
                },
            ) => {
                anyhow::bail!(
                    "{src_raw} to {dst_raw}: a copy between mesh paths stays in this region; copy another region's object through a local path"
                )
            }
            (Location::Mesh { path: from, .. }, Location::Mesh { path: to, .. }) => {
                let to = if many {
                    format!("{to}/{}", from.rsplit('/').next().unwrap_or("object"))
                } else {
                    to.clone()
                };
                let object = stat_object(client, from).await?;
                client
                    .put_object(&ObjectPut {
                        path: to,
                        is_dir: object.is_dir,
                        manifest_hex: object.manifest_hex,
                        bytes: object.bytes,
                        files: object.files,
                        holders: object.replicas,
                        replica: object.replica,
                        tenant: Some(object.tenant),
                        replace: args.force,
                    })
                    .await
                    .map_err(api)?;
                summary.bytes += object.bytes;
                summary.files += object.files;
            }
            (Location::Local(_), Location::Local(_)) => {
                anyhow::bail!("neither {src_raw} nor {dst_raw} is a mesh: path; use plain cp")
            }
        }
    }
    summary.seconds = started.elapsed().as_secs_f64();
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    Ok(())
}

pub async fn stat_object(client: &Client, path: &str) -> anyhow::Result<ObjectInfo> {
    client
        .objects(path)
        .await
        .map_err(api)?
        .into_iter()
        .find(|o| o.path == path)
        .ok_or_else(|| anyhow::anyhow!("mesh:{path} does not exist"))
}

/// Chunks one file into `store` and describes it as a one-entry manifest.
fn manifest_of_file(file: &Path, store: &ChunkStore) -> anyhow::Result<Manifest> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file)?;
    let mut chunker = Chunker::new(std::fs::File::open(file)?);
    let mut chunks = Vec::new();
    while let Some(plain) = chunker.next_chunk()? {
        let encoded = encode_chunk(plain)?;
        store.put(&encoded)?;
        chunks.push(ChunkRef {
            id: encoded.id(),
            plain_len: encoded.plain_len(),
            stored_len: u32::try_from(encoded.stored_len()).unwrap_or(u32::MAX),
        });
    }
    let mut manifest = Manifest::empty();
    manifest.files.push(FileEntry {
        path: base_name(file)?,
        mode: meta.permissions().mode() & 0o777,
        size: meta.len(),
        chunks,
    });
    manifest.total_bytes = meta.len();
    manifest.validate()?;
    Ok(manifest)
}

/// What an upload of `from` to `to` must check first: a readable source,
/// `-r` for a directory, and no destination unless `--force`.
async fn check_upload(
    client: &Client,
    args: &CpArgs,
    from: &Path,
    to: &str,
) -> anyhow::Result<std::fs::Metadata> {
    let meta = std::fs::metadata(from)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", from.display()))?;
    if meta.is_dir() && !args.recursive {
        anyhow::bail!("{} is a directory (use -r)", from.display());
    }
    if !args.force
        && client
            .objects(to)
            .await
            .map_err(api)?
            .iter()
            .any(|o| o.path == to)
    {
        anyhow::bail!("mesh:{to} already exists (use --force to replace it)");
    }
    Ok(meta)
}

/// Chunks `from` (a file or a tree) into a scratch store; the manifest, the
/// store and the scratch directory it lives in (removed when dropped).
async fn chunk_source(
    from: &Path,
) -> anyhow::Result<(Manifest, std::sync::Arc<ChunkStore>, tempfile::TempDir)> {
    let scratch = tempfile::Builder::new().prefix("shoal-cp-").tempdir()?;
    let store = ChunkStore::open(
        scratch.path(),
        StoreConfig {
            fsync: false,
            ..StoreConfig::default()
        },
    )?;
    // The walk never follows a link, its root included: resolve the user's
    // path (which may be, or pass through, a link) first.
    let source = std::fs::canonicalize(from)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", from.display()))?;
    let (manifest, store) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let manifest = if source.is_dir() {
            build_manifest(&source, &store)?.0
        } else {
            manifest_of_file(&source, &store)?
        };
        Ok((manifest, store))
    })
    .await??;
    Ok((manifest, std::sync::Arc::new(store), scratch))
}

/// An upload to another region's `mesh://REGION/PATH`: the chunks go
/// through this CLI's node to one node of `region` (only those it lacks),
/// which copies them to `--replica` nodes of its region and records the
/// object.
async fn upload_to_region(
    client: &Client,
    region: &str,
    args: &CpArgs,
    from: &Path,
    to: &str,
    summary: &mut CpSummary,
    json: bool,
) -> anyhow::Result<()> {
    let remote = client.in_region(Some(region));
    let meta = check_upload(&remote, args, from, to).await?;
    let (manifest, store, _scratch) = chunk_source(from).await?;
    let chunks = manifest.unique_chunks();
    let ids: Vec<String> = chunks.iter().map(|c| c.id.to_string()).collect();
    let bars = progress_bars(json);
    let bar = bars.add(bytes_bar(&format!("→ {region}")));
    let pushed = push_chunks(remote.clone(), ids, chunks.clone(), store, bar, 0).await;
    let _ = bars.clear();
    let pushed = pushed.map_err(|(_, e)| {
        anyhow::anyhow!("cannot send the chunks of mesh://{region}{to} to region {region}: {e}")
    })?;
    remote
        .import_object(&ObjectImport {
            path: to.to_string(),
            is_dir: meta.is_dir(),
            manifest_hex: hex::encode(manifest.to_bytes()?),
            bytes: manifest.total_bytes,
            files: manifest.files.len() as u64,
            replica: args.replica,
            replace: args.force,
            allow_degraded: args.allow_degraded,
        })
        .await
        .map_err(api)?;
    summary.count_object(&manifest);
    summary.count_push(&pushed);
    Ok(())
}

pub(crate) async fn upload(
    client: &Client,
    args: &CpArgs,
    from: &Path,
    to: &str,
    summary: &mut CpSummary,
    json: bool,
) -> anyhow::Result<()> {
    let meta = check_upload(client, args, from, to).await?;
    // Targets: live nodes, spread over zones and racks.
    let nodes = client.nodes().await.map_err(api)?;
    let candidates: Vec<NodeInfo> = nodes
        .iter()
        .map(|n| NodeInfo {
            id: n.id,
            zone: n.labels.get("zone").cloned(),
            rack: n.labels.get("rack").cloned(),
            alive: n.state == MemberState::Alive,
            free_bytes: None,
        })
        .collect();
    // Every live node, ranked: the first ones spread over zones and racks.
    let mut ranked = place_replicas(to.as_bytes(), &candidates, candidates.len());
    if ranked.len() < args.replica as usize && !args.allow_degraded {
        anyhow::bail!(
            "only {} live node(s) for --replica {} (add --allow-degraded to write fewer copies)",
            ranked.len(),
            args.replica
        );
    }
    if ranked.is_empty() {
        anyhow::bail!("no live node can hold mesh:{to}");
    }
    let api_of: BTreeMap<u64, String> = nodes.iter().map(|n| (n.id, n.api_url.clone())).collect();
    let name_of: BTreeMap<u64, String> = nodes.iter().map(|n| (n.id, n.name.clone())).collect();

    let (manifest, store, _scratch) = chunk_source(from).await?;
    let chunks = manifest.unique_chunks();
    let ids: Vec<String> = chunks.iter().map(|c| c.id.to_string()).collect();
    let bars = progress_bars(json);
    let push = |target: u64| {
        let node = client.at(api_of.get(&target).cloned().unwrap_or_default());
        let name = name_of.get(&target).cloned().unwrap_or_default();
        let bar = bars.add(bytes_bar(&format!("→ {name}")));
        tokio::spawn(push_chunks(
            node,
            ids.clone(),
            chunks.clone(),
            store.clone(),
            bar,
            target,
        ))
    };
    // The first `--replica` ranked nodes; a node that fails (a full disk, a
    // crash) is replaced by the next one in the ranking.
    let wanted = (args.replica as usize).min(ranked.len());
    let mut spares = ranked.split_off(wanted).into_iter();
    let mut running: Vec<_> = ranked.iter().map(|t| push(*t)).collect();
    let mut holders = Vec::new();
    let mut failures = Vec::new();
    while let Some(task) = running.pop() {
        match task.await? {
            Ok(pushed) => {
                holders.push(pushed.target);
                summary.count_push(&pushed);
            }
            Err((target, e)) => {
                let name = name_of.get(&target).cloned().unwrap_or_default();
                failures.push(format!("{name}: {e}"));
                if let Some(spare) = spares.next() {
                    running.push(push(spare));
                }
            }
        }
    }
    let _ = bars.clear();
    if holders.len() < args.replica as usize && !args.allow_degraded {
        anyhow::bail!(
            "only {} of {} copies of mesh:{to} were written: {}",
            holders.len(),
            args.replica,
            failures.join("; ")
        );
    }
    holders.sort_unstable();
    client
        .put_object(&ObjectPut {
            path: to.to_string(),
            is_dir: meta.is_dir(),
            manifest_hex: hex::encode(manifest.to_bytes()?),
            bytes: manifest.total_bytes,
            files: manifest.files.len() as u64,
            holders,
            replica: args.replica,
            tenant: None,
            replace: args.force,
        })
        .await
        .map_err(api)?;
    summary.count_object(&manifest);
    Ok(())
}

struct Pushed {
    target: u64,
    sent: u64,
    bytes: u64,
    dedup: u64,
}

/// Sends `target` the chunks it does not hold yet.
async fn push_chunks(
    node: Client,
    ids: Vec<String>,
    chunks: Vec<ChunkRef>,
    store: std::sync::Arc<ChunkStore>,
    bar: ProgressBar,
    target: u64,
) -> Result<Pushed, (u64, String)> {
    let fail = |e: String| (target, e);
    let held = node
        .has_chunks(&ids)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let missing: Vec<&ChunkRef> = chunks
        .iter()
        .zip(&held)
        .filter(|(_, held)| !**held)
        .map(|(c, _)| c)
        .collect();
    bar.set_length(missing.iter().map(|c| u64::from(c.plain_len)).sum());
    let mut pushed = Pushed {
        target,
        sent: 0,
        bytes: 0,
        dedup: (chunks.len() - missing.len()) as u64,
    };
    for chunk in missing {
        let frame = store
            .get_encoded(&chunk.id)
            .map_err(|e| fail(e.to_string()))?
            .into_bytes();
        pushed.bytes += frame.len() as u64;
        node.put_chunk(&chunk.id.to_string(), frame)
            .await
            .map_err(|e| fail(e.to_string()))?;
        pushed.sent += 1;
        bar.inc(u64::from(chunk.plain_len));
    }
    bar.finish();
    Ok(pushed)
}

/// Progress on a terminal; nothing when stderr is not one or with --json.
fn progress_bars(json: bool) -> MultiProgress {
    if json || !std::io::stderr().is_terminal() {
        MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
    } else {
        MultiProgress::with_draw_target(ProgressDrawTarget::stderr())
    }
}

fn bytes_bar(label: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:<12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_string());
    bar
}

/// Holders nearest first by this node's Vivaldi estimates (the API node
/// itself first), dead ones last; and how many count as near: those within
/// twice the nearest one's RTT (plus a millisecond, for loopback).
async fn holders_by_distance(client: &Client, holders: &[u64], alive: &[u64]) -> (Vec<u64>, usize) {
    let me = client.status().await.ok().map(|s| s.node_id);
    let rtt_of: BTreeMap<u64, f64> = client
        .peers()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| Some((p.id, p.rtt_ms?)))
        .collect();
    let distance = |h: &u64| -> f64 {
        if Some(*h) == me {
            0.0
        } else {
            rtt_of.get(h).copied().unwrap_or(f64::INFINITY)
        }
    };
    let mut order: Vec<u64> = holders.to_vec();
    order.sort_by(|a, b| {
        (!alive.contains(a))
            .cmp(&!alive.contains(b))
            .then(distance(a).total_cmp(&distance(b)))
    });
    let nearest = order.first().map(distance).unwrap_or(0.0);
    let near = order
        .iter()
        .filter(|h| alive.contains(h) && distance(h) <= nearest * 2.0 + 1.0)
        .count();
    (order, near.max(1))
}

pub(crate) async fn download(
    client: &Client,
    args: &CpArgs,
    from: &str,
    to: &Path,
    summary: &mut CpSummary,
    json: bool,
) -> anyhow::Result<()> {
    download_from(client, None, args, from, to, summary, json).await
}

/// A download of `from`, an object of `region` (`None`: the region `client`
/// talks to). Another region's holders are reached through one node there,
/// in the order the object lists them.
async fn download_from(
    client: &Client,
    region: Option<&str>,
    args: &CpArgs,
    from: &str,
    to: &Path,
    summary: &mut CpSummary,
    json: bool,
) -> anyhow::Result<()> {
    let source = client.in_region(region);
    let object = stat_object(&source, from).await?;
    if object.is_dir && !args.recursive {
        anyhow::bail!("mesh:{from} is a directory (use -r)");
    }
    if std::fs::symlink_metadata(to).is_ok() && !args.force {
        anyhow::bail!(
            "{} already exists (use --force to replace it)",
            to.display()
        );
    }
    let parent = crate::cli::ckpt::parent_dir(to);
    let handle = tokio::runtime::Handle::current();
    let (order, near, transport) = match region {
        None => {
            let nodes = client.nodes().await?;
            let alive: Vec<u64> = nodes
                .iter()
                .filter(|n| n.state == MemberState::Alive)
                .map(|n| n.id)
                .collect();
            let (order, near) = holders_by_distance(client, &object.replicas, &alive).await;
            let transport = HttpFetch::for_nodes(handle, &nodes, client);
            (order, near, transport)
        }
        Some(_) => {
            let transport = HttpFetch::through(handle, &object.replicas, &source);
            (object.replicas.clone(), object.replicas.len(), transport)
        }
    };
    let raw = hex::decode(&object.manifest_hex)?;
    let manifest = Manifest::from_bytes(&raw)?;
    let scratch = tempfile::Builder::new()
        .prefix(".shoal-cp-")
        .tempdir_in(&parent)
        .map_err(|e| anyhow::anyhow!("cannot write in {}: {e}", parent.display()))?;
    let to = to.to_path_buf();
    let force = args.force;
    let is_dir = object.is_dir;
    let store = std::sync::Arc::new(ChunkStore::open(
        scratch.path().join("chunks"),
        StoreConfig {
            fsync: false,
            ..StoreConfig::default()
        },
    )?);
    let bars = progress_bars(json);
    let bar = bars.add(bytes_bar("← mesh"));
    bar.set_length(object.bytes);
    let total_chunks = manifest.unique_chunks().len().max(1) as u64;
    let watched = store.clone();
    let total_bytes = object.bytes;
    let ticker = tokio::spawn(async move {
        loop {
            let done = watched.stats().chunks.min(total_chunks);
            bar.set_position(total_bytes * done / total_chunks);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
    let fetch_store = store.clone();
    let fetched = tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
        let store = fetch_store;
        let report = restore_from_nearest_replicas(
            &manifest,
            &order,
            near,
            &transport,
            &store,
            crate::ckpt::FETCH_THREADS,
        )?;
        let staging = scratch.path().join("tree");
        restore_manifest(&manifest, &store, &staging)?;
        let source = if is_dir {
            staging
        } else {
            let name = manifest
                .files
                .first()
                .map(|f| f.path.clone())
                .ok_or_else(|| anyhow::anyhow!("the object holds no file"))?;
            staging.join(name)
        };
        if force && std::fs::symlink_metadata(&to).is_ok() {
            if to.is_dir() {
                std::fs::remove_dir_all(&to)?;
            } else {
                std::fs::remove_file(&to)?;
            }
        }
        std::fs::rename(&source, &to)
            .map_err(|e| anyhow::anyhow!("cannot move the copy into {}: {e}", to.display()))?;
        Ok(report.bytes_fetched)
    })
    .await;
    ticker.abort();
    let _ = bars.clear();
    let fetched = fetched??;
    summary.bytes += object.bytes;
    summary.files += object.files;
    summary.bytes_sent += fetched;
    Ok(())
}

pub async fn ls(client: &Client, path: &str, json: bool) -> anyhow::Result<()> {
    let Some(target) = mesh_target(client, path).await? else {
        anyhow::bail!("ls takes a mesh: path, e.g. mesh:/data");
    };
    let path = match target.path.trim_matches('/') {
        "" => String::new(),
        _ => shoal_consensus::namespace::normalize(&target.path).map_err(anyhow::Error::msg)?,
    };
    let objects = target.client(client).objects(&path).await.map_err(api)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&objects)?);
        return Ok(());
    }
    println!(
        "{:<40} {:>14} {:>7} {:<12} HEALTHY",
        "PATH", "BYTES", "FILES", "REPLICAS"
    );
    for o in &objects {
        let replicas: Vec<String> = o.replicas.iter().map(u64::to_string).collect();
        println!(
            "{:<40} {:>14} {:>7} {:<12} {}",
            format!("{}{}", o.path, if o.is_dir { "/" } else { "" }),
            o.bytes,
            o.files,
            replicas.join(","),
            if o.healthy { "yes" } else { "no" }
        );
    }
    Ok(())
}

pub async fn stat(client: &Client, path: &str, json: bool) -> anyhow::Result<()> {
    let target = mesh_target(client, path)
        .await?
        .ok_or_else(|| anyhow::anyhow!("stat takes a mesh: path, e.g. mesh:/data"))?;
    let path = shoal_consensus::namespace::normalize(&target.path).map_err(anyhow::Error::msg)?;
    let o = stat_object(&target.client(client), &path).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "path": o.path, "bytes": o.bytes, "files": o.files,
                "replicas": o.replicas, "healthy": o.healthy,
                "replica": o.replica, "is_dir": o.is_dir, "tenant": o.tenant, "mtime": o.mtime,
            }))?
        );
    } else {
        println!(
            "path:      mesh:{}{}",
            o.path,
            if o.is_dir { "/" } else { "" }
        );
        println!("bytes:     {}", o.bytes);
        println!("files:     {}", o.files);
        println!("replicas:  {:?} (asked for {})", o.replicas, o.replica);
        println!("healthy:   {}", o.healthy);
        println!("modified:  {}", o.mtime);
    }
    Ok(())
}

pub async fn rm(client: &Client, path: &str) -> anyhow::Result<()> {
    let target = mesh_target(client, path)
        .await?
        .ok_or_else(|| anyhow::anyhow!("rm takes a mesh: path, e.g. mesh:/data"))?;
    target
        .client(client)
        .remove_object(&target.path)
        .await
        .map_err(api)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::split_mesh;

    #[test]
    fn a_mesh_url_names_its_region_or_none() {
        assert_eq!(split_mesh("mesh:/a/b"), Some((None, "/a/b")));
        assert_eq!(split_mesh("mesh://eu-1/a/b"), Some((Some("eu-1"), "a/b")));
        assert_eq!(split_mesh("mesh://eu-1"), Some((Some("eu-1"), "/")));
        assert_eq!(split_mesh("./mesh:/a"), None);
        assert_eq!(split_mesh("/tmp/x"), None);
    }
}
