//! `shoal ckpt ls` and `shoal ckpt restore`: the checkpoint catalog, and a
//! restore to a local directory from whichever holders answer, verifying
//! every chunk against its hash.

use crate::cli::api;
use clap::Subcommand;
use shoal_sdk::{CheckpointInfo, Client};
use shoal_storage::chunk::{ChunkId, EncodedChunk};
use shoal_storage::manifest::{restore_manifest, Manifest};
use shoal_storage::replicate::{restore_from_replicas_parallel, ChunkTransport, TransportError};
use shoal_storage::{ChunkStore, StoreConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum CkptCmd {
    /// Checkpoints of a job: step, size, replicas, commit time
    /// JOB is N, or REGION:N for another region's job
    Ls { job: shoal_sdk::RegionJobId },
    /// Copy a committed checkpoint (every rank's part) into a new directory
    Restore {
        job: u64,
        /// Default: the latest committed step
        #[arg(long)]
        step: Option<u64>,
        #[arg(long)]
        to: PathBuf,
    },
}

pub async fn run(client: &Client, cmd: &CkptCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        CkptCmd::Ls { job } => {
            let (client, id) = crate::cli::federation::job_client(client, job, None);
            let list = client.checkpoints(id).await.map_err(api)?;
            if json {
                // INTERFACE.md's fields first; parts (with manifests) stay in the API.
                let rows: Vec<serde_json::Value> = list
                    .iter()
                    .map(|c| {
                        serde_json::json!({
                            "step": c.step,
                            "bytes": c.bytes,
                            "replicas": c.replicas,
                            "committed_at": c.committed_at,
                            "regions": c.regions,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:>8} {:>14} {:<16} {:<12} COMMITTED",
                    "STEP", "BYTES", "REPLICAS", "REGIONS"
                );
                for c in &list {
                    let replicas: Vec<String> = c.replicas.iter().map(u64::to_string).collect();
                    let regions = if c.regions.is_empty() {
                        "-".to_string()
                    } else {
                        c.regions.join(",")
                    };
                    println!(
                        "{:>8} {:>14} {:<16} {:<12} {}",
                        c.step,
                        c.bytes,
                        replicas.join(","),
                        regions,
                        c.committed_at
                            .clone()
                            .unwrap_or_else(|| "(in progress)".into())
                    );
                }
            }
            Ok(())
        }
        CkptCmd::Restore { job, step, to } => {
            let list = client.checkpoints(*job).await.map_err(api)?;
            let chosen = pick(&list, *step).map_err(anyhow::Error::msg)?.clone();
            let bytes = restore(client, &chosen, to).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"step": chosen.step, "bytes": bytes, "to": to})
                );
            } else {
                println!(
                    "restored step {} of job {job} ({bytes} bytes) to {}",
                    chosen.step,
                    to.display()
                );
            }
            Ok(())
        }
    }
}

fn pick(list: &[CheckpointInfo], step: Option<u64>) -> Result<&CheckpointInfo, String> {
    let committed = list.iter().filter(|c| c.committed_at.is_some());
    match step {
        Some(s) => committed
            .into_iter()
            .find(|c| c.step == s)
            .ok_or_else(|| format!("no committed checkpoint at step {s}")),
        None => committed
            .max_by_key(|c| c.step)
            .ok_or_else(|| "the job has no committed checkpoint".to_string()),
    }
}

/// Fetches chunks over the holders' HTTP APIs (read-only).
pub struct HttpFetch {
    handle: tokio::runtime::Handle,
    holders: BTreeMap<u64, Client>,
    /// Each holder is reached through its client's node, which fetches the
    /// chunk from it (another region's holders, [`HttpFetch::through`]).
    relayed: bool,
}

impl HttpFetch {
    /// A fetcher that can reach every listed node's API with `client`'s token.
    pub fn for_nodes(
        handle: tokio::runtime::Handle,
        nodes: &[shoal_sdk::NodeInfo],
        client: &Client,
    ) -> Self {
        let holders = nodes
            .iter()
            .map(|n| (n.id, client.at(n.api_url.clone())))
            .collect();
        HttpFetch {
            handle,
            holders,
            relayed: false,
        }
    }

    /// A fetcher that asks `client`'s node (with its region header: a node
    /// of another region) for every chunk, naming the holder it is to
    /// fetch it from when it lacks it.
    pub fn through(handle: tokio::runtime::Handle, holders: &[u64], client: &Client) -> Self {
        let holders = holders.iter().map(|h| (*h, client.clone())).collect();
        HttpFetch {
            handle,
            holders,
            relayed: true,
        }
    }
}

/// The directory a new `path` will be created in.
pub fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

impl ChunkTransport for HttpFetch {
    fn push(&self, node: u64, chunk: &EncodedChunk) -> Result<(), TransportError> {
        Err(TransportError::Rejected {
            node,
            id: chunk.id(),
            reason: "restores only read".into(),
        })
    }

    fn fetch(&self, node: u64, id: &ChunkId) -> Result<EncodedChunk, TransportError> {
        let client = self.holders.get(&node).ok_or(TransportError::Unreachable {
            node,
            reason: "no API address known".into(),
        })?;
        let hex = id.to_string();
        let frame = self
            .handle
            .block_on(async {
                if self.relayed {
                    client.chunk_from(&hex, node).await
                } else {
                    client.chunk(&hex).await
                }
            })
            .map_err(|e| TransportError::Unreachable {
                node,
                reason: e.to_string(),
            })?;
        EncodedChunk::from_wire(*id, frame).map_err(|e| TransportError::Rejected {
            node,
            id: *id,
            reason: e.to_string(),
        })
    }

    fn has(&self, _node: u64, ids: &[ChunkId]) -> Result<Vec<bool>, TransportError> {
        Ok(vec![false; ids.len()])
    }
}

/// Restores every part of `ckpt` from its holders into the new directory `to`.
pub(crate) async fn restore(
    client: &Client,
    ckpt: &CheckpointInfo,
    to: &Path,
) -> anyhow::Result<u64> {
    if std::fs::symlink_metadata(to).is_ok() {
        anyhow::bail!(
            "{} already exists; restore into a new directory",
            to.display()
        );
    }
    let parent = parent_dir(to);
    let nodes = client.nodes().await.map_err(api)?;
    let scratch = tempfile::Builder::new()
        .prefix(".shoal-restore-")
        .tempdir_in(&parent)
        .map_err(|e| anyhow::anyhow!("cannot create a scratch dir in {}: {e}", parent.display()))?;
    let ckpt = ckpt.clone();
    let to = to.to_path_buf();
    let client = client.clone();
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
        let store = ChunkStore::open(
            scratch.path().join("chunks"),
            StoreConfig {
                fsync: false,
                ..StoreConfig::default()
            },
        )?;
        let transport = HttpFetch::for_nodes(handle, &nodes, &client);
        let staging = scratch.path().join("tree");
        std::fs::create_dir_all(&staging)?;
        let mut bytes = 0;
        for part in &ckpt.parts {
            let raw = hex::decode(&part.manifest_hex)
                .map_err(|e| anyhow::anyhow!("rank {}'s manifest is not hex: {e}", part.rank))?;
            let manifest = Manifest::from_bytes(&raw)?;
            restore_from_replicas_parallel(
                &manifest,
                &part.holders,
                &transport,
                &store,
                crate::ckpt::FETCH_THREADS,
            )?;
            let dest = scratch.path().join(format!("rank-{}", part.rank));
            let stats = restore_manifest(&manifest, &store, &dest)?;
            crate::ckpt::merge_into(&dest, &staging).map_err(anyhow::Error::msg)?;
            bytes += stats.bytes_written;
        }
        std::fs::rename(&staging, &to)
            .map_err(|e| anyhow::anyhow!("cannot move the restore into {}: {e}", to.display()))?;
        Ok(bytes)
    })
    .await?
}
