//! Trace readers: turn the CSV job logs we replay into [`TraceJob`]s.
//!
//! Three formats are understood, detected from the header with
//! [`TraceFormat::Auto`]:
//!
//! - **philly** — Microsoft Philly as split per virtual cluster by the PCS
//!   simulator (`app_id,submit_time,service,num_jobs,sleep_time,model_name`).
//!   The tenant is the VC id taken from the file name (`trace_<vc>.csv`), the
//!   GPU count is `num_jobs`, and the run time is `ceil(service / num_jobs)`
//!   seconds (PCS finishes a job after `service / GPUs`). Every VC file starts
//!   at t = 0 (absolute dates are lost), so replaying a directory overlays the
//!   VCs from a common origin.
//! - **alibaba** — Alibaba GPU 2023 "openb" pod list. There is no tenant
//!   column, so the QoS class (`LS`, `BE`, `Burstable`, `Guaranteed`) is the
//!   tenant. GPU sharing is not modelled: a fractional request
//!   (`num_gpu = 1, gpu_milli < 1000`) is rounded **up** to one whole GPU, so
//!   the simulated cluster is more crowded than the real one that packed
//!   several such pods per GPU. The run time is `deletion_time −
//!   scheduled_time`. CPU-only pods (`num_gpu = 0`) and pods that never ran
//!   (no `scheduled_time`, i.e. still Pending when deleted) have no GPU run
//!   time and are skipped and counted in [`Trace::skipped`]. Pods still
//!   running at the end of the trace keep their truncated duration.
//! - **simple** — a documented minimal format: header
//!   `submit_time,gpus,duration,tenant,status`, or `nodes,gpus_per_node` in
//!   place of `gpus` for an explicit gang shape, and optionally a
//!   `time_limit` column. Times are seconds (decimals allowed, rounded).
//!   `status` is kept for reference and does not change the replay.
//!
//! # Time limits
//! EASY backfill needs a time limit per job. Only the simple format can carry
//! one; elsewhere the limit is [`ESTIMATED_LIMIT_FACTOR`] × the run time, a
//! stand-in for users' habit of over-asking. Jobs are never killed early by
//! such an estimated limit because it always exceeds the run time.
//!
//! # Errors
//! Readers never panic on input: every malformed field yields a
//! [`TraceError::Parse`] naming the file and the 1-based line.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Time limit used when the trace has none, as a multiple of the run time.
pub const ESTIMATED_LIMIT_FACTOR: u64 = 2;

/// One job of a trace, ready to replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceJob {
    /// Dense, in submission order (ties keep file and line order).
    pub id: u64,
    pub tenant: String,
    pub submit_s: u64,
    /// Total GPUs requested.
    pub gpus: u32,
    /// Run time at full allocation; at least one second.
    pub duration_s: u64,
    /// The limit the scheduler plans with (see the module doc).
    pub time_limit_s: u64,
    /// Explicit `nodes × gpus_per_node`, when the trace states one.
    pub shape: Option<GangShape>,
    /// Final status as recorded by the trace, if any; informational only.
    pub status: Option<String>,
}

/// A gang's layout: `nodes` nodes with `gpus_per_node` GPUs each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangShape {
    pub nodes: u32,
    pub gpus_per_node: u32,
}

/// Which reader to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TraceFormat {
    /// Decide per file from its header.
    Auto,
    Philly,
    Alibaba,
    Simple,
}

impl std::str::FromStr for TraceFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(TraceFormat::Auto),
            "philly" => Ok(TraceFormat::Philly),
            "alibaba" => Ok(TraceFormat::Alibaba),
            "simple" => Ok(TraceFormat::Simple),
            other => Err(format!(
                "unknown trace format `{other}` (auto|philly|alibaba|simple)"
            )),
        }
    }
}

/// Jobs read from one or more files, plus what was deliberately left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
    /// Reason → rows skipped for it (CPU-only pods, pods that never ran).
    pub skipped: BTreeMap<String, usize>,
}

/// What went wrong reading a trace; always names the file.
#[derive(Debug, Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: line {line}: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: cannot tell the trace format from header `{header}`")]
    UnknownFormat { path: String, header: String },
    #[error("{path}: the {format} format needs a `{column}` column")]
    MissingColumn {
        path: String,
        format: &'static str,
        column: &'static str,
    },
    #[error("{path}: no .csv files to replay")]
    NoFiles { path: String },
}

/// Reads a file, or every `*.csv` file of a directory (sorted by name).
pub fn load_trace(path: &Path, format: TraceFormat) -> Result<Trace, TraceError> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let entries = fs::read_dir(path).map_err(|source| io_error(path, source))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| io_error(path, source))?;
            let file = entry.path();
            if file.extension().is_some_and(|ext| ext == "csv") {
                files.push(file);
            }
        }
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    if files.is_empty() {
        return Err(TraceError::NoFiles {
            path: path.display().to_string(),
        });
    }
    let mut sources = Vec::with_capacity(files.len());
    for file in &files {
        let text = fs::read_to_string(file).map_err(|source| io_error(file, source))?;
        sources.push((file.display().to_string(), text));
    }
    let borrowed: Vec<(&str, &str)> = sources
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    parse_traces(&borrowed, format)
}

/// Parses in-memory files `(name, contents)`; the name supplies the Philly
/// VC and appears in errors. Jobs of all files are merged in submit order.
pub fn parse_traces(files: &[(&str, &str)], format: TraceFormat) -> Result<Trace, TraceError> {
    let mut trace = Trace::default();
    // (submit, file index, row index) gives a total, reproducible order.
    let mut keyed: Vec<((u64, usize, usize), TraceJob)> = Vec::new();
    for (file_index, (name, text)) in files.iter().enumerate() {
        let rows = parse_file(name, text, format, &mut trace.skipped)?;
        for (row_index, job) in rows.into_iter().enumerate() {
            keyed.push(((job.submit_s, file_index, row_index), job));
        }
    }
    keyed.sort_by_key(|(key, _)| *key);
    trace.jobs = keyed
        .into_iter()
        .enumerate()
        .map(|(id, (_, mut job))| {
            job.id = id as u64;
            job
        })
        .collect();
    Ok(trace)
}

fn io_error(path: &Path, source: std::io::Error) -> TraceError {
    TraceError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Detects the format of one header line.
pub fn detect_format(header: &str) -> Option<TraceFormat> {
    let columns: Vec<String> = split_csv_line(header)
        .ok()?
        .into_iter()
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let has = |name: &str| columns.iter().any(|c| c == name);
    if has("num_jobs") && has("service") && has("submit_time") {
        Some(TraceFormat::Philly)
    } else if has("num_gpu") && has("creation_time") && has("deletion_time") {
        Some(TraceFormat::Alibaba)
    } else if has("submit_time") && has("duration") && has("tenant") {
        Some(TraceFormat::Simple)
    } else {
        None
    }
}

/// Column positions by header name.
struct Header {
    path: String,
    columns: BTreeMap<String, usize>,
}

impl Header {
    fn required(&self, format: &'static str, column: &'static str) -> Result<usize, TraceError> {
        self.columns
            .get(column)
            .copied()
            .ok_or(TraceError::MissingColumn {
                path: self.path.clone(),
                format,
                column,
            })
    }

    fn optional(&self, column: &str) -> Option<usize> {
        self.columns.get(column).copied()
    }
}

/// One data row, with enough context to report errors.
struct Row<'a> {
    path: &'a str,
    line: usize,
    fields: Vec<String>,
}

impl Row<'_> {
    fn error(&self, message: String) -> TraceError {
        TraceError::Parse {
            path: self.path.to_string(),
            line: self.line,
            message,
        }
    }

    fn text(&self, index: usize, column: &str) -> Result<&str, TraceError> {
        self.fields.get(index).map(|f| f.trim()).ok_or_else(|| {
            self.error(format!(
                "missing field `{column}` ({} fields)",
                self.fields.len()
            ))
        })
    }

    /// Non-negative seconds, decimals rounded to the nearest second.
    fn seconds(&self, index: usize, column: &str) -> Result<u64, TraceError> {
        let text = self.text(index, column)?;
        let value: f64 = text
            .parse()
            .map_err(|_| self.error(format!("`{column}` is not a number: `{text}`")))?;
        if !value.is_finite() || !(0.0..=1e15).contains(&value) {
            return Err(self.error(format!("`{column}` must be a non-negative time: `{text}`")));
        }
        Ok(value.round() as u64)
    }

    fn float(&self, index: usize, column: &str) -> Result<f64, TraceError> {
        let text = self.text(index, column)?;
        let value: f64 = text
            .parse()
            .map_err(|_| self.error(format!("`{column}` is not a number: `{text}`")))?;
        if !value.is_finite() || value < 0.0 {
            return Err(self.error(format!("`{column}` must be non-negative: `{text}`")));
        }
        Ok(value)
    }

    fn count(&self, index: usize, column: &str) -> Result<u32, TraceError> {
        let text = self.text(index, column)?;
        text.parse().map_err(|_| {
            self.error(format!(
                "`{column}` is not a whole non-negative number: `{text}`"
            ))
        })
    }
}

fn parse_file(
    path: &str,
    text: &str,
    format: TraceFormat,
    skipped: &mut BTreeMap<String, usize>,
) -> Result<Vec<TraceJob>, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((header_index, header_line)) = lines.next() else {
        return Ok(Vec::new());
    };
    let header_line = header_line.trim_start_matches('\u{feff}');
    let format = match format {
        TraceFormat::Auto => {
            detect_format(header_line).ok_or_else(|| TraceError::UnknownFormat {
                path: path.to_string(),
                header: header_line.to_string(),
            })?
        }
        explicit => explicit,
    };
    let header_fields = split_csv_line(header_line).map_err(|message| TraceError::Parse {
        path: path.to_string(),
        line: header_index + 1,
        message,
    })?;
    let header = Header {
        path: path.to_string(),
        columns: header_fields
            .iter()
            .enumerate()
            .map(|(i, name)| (name.trim().to_ascii_lowercase(), i))
            .collect(),
    };
    let mut rows = Vec::new();
    for (index, line) in lines {
        let fields = split_csv_line(line).map_err(|message| TraceError::Parse {
            path: path.to_string(),
            line: index + 1,
            message,
        })?;
        rows.push(Row {
            path,
            line: index + 1,
            fields,
        });
    }
    match format {
        TraceFormat::Philly => parse_philly(path, &header, &rows),
        TraceFormat::Alibaba => parse_alibaba(&header, &rows, skipped),
        TraceFormat::Simple => parse_simple(&header, &rows),
        TraceFormat::Auto => Err(TraceError::UnknownFormat {
            path: path.to_string(),
            header: header_line.to_string(),
        }),
    }
}

/// `trace_<vc>.csv` → `<vc>`; any other name is used whole (minus `.csv`).
fn philly_vc(path: &str) -> String {
    let file = Path::new(path)
        .file_stem()
        .map_or_else(|| path.to_string(), |s| s.to_string_lossy().into_owned());
    file.strip_prefix("trace_")
        .map_or(file.clone(), str::to_string)
}

fn parse_philly(
    path: &str,
    header: &Header,
    rows: &[Row<'_>],
) -> Result<Vec<TraceJob>, TraceError> {
    const FORMAT: &str = "philly";
    let submit = header.required(FORMAT, "submit_time")?;
    let service = header.required(FORMAT, "service")?;
    let gpus = header.required(FORMAT, "num_jobs")?;
    let tenant = philly_vc(path);
    rows.iter()
        .map(|row| {
            let gpu_count = row.count(gpus, "num_jobs")?;
            if gpu_count == 0 {
                return Err(row.error("`num_jobs` (GPUs) must be at least 1".to_string()));
            }
            let work = row.float(service, "service")?;
            let duration_s = duration_from_work(work, gpu_count)
                .ok_or_else(|| row.error(format!("`service` is out of range: {work}")))?;
            Ok(TraceJob {
                id: 0,
                tenant: tenant.clone(),
                submit_s: row.seconds(submit, "submit_time")?,
                gpus: gpu_count,
                duration_s,
                time_limit_s: estimated_limit(duration_s),
                shape: None,
                status: None,
            })
        })
        .collect()
}

/// Run time of `work` GPU-seconds on `gpus` GPUs, rounded up, at least 1 s.
fn duration_from_work(work: f64, gpus: u32) -> Option<u64> {
    let seconds = (work / f64::from(gpus)).ceil();
    (seconds.is_finite() && seconds < 1e15).then(|| (seconds as u64).max(1))
}

fn estimated_limit(duration_s: u64) -> u64 {
    duration_s.saturating_mul(ESTIMATED_LIMIT_FACTOR)
}

fn parse_alibaba(
    header: &Header,
    rows: &[Row<'_>],
    skipped: &mut BTreeMap<String, usize>,
) -> Result<Vec<TraceJob>, TraceError> {
    const FORMAT: &str = "alibaba";
    let num_gpu = header.required(FORMAT, "num_gpu")?;
    let qos = header.required(FORMAT, "qos")?;
    let created = header.required(FORMAT, "creation_time")?;
    let scheduled = header.required(FORMAT, "scheduled_time")?;
    let deleted = header.required(FORMAT, "deletion_time")?;
    let gpu_milli = header.optional("gpu_milli");
    let phase = header.optional("pod_phase");
    let mut jobs = Vec::new();
    for row in rows {
        let gpus = row.count(num_gpu, "num_gpu")?;
        if let Some(index) = gpu_milli {
            // Validated even though a fraction is rounded up to a whole GPU.
            if !row.text(index, "gpu_milli")?.is_empty() {
                row.count(index, "gpu_milli")?;
            }
        }
        let submit_s = row.seconds(created, "creation_time")?;
        let end_s = row.seconds(deleted, "deletion_time")?;
        let start_text = row.text(scheduled, "scheduled_time")?;
        if gpus == 0 {
            *skipped
                .entry("cpu-only pod (num_gpu = 0)".to_string())
                .or_default() += 1;
            continue;
        }
        if start_text.is_empty() {
            *skipped
                .entry("never scheduled (no scheduled_time)".to_string())
                .or_default() += 1;
            continue;
        }
        let start_s = row.seconds(scheduled, "scheduled_time")?;
        if end_s < start_s {
            return Err(row.error(format!(
                "deletion_time {end_s} is before scheduled_time {start_s}"
            )));
        }
        let duration_s = (end_s - start_s).max(1);
        let tenant = row.text(qos, "qos")?;
        jobs.push(TraceJob {
            id: 0,
            tenant: if tenant.is_empty() {
                "unknown".to_string()
            } else {
                tenant.to_string()
            },
            submit_s,
            gpus,
            duration_s,
            time_limit_s: estimated_limit(duration_s),
            shape: None,
            status: phase
                .and_then(|i| row.fields.get(i))
                .map(|s| s.trim().to_string()),
        });
    }
    Ok(jobs)
}

fn parse_simple(header: &Header, rows: &[Row<'_>]) -> Result<Vec<TraceJob>, TraceError> {
    const FORMAT: &str = "simple";
    let submit = header.required(FORMAT, "submit_time")?;
    let duration = header.required(FORMAT, "duration")?;
    let tenant = header.required(FORMAT, "tenant")?;
    let status = header.optional("status");
    let limit = header.optional("time_limit");
    enum Demand {
        Total(usize),
        Shape(usize, usize),
    }
    let demand = match (
        header.optional("gpus"),
        header.optional("nodes"),
        header.optional("gpus_per_node"),
    ) {
        (Some(gpus), _, _) => Demand::Total(gpus),
        (None, Some(nodes), Some(per_node)) => Demand::Shape(nodes, per_node),
        (None, None, _) => return header.required(FORMAT, "gpus").map(|_| Vec::new()),
        (None, Some(_), None) => {
            return header.required(FORMAT, "gpus_per_node").map(|_| Vec::new())
        }
    };
    rows.iter()
        .map(|row| {
            let (gpus, shape) = match demand {
                Demand::Total(index) => (row.count(index, "gpus")?, None),
                Demand::Shape(nodes_at, per_node_at) => {
                    let nodes = row.count(nodes_at, "nodes")?;
                    let gpus_per_node = row.count(per_node_at, "gpus_per_node")?;
                    let total = nodes
                        .checked_mul(gpus_per_node)
                        .ok_or_else(|| row.error("nodes × gpus_per_node overflows".to_string()))?;
                    (
                        total,
                        Some(GangShape {
                            nodes,
                            gpus_per_node,
                        }),
                    )
                }
            };
            if gpus == 0 {
                return Err(row.error("a job needs at least one GPU".to_string()));
            }
            let duration_s = row.seconds(duration, "duration")?.max(1);
            let time_limit_s = match limit {
                Some(index) if !row.text(index, "time_limit")?.is_empty() => {
                    row.seconds(index, "time_limit")?.max(1)
                }
                _ => estimated_limit(duration_s),
            };
            let tenant_name = row.text(tenant, "tenant")?;
            if tenant_name.is_empty() {
                return Err(row.error("`tenant` is empty".to_string()));
            }
            Ok(TraceJob {
                id: 0,
                tenant: tenant_name.to_string(),
                submit_s: row.seconds(submit, "submit_time")?,
                gpus,
                duration_s,
                time_limit_s,
                shape,
                status: status
                    .and_then(|i| row.fields.get(i))
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
            })
        })
        .collect()
}

/// Splits one CSV line, honouring double quotes (`""` is a literal quote).
/// Quoted fields spanning lines are not supported by these traces.
pub fn split_csv_line(line: &str) -> Result<Vec<String>, String> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut in_quotes = false;
    while let Some(c) = chars.next() {
        match (c, in_quotes) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', true) => in_quotes = false,
            ('"', false) if field.is_empty() => in_quotes = true,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    if in_quotes {
        return Err("unterminated quoted field".to_string());
    }
    fields.push(field);
    Ok(fields)
}

#[cfg(test)]
mod hostile_input {
    use super::*;
    use proptest::prelude::*;

    const PHILLY_LIKE: &str = "jobid,submitted_time,num_gpus,duration\n1,0,8,3600\n";

    proptest! {
        /// Any text in any format parses or is refused with an error; a
        /// trace file is input from anywhere, never a reason to panic.
        #[test]
        fn arbitrary_trace_text_never_panics(text in "(?s).{0,600}", format in 0usize..4) {
            let format = [TraceFormat::Auto, TraceFormat::Philly, TraceFormat::Alibaba, TraceFormat::Simple][format];
            let _ = parse_traces(&[("vc1.csv", text.as_str())], format);
        }

        /// A plausible file with bytes replaced anywhere.
        #[test]
        fn corrupted_trace_files_never_panic(flips in proptest::collection::vec((0usize..200, prop::char::range(' ', '~')), 1..10)) {
            let mut chars: Vec<char> = PHILLY_LIKE.chars().collect();
            for (at, c) in flips {
                let len = chars.len();
                chars[at % len] = c;
            }
            let text: String = chars.into_iter().collect();
            let _ = parse_traces(&[("vc1.csv", text.as_str())], TraceFormat::Auto);
        }
    }
}
