//! Content-addressed chunks and their wire/disk frame.
//!
//! A chunk is identified by the BLAKE3 hash of its *plain* bytes, so the id is
//! independent of how (or whether) the bytes were compressed: two peers that chose
//! different codecs still agree on ids, and dedup works across them.
//!
//! # Frame format (identical on disk and on the wire)
//!
//! ```text
//! offset 0  u8      format version (currently 1)
//! offset 1  u8      flags: bit 0 = payload is a zstd frame; other bits must be 0
//! offset 2  u32 LE  plain length (≤ MAX_CHUNK_SIZE)
//! offset 6  ...     payload: raw plain bytes, or one zstd frame
//! ```
//!
//! The plain length is in the header so decoders allocate exactly once and can
//! bound their output *before* decompressing: a hostile or corrupt frame can never
//! make us allocate more than [`MAX_CHUNK_SIZE`].
//!
//! # Compression heuristic
//!
//! Checkpoints are dominated by model weights and optimizer state, which zstd cannot
//! shrink meaningfully. Running zstd over them costs CPU on write *and* forces a
//! decompression pass on every read, so we store such chunks raw:
//!
//! 1. For chunks of at least [`CodecConfig::probe_min_chunk`] bytes we first compress a
//!    cheap sample: [`PROBE_SLICES`] slices of [`PROBE_SLICE_LEN`] bytes spread evenly
//!    across the chunk (64 KiB total, 1.6 % of a 4 MiB chunk). If the sample does not
//!    save at least `min_savings_percent`, the chunk is stored raw without compressing
//!    the rest. The sample sees less context than the whole chunk, so it slightly
//!    underestimates the ratio; borderline data therefore tends to be stored raw, which
//!    is the cheap side to err on.
//! 2. Otherwise the whole chunk is compressed, and the result is kept only if it saves
//!    at least `min_savings_percent` of the plain size; if not, the raw bytes are stored.
//!
//! Decoding never trusts the flag alone: the decoded bytes are always re-hashed and
//! compared with the id the caller asked for.

use std::cell::RefCell;
use std::fmt;
use std::io::Cursor;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Result, StorageError};

/// Current frame format version written by this build.
pub const FRAME_VERSION: u8 = 1;
/// Frame header length in bytes (version, flags, plain length).
pub const FRAME_HEADER_LEN: usize = 6;
/// Flag bit: payload is a zstd frame.
pub const FLAG_ZSTD: u8 = 0b0000_0001;
const KNOWN_FLAGS: u8 = FLAG_ZSTD;

/// Default chunk size used by the chunker (4 MiB).
pub const DEFAULT_CHUNK_SIZE: usize = 4 * 1024 * 1024;
/// Hard upper bound on a chunk's plain size (8 MiB). Decoders refuse anything larger,
/// which bounds the memory a corrupt or hostile frame can make us allocate.
pub const MAX_CHUNK_SIZE: usize = 8 * 1024 * 1024;

/// Number of slices compressed by the incompressibility probe.
pub const PROBE_SLICES: usize = 4;
/// Length of each probe slice.
pub const PROBE_SLICE_LEN: usize = 16 * 1024;

/// A 32-byte BLAKE3 hash of a chunk's plain bytes.
///
/// Displays (and parses) as 64 lowercase hex characters. With human-readable serde
/// formats (JSON, TOML) it serializes as that hex string; with binary formats such as
/// bincode it serializes as the raw 32 bytes, keeping manifests compact.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkId([u8; 32]);

impl ChunkId {
    /// Hashes `plain` to its content id.
    pub fn of(plain: &[u8]) -> Self {
        ChunkId(*blake3::hash(plain).as_bytes())
    }

    /// Wraps raw hash bytes (e.g. received from a peer).
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        ChunkId(bytes)
    }

    /// The raw hash bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64-character lowercase hex form (also what `Display` prints).
    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    /// Parses 64 hex characters (either case).
    pub fn from_hex(hex: &str) -> std::result::Result<Self, ParseChunkIdError> {
        let digits = hex.as_bytes();
        if digits.len() != 64 {
            return Err(ParseChunkIdError {
                input: hex.to_string(),
            });
        }
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
            match (hex_value(pair[0]), hex_value(pair[1])) {
                (Some(high), Some(low)) => *byte = (high << 4) | low,
                _ => {
                    return Err(ParseChunkIdError {
                        input: hex.to_string(),
                    })
                }
            }
        }
        Ok(ChunkId(out))
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// A string that is not 64 hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a chunk id (expected 64 hex characters): {input:?}")]
pub struct ParseChunkIdError {
    pub input: String,
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({self})")
    }
}

impl FromStr for ChunkId {
    type Err = ParseChunkIdError;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        ChunkId::from_hex(s)
    }
}

impl Serialize for ChunkId {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for ChunkId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let hex = String::deserialize(deserializer)?;
            ChunkId::from_hex(&hex).map_err(serde::de::Error::custom)
        } else {
            <[u8; 32]>::deserialize(deserializer).map(ChunkId)
        }
    }
}

/// Tuning knobs for [`encode_chunk_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecConfig {
    /// zstd level; 1 is the fastest level that still finds the easy wins
    /// (zeros, text, JSON configs, tokenizer files).
    pub zstd_level: i32,
    /// Store raw unless compression saves at least this percentage of the plain size.
    pub min_savings_percent: u8,
    /// Chunks at least this long are probed with a small sample before being
    /// compressed whole. `usize::MAX` disables the probe.
    pub probe_min_chunk: usize,
}

impl Default for CodecConfig {
    fn default() -> Self {
        CodecConfig {
            zstd_level: 1,
            min_savings_percent: 5,
            probe_min_chunk: 256 * 1024,
        }
    }
}

impl CodecConfig {
    /// Largest compressed size (of `plain_len` input) that still "pays".
    fn max_paying_len(&self, plain_len: usize) -> usize {
        let percent = usize::from(self.min_savings_percent.min(100));
        // plain_len ≤ MAX_CHUNK_SIZE, so the multiplication cannot overflow.
        plain_len - plain_len * percent / 100
    }
}

/// A chunk framed for storage or transfer: the bytes are exactly what lives on disk
/// and what goes over the wire, so a store can ship them to a peer without
/// re-compressing.
///
/// Construct it with [`encode_chunk`] (trusted: we hashed the plain bytes ourselves)
/// or [`EncodedChunk::from_wire`] (untrusted: frame checked, content not yet verified).
/// [`crate::store::ChunkStore::put`] verifies untrusted chunks before storing them.
#[derive(Clone, PartialEq, Eq)]
pub struct EncodedChunk {
    id: ChunkId,
    compressed: bool,
    plain_len: u32,
    bytes: Vec<u8>,
    verified: bool,
}

impl fmt::Debug for EncodedChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodedChunk")
            .field("id", &self.id)
            .field("compressed", &self.compressed)
            .field("plain_len", &self.plain_len)
            .field("stored_len", &self.bytes.len())
            .field("verified", &self.verified)
            .finish()
    }
}

impl EncodedChunk {
    /// Wraps frame bytes received from a peer or read from disk, claimed to hold `id`.
    ///
    /// Checks the header (version, flags, length bounds) but does not decompress or
    /// hash: the result is *unverified* until [`decode_chunk`] or a store `put` checks it.
    pub fn from_wire(id: ChunkId, bytes: Vec<u8>) -> Result<Self> {
        let header = parse_header(&bytes).map_err(|e| attach_id(e, id))?;
        Ok(EncodedChunk {
            id,
            compressed: header.compressed,
            plain_len: header.plain_len,
            bytes,
            verified: false,
        })
    }

    /// The content id (BLAKE3 of the plain bytes) this chunk claims to hold.
    pub fn id(&self) -> ChunkId {
        self.id
    }

    /// Whether the payload is zstd-compressed.
    pub fn is_compressed(&self) -> bool {
        self.compressed
    }

    /// Length of the plain (decoded) bytes.
    pub fn plain_len(&self) -> u32 {
        self.plain_len
    }

    /// Length of the frame (header + payload): what it costs on disk and on the wire.
    pub fn stored_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// The full frame bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Consumes the chunk, returning the frame bytes (e.g. to hand to a socket).
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// True when this process produced the frame from plain bytes it hashed itself.
    pub fn is_verified(&self) -> bool {
        self.verified
    }

    /// Marks a chunk as verified after a successful decode; crate-internal so only
    /// code that actually checked the hash can set it.
    pub(crate) fn mark_verified(&mut self) {
        self.verified = true;
    }
}

struct FrameHeader {
    compressed: bool,
    plain_len: u32,
}

fn attach_id(error: StorageError, id: ChunkId) -> StorageError {
    match error {
        StorageError::MalformedChunk { id: None, reason } => StorageError::MalformedChunk {
            id: Some(id),
            reason,
        },
        other => other,
    }
}

fn parse_header(bytes: &[u8]) -> Result<FrameHeader> {
    if bytes.len() < FRAME_HEADER_LEN {
        return Err(StorageError::MalformedChunk {
            id: None,
            reason: format!(
                "frame is {} bytes, shorter than the {FRAME_HEADER_LEN}-byte header",
                bytes.len()
            ),
        });
    }
    let version = bytes[0];
    if version != FRAME_VERSION {
        return Err(StorageError::UnsupportedVersion {
            found: version,
            supported: FRAME_VERSION,
        });
    }
    let flags = bytes[1];
    if flags & !KNOWN_FLAGS != 0 {
        return Err(StorageError::UnknownFlags { flags });
    }
    let plain_len = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
    if plain_len as usize > MAX_CHUNK_SIZE {
        return Err(StorageError::ChunkTooLarge {
            len: u64::from(plain_len),
            max: MAX_CHUNK_SIZE as u64,
        });
    }
    let compressed = flags & FLAG_ZSTD != 0;
    let payload_len = bytes.len() - FRAME_HEADER_LEN;
    if !compressed && payload_len != plain_len as usize {
        return Err(StorageError::MalformedChunk {
            id: None,
            reason: format!("raw payload is {payload_len} bytes but header says {plain_len}"),
        });
    }
    Ok(FrameHeader {
        compressed,
        plain_len,
    })
}

fn write_header(out: &mut Vec<u8>, compressed: bool, plain_len: u32) {
    out.push(FRAME_VERSION);
    out.push(if compressed { FLAG_ZSTD } else { 0 });
    out.extend_from_slice(&plain_len.to_le_bytes());
}

thread_local! {
    /// One reusable zstd context per thread: creating a context allocates several
    /// hundred KiB, which is measurable when done once per 4 MiB chunk.
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
}

/// Compresses `input` and appends the zstd frame to `out` (which may already hold a header).
fn compress_into(level: i32, input: &[u8], out: &mut Vec<u8>) -> std::io::Result<usize> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let needs_new = !matches!(slot.as_ref(), Some((cached_level, _)) if *cached_level == level);
        if needs_new {
            *slot = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        let Some((_, compressor)) = slot.as_mut() else {
            return Err(std::io::Error::other("zstd compressor unavailable"));
        };
        let start = out.len();
        out.reserve(zstd::zstd_safe::compress_bound(input.len()));
        let mut cursor = Cursor::new(std::mem::take(out));
        cursor.set_position(start as u64);
        let result = compressor.compress_to_buffer(input, &mut cursor);
        *out = cursor.into_inner();
        result
    })
}

/// Takes [`PROBE_SLICES`] evenly spaced slices of `plain`; caller guarantees the
/// chunk is long enough for them not to overlap.
fn probe_sample(plain: &[u8]) -> Vec<u8> {
    let mut sample = Vec::with_capacity(PROBE_SLICES * PROBE_SLICE_LEN);
    let stride = (plain.len() - PROBE_SLICE_LEN) / (PROBE_SLICES - 1);
    for slice in 0..PROBE_SLICES {
        let start = slice * stride;
        sample.extend_from_slice(&plain[start..start + PROBE_SLICE_LEN]);
    }
    sample
}

fn raw_frame(id: ChunkId, plain: &[u8], plain_len: u32) -> EncodedChunk {
    let mut bytes = Vec::with_capacity(FRAME_HEADER_LEN + plain.len());
    write_header(&mut bytes, false, plain_len);
    bytes.extend_from_slice(plain);
    EncodedChunk {
        id,
        compressed: false,
        plain_len,
        bytes,
        verified: true,
    }
}

/// Hashes and frames `plain` with the default [`CodecConfig`] (zstd level 1, store raw
/// unless compression saves ≥ 5 %).
pub fn encode_chunk(plain: &[u8]) -> Result<EncodedChunk> {
    encode_chunk_with(plain, &CodecConfig::default())
}

/// Hashes and frames `plain` with an explicit codec configuration.
/// See the module docs for the compression heuristic.
pub fn encode_chunk_with(plain: &[u8], config: &CodecConfig) -> Result<EncodedChunk> {
    if plain.len() > MAX_CHUNK_SIZE {
        return Err(StorageError::ChunkTooLarge {
            len: plain.len() as u64,
            max: MAX_CHUNK_SIZE as u64,
        });
    }
    encode_chunk_with_id(plain, ChunkId::of(plain), config)
}

/// [`encode_chunk_with`] for callers that already hashed `plain` (e.g. to check for
/// dedup before paying for compression). `id` must be `ChunkId::of(plain)`.
pub(crate) fn encode_chunk_with_id(
    plain: &[u8],
    id: ChunkId,
    config: &CodecConfig,
) -> Result<EncodedChunk> {
    if plain.len() > MAX_CHUNK_SIZE {
        return Err(StorageError::ChunkTooLarge {
            len: plain.len() as u64,
            max: MAX_CHUNK_SIZE as u64,
        });
    }
    debug_assert_eq!(id, ChunkId::of(plain));
    let plain_len = plain.len() as u32;
    let max_paying = config.max_paying_len(plain.len());
    if plain.is_empty() || (config.min_savings_percent > 0 && max_paying == plain.len()) {
        // Compression cannot pay: the input is too small for the required saving.
        return Ok(raw_frame(id, plain, plain_len));
    }
    let codec_error = |source| StorageError::Codec {
        action: "compression",
        id,
        source,
    };
    let probe_floor = config
        .probe_min_chunk
        .max(PROBE_SLICES * PROBE_SLICE_LEN * 2);
    if plain.len() >= probe_floor {
        let sample = probe_sample(plain);
        let mut compressed_sample = Vec::new();
        let sample_len = compress_into(config.zstd_level, &sample, &mut compressed_sample)
            .map_err(codec_error)?;
        if sample_len > config.max_paying_len(sample.len()) {
            return Ok(raw_frame(id, plain, plain_len));
        }
    }
    let mut bytes = Vec::with_capacity(FRAME_HEADER_LEN);
    write_header(&mut bytes, true, plain_len);
    let payload_len = compress_into(config.zstd_level, plain, &mut bytes).map_err(codec_error)?;
    if payload_len > max_paying {
        return Ok(raw_frame(id, plain, plain_len));
    }
    bytes.shrink_to_fit();
    Ok(EncodedChunk {
        id,
        compressed: true,
        plain_len,
        bytes,
        verified: true,
    })
}

/// Decodes `encoded` and verifies that the plain bytes hash to `expected_id`.
///
/// A corrupt chunk is always an error ([`StorageError::HashMismatch`] or a frame
/// error), never returned data. Output size is bounded by the header's plain length,
/// itself bounded by [`MAX_CHUNK_SIZE`].
pub fn decode_chunk(encoded: &EncodedChunk, expected_id: &ChunkId) -> Result<Vec<u8>> {
    decode_frame(encoded.bytes(), expected_id)
}

/// Like [`decode_chunk`] but on raw frame bytes (e.g. straight from disk).
pub fn decode_frame(frame: &[u8], expected_id: &ChunkId) -> Result<Vec<u8>> {
    let header = parse_header(frame).map_err(|e| attach_id(e, *expected_id))?;
    let payload = &frame[FRAME_HEADER_LEN..];
    let plain = if header.compressed {
        let expected_len = header.plain_len as usize;
        let plain = zstd::bulk::decompress(payload, expected_len).map_err(|source| {
            StorageError::Codec {
                action: "decompression",
                id: *expected_id,
                source,
            }
        })?;
        if plain.len() != expected_len {
            return Err(StorageError::MalformedChunk {
                id: Some(*expected_id),
                reason: format!(
                    "decompressed to {} bytes but header says {expected_len}",
                    plain.len()
                ),
            });
        }
        plain
    } else {
        payload.to_vec()
    };
    let actual = ChunkId::of(&plain);
    if actual != *expected_id {
        return Err(StorageError::HashMismatch {
            expected: *expected_id,
            actual,
        });
    }
    Ok(plain)
}

/// Zero-copy variant of [`decode_frame`] for hot loops (restore): a raw frame is
/// verified and returned in place; a compressed one is decompressed into `scratch`,
/// which is reused across calls. Same verification and bounds as [`decode_frame`].
pub(crate) fn decode_frame_borrowed<'a>(
    frame: &'a [u8],
    expected_id: &ChunkId,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8]> {
    let header = parse_header(frame).map_err(|e| attach_id(e, *expected_id))?;
    let payload = &frame[FRAME_HEADER_LEN..];
    let plain: &[u8] = if header.compressed {
        let expected_len = header.plain_len as usize;
        scratch.clear();
        scratch.reserve_exact(expected_len);
        zstd::bulk::Decompressor::new()
            .and_then(|mut decompressor| decompressor.decompress_to_buffer(payload, &mut *scratch))
            .map_err(|source| StorageError::Codec {
                action: "decompression",
                id: *expected_id,
                source,
            })?;
        if scratch.len() != expected_len {
            return Err(StorageError::MalformedChunk {
                id: Some(*expected_id),
                reason: format!(
                    "decompressed to {} bytes but header says {expected_len}",
                    scratch.len()
                ),
            });
        }
        scratch
    } else {
        payload
    };
    let actual = ChunkId::of(plain);
    if actual != *expected_id {
        return Err(StorageError::HashMismatch {
            expected: *expected_id,
            actual,
        });
    }
    Ok(plain)
}

/// Checks that `encoded` decodes to the plain bytes of its claimed id, and marks it
/// verified. Used by stores before accepting chunks from untrusted sources.
pub fn verify_chunk(encoded: &mut EncodedChunk) -> Result<()> {
    if !encoded.verified {
        check_chunk(encoded)?;
        encoded.mark_verified();
    }
    Ok(())
}

/// Checks that `encoded` decodes to the plain bytes of its claimed id without
/// keeping them: a raw frame is hashed in place (a replica stores every chunk
/// it receives, and copying 4 MiB only to hash it was a tenth of a hop's
/// memory traffic); a compressed one is decompressed into a scratch buffer.
pub fn check_chunk(encoded: &EncodedChunk) -> Result<()> {
    let mut scratch = Vec::new();
    decode_frame_borrowed(encoded.bytes(), &encoded.id(), &mut scratch).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
        // xorshift64*: deterministic, incompressible enough for zstd.
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn chunk_id_hex_round_trip_and_serde_forms() {
        let id = ChunkId::of(b"hello");
        let hex = id.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(hex, blake3::hash(b"hello").to_hex().as_str());
        assert_eq!(ChunkId::from_hex(&hex.to_uppercase()), Ok(id));
        assert!(ChunkId::from_hex("zz").is_err());
        assert!(ChunkId::from_hex(&"g".repeat(64)).is_err());
        // Binary serde is the raw 32 bytes (compact manifests).
        let encoded = bincode::serialize(&id).expect("serialize");
        assert_eq!(encoded, id.as_bytes().to_vec());
        let back: ChunkId = bincode::deserialize(&encoded).expect("deserialize");
        assert_eq!(back, id);
    }

    #[test]
    fn random_data_is_stored_raw() {
        let plain = pseudo_random(DEFAULT_CHUNK_SIZE, 7);
        let encoded = encode_chunk(&plain).expect("encode");
        assert!(!encoded.is_compressed());
        assert_eq!(
            encoded.stored_len(),
            (plain.len() + FRAME_HEADER_LEN) as u64
        );
        assert_eq!(
            decode_chunk(&encoded, &encoded.id()).expect("decode"),
            plain
        );
    }

    #[test]
    fn small_random_data_without_probe_is_stored_raw() {
        let plain = pseudo_random(10_000, 3);
        let encoded = encode_chunk(&plain).expect("encode");
        assert!(!encoded.is_compressed());
    }

    #[test]
    fn zeros_and_text_are_compressed() {
        let zeros = vec![0u8; DEFAULT_CHUNK_SIZE];
        let encoded = encode_chunk(&zeros).expect("encode");
        assert!(encoded.is_compressed());
        assert!(encoded.stored_len() < 4096, "{}", encoded.stored_len());
        assert_eq!(
            decode_chunk(&encoded, &encoded.id()).expect("decode"),
            zeros
        );

        let text: Vec<u8> = (0..20_000)
            .flat_map(|i| {
                format!("line {i}: the quick brown fox jumps over the lazy dog\n").into_bytes()
            })
            .take(DEFAULT_CHUNK_SIZE / 2)
            .collect();
        let encoded = encode_chunk(&text).expect("encode");
        assert!(encoded.is_compressed());
        assert!(encoded.stored_len() < text.len() as u64 / 3);
        assert_eq!(decode_chunk(&encoded, &encoded.id()).expect("decode"), text);
    }

    #[test]
    fn empty_chunk_round_trips() {
        let encoded = encode_chunk(&[]).expect("encode");
        assert_eq!(encoded.plain_len(), 0);
        assert_eq!(
            decode_chunk(&encoded, &ChunkId::of(&[])).expect("decode"),
            Vec::<u8>::new()
        );
    }

    #[test]
    fn oversized_chunk_is_refused() {
        let plain = vec![0u8; MAX_CHUNK_SIZE + 1];
        assert!(matches!(
            encode_chunk(&plain),
            Err(StorageError::ChunkTooLarge { .. })
        ));
    }

    #[test]
    fn corruption_is_detected_never_returned() {
        for plain in [vec![7u8; 100_000], pseudo_random(100_000, 9)] {
            let encoded = encode_chunk(&plain).expect("encode");
            let id = encoded.id();
            let mut bytes = encoded.into_bytes();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x40;
            let result = decode_frame(&bytes, &id);
            let error = result.expect_err("corrupt chunk must not decode");
            assert!(error.is_corruption(), "{error}");
        }
    }

    #[test]
    fn wrong_expected_id_is_a_hash_mismatch() {
        let encoded = encode_chunk(b"abc").expect("encode");
        let other = ChunkId::of(b"abd");
        assert!(matches!(
            decode_chunk(&encoded, &other),
            Err(StorageError::HashMismatch { .. })
        ));
    }

    #[test]
    fn header_errors_are_typed() {
        let encoded = encode_chunk(b"abc").expect("encode");
        let id = encoded.id();
        let mut bytes = encoded.into_bytes();
        bytes[0] = 9;
        assert!(matches!(
            EncodedChunk::from_wire(id, bytes.clone()),
            Err(StorageError::UnsupportedVersion { found: 9, .. })
        ));
        bytes[0] = FRAME_VERSION;
        bytes[1] = 0x80;
        assert!(matches!(
            decode_frame(&bytes, &id),
            Err(StorageError::UnknownFlags { flags: 0x80 })
        ));
        assert!(matches!(
            decode_frame(&[1, 0], &id),
            Err(StorageError::MalformedChunk { .. })
        ));
        // A header claiming a huge plain length is refused before any allocation.
        let mut huge = vec![FRAME_VERSION, FLAG_ZSTD];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0x28, 0xb5, 0x2f, 0xfd]);
        assert!(matches!(
            decode_frame(&huge, &id),
            Err(StorageError::ChunkTooLarge { .. })
        ));
    }

    #[test]
    fn compressed_frame_claiming_short_length_cannot_overflow_output() {
        // A zstd frame of 1 MiB of zeros wrapped in a header that claims 10 bytes:
        // the decoder must refuse rather than allocate/emit more than it declared.
        let payload = zstd::bulk::compress(&vec![0u8; 1 << 20], 1).expect("compress");
        let mut frame = vec![FRAME_VERSION, FLAG_ZSTD];
        frame.extend_from_slice(&10u32.to_le_bytes());
        frame.extend_from_slice(&payload);
        let error = decode_frame(&frame, &ChunkId::of(&[0u8; 10])).expect_err("must refuse");
        assert!(error.is_corruption(), "{error}");
    }

    #[test]
    fn probe_skips_compression_but_mixed_chunk_still_compresses() {
        // Chunk that is random except for the probe points: probe says raw.
        // This documents the heuristic's known blind spot rather than hiding it.
        let mut mostly_zero = vec![0u8; DEFAULT_CHUNK_SIZE];
        let noise = pseudo_random(DEFAULT_CHUNK_SIZE, 11);
        let stride = (mostly_zero.len() - PROBE_SLICE_LEN) / (PROBE_SLICES - 1);
        for slice in 0..PROBE_SLICES {
            let start = slice * stride;
            mostly_zero[start..start + PROBE_SLICE_LEN]
                .copy_from_slice(&noise[start..start + PROBE_SLICE_LEN]);
        }
        let encoded = encode_chunk(&mostly_zero).expect("encode");
        assert!(!encoded.is_compressed());
        let no_probe = CodecConfig {
            probe_min_chunk: usize::MAX,
            ..CodecConfig::default()
        };
        let encoded = encode_chunk_with(&mostly_zero, &no_probe).expect("encode");
        assert!(encoded.is_compressed());
    }
}
