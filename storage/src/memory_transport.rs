//! In-memory [`ChunkTransport`] with fault injection, for tests of replication logic
//! here and in the node crate. Each simulated node verifies pushed chunks exactly as a
//! real node's [`crate::store::ChunkStore::put`] would.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use crate::chunk::{decode_chunk, ChunkId, EncodedChunk};
use crate::replicate::{ChainPush, ChunkTransport, TransportError};

#[derive(Debug, Default)]
struct SimulatedNode {
    chunks: BTreeMap<ChunkId, Vec<u8>>,
    used_bytes: u64,
    capacity_bytes: Option<u64>,
    down: bool,
    corrupt_fetches: bool,
    push_calls: u64,
    fetch_calls: u64,
    has_calls: u64,
}

/// A set of simulated peers held in memory.
#[derive(Debug, Default)]
pub struct MemoryTransport {
    nodes: Mutex<BTreeMap<u64, SimulatedNode>>,
}

impl MemoryTransport {
    /// A transport with the given (empty, healthy, unlimited) nodes.
    pub fn with_nodes(ids: impl IntoIterator<Item = u64>) -> Self {
        let transport = MemoryTransport::default();
        for id in ids {
            transport.add_node(id);
        }
        transport
    }

    fn nodes(&self) -> MutexGuard<'_, BTreeMap<u64, SimulatedNode>> {
        self.nodes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn with_node<R>(&self, node: u64, action: impl FnOnce(&mut SimulatedNode) -> R) -> Option<R> {
        self.nodes().get_mut(&node).map(action)
    }

    /// Adds an empty healthy node (no-op if it exists).
    pub fn add_node(&self, id: u64) {
        self.nodes().entry(id).or_default();
    }

    /// Simulates a node going down (every call fails with `Unreachable`) or coming back.
    pub fn set_down(&self, node: u64, down: bool) {
        self.with_node(node, |state| state.down = down);
    }

    /// Makes `fetch` from `node` return frames with one payload byte flipped.
    pub fn set_corrupt_fetches(&self, node: u64, corrupt: bool) {
        self.with_node(node, |state| state.corrupt_fetches = corrupt);
    }

    /// Limits the bytes `node` accepts; pushes beyond it fail with `StoreFull`.
    pub fn set_capacity(&self, node: u64, capacity_bytes: Option<u64>) {
        self.with_node(node, |state| state.capacity_bytes = capacity_bytes);
    }

    /// Flips a byte of the copy of `id` stored on `node` (bit-rot). Returns whether
    /// the node held the chunk.
    pub fn corrupt_stored(&self, node: u64, id: &ChunkId) -> bool {
        self.with_node(node, |state| match state.chunks.get_mut(id) {
            Some(frame) => {
                flip_last_byte(frame);
                true
            }
            None => false,
        })
        .unwrap_or(false)
    }

    /// Places a chunk on `node` directly, bypassing faults and counters.
    pub fn insert(&self, node: u64, chunk: &EncodedChunk) {
        self.nodes()
            .entry(node)
            .or_default()
            .store(chunk.id(), chunk.bytes().to_vec());
    }

    /// Number of `push` calls `node` received (including failed ones).
    pub fn push_calls(&self, node: u64) -> u64 {
        self.with_node(node, |state| state.push_calls).unwrap_or(0)
    }

    /// Number of `fetch` calls `node` received.
    pub fn fetch_calls(&self, node: u64) -> u64 {
        self.with_node(node, |state| state.fetch_calls).unwrap_or(0)
    }

    /// Number of `has` calls `node` received.
    pub fn has_calls(&self, node: u64) -> u64 {
        self.with_node(node, |state| state.has_calls).unwrap_or(0)
    }

    /// Ids held by `node`.
    pub fn chunk_ids(&self, node: u64) -> BTreeSet<ChunkId> {
        self.with_node(node, |state| state.chunks.keys().copied().collect())
            .unwrap_or_default()
    }
}

impl SimulatedNode {
    fn store(&mut self, id: ChunkId, frame: Vec<u8>) {
        self.used_bytes += frame.len() as u64;
        if let Some(previous) = self.chunks.insert(id, frame) {
            self.used_bytes -= previous.len() as u64;
        }
    }
}

fn flip_last_byte(frame: &mut [u8]) {
    if let Some(last) = frame.last_mut() {
        *last ^= 0x5a;
    }
}

fn unreachable(node: u64, reason: &str) -> TransportError {
    TransportError::Unreachable {
        node,
        reason: reason.to_string(),
    }
}

impl ChunkTransport for MemoryTransport {
    fn push(&self, node: u64, chunk: &EncodedChunk) -> Result<(), TransportError> {
        let mut nodes = self.nodes();
        let state = nodes
            .get_mut(&node)
            .ok_or_else(|| unreachable(node, "unknown node"))?;
        state.push_calls += 1;
        if state.down {
            return Err(unreachable(node, "node is down"));
        }
        let id = chunk.id();
        if state.chunks.contains_key(&id) {
            return Ok(());
        }
        // Verify on arrival, as a real receiver does.
        decode_chunk(chunk, &id).map_err(|error| TransportError::Rejected {
            node,
            id,
            reason: error.to_string(),
        })?;
        if let Some(capacity) = state.capacity_bytes {
            if state.used_bytes + chunk.stored_len() > capacity {
                return Err(TransportError::StoreFull { node, id });
            }
        }
        state.store(id, chunk.bytes().to_vec());
        Ok(())
    }

    /// Forwards like a real chain: each node's outcome is its own push, and
    /// the source sends once, plus once more for every unreachable head.
    fn push_chain(&self, chain: &[u64], chunk: &EncodedChunk) -> ChainPush {
        let outcomes: Vec<Result<(), TransportError>> =
            chain.iter().map(|&node| self.push(node, chunk)).collect();
        let unreachable_heads = outcomes
            .iter()
            .take_while(|o| matches!(o, Err(TransportError::Unreachable { .. })))
            .count();
        ChainPush {
            outcomes,
            source_sends: (unreachable_heads + 1).min(chain.len()) as u64,
        }
    }

    fn fetch(&self, node: u64, id: &ChunkId) -> Result<EncodedChunk, TransportError> {
        let mut nodes = self.nodes();
        let state = nodes
            .get_mut(&node)
            .ok_or_else(|| unreachable(node, "unknown node"))?;
        state.fetch_calls += 1;
        if state.down {
            return Err(unreachable(node, "node is down"));
        }
        let mut frame = state
            .chunks
            .get(id)
            .cloned()
            .ok_or(TransportError::NotFound { node, id: *id })?;
        if state.corrupt_fetches {
            flip_last_byte(&mut frame);
        }
        EncodedChunk::from_wire(*id, frame).map_err(|error| TransportError::Other {
            node,
            reason: error.to_string(),
        })
    }

    fn has(&self, node: u64, ids: &[ChunkId]) -> Result<Vec<bool>, TransportError> {
        let mut nodes = self.nodes();
        let state = nodes
            .get_mut(&node)
            .ok_or_else(|| unreachable(node, "unknown node"))?;
        state.has_calls += 1;
        if state.down {
            return Err(unreachable(node, "node is down"));
        }
        Ok(ids.iter().map(|id| state.chunks.contains_key(id)).collect())
    }
}
