//! The clients of a chaos run. Register clients write and read a few
//! `/v1/attrs` keys through any node and record every operation in the
//! history; a job client submits gangs whose ranks beat into a shared log
//! (the ranks' own start/stop records) and checkpoint as they go, and
//! cancels some of them. Clients go through the HTTP API like users do,
//! to whichever node they picked, paused and cut-off nodes included.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_chaos::history::{Entry, Outcome, Recorder, RegisterOp};
use shoal_sdk::{Client, ClientError, JobSubmitRequest};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A client gives up on one operation after this long; its outcome is then
/// unknown.
pub const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// The keys the register clients share: few, so that they contend.
pub const KEYS: usize = 4;

/// The tenant whose GPU cap the jobs press against.
pub const CAPPED_TENANT: &str = "chaos";
pub const CAPPED_TENANT_GPUS: u32 = 6;

pub fn key(i: usize) -> String {
    format!("chaos-k{i}")
}

/// What every client needs.
#[derive(Clone)]
pub struct Target {
    /// The API of every slot, by slot.
    pub urls: Vec<String>,
    pub token: String,
    /// When the run started; history times count from it.
    pub epoch: Instant,
    pub stop: Arc<AtomicBool>,
}

impl Target {
    fn client(&self, slot: usize) -> Client {
        Client::new(self.urls[slot].clone(), Some(self.token.clone()))
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Refused for certain (the request was judged and turned down), as
/// opposed to lost on the way or timed out, when it may have taken effect.
fn definitely_refused(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { status, .. } if (400..500).contains(status) && *status != 408)
}

fn outcome_of<T>(
    result: Result<Result<T, ClientError>, tokio::time::error::Elapsed>,
    value: impl FnOnce(T) -> Option<String>,
) -> Outcome {
    match result {
        Ok(Ok(v)) => Outcome::Ok(value(v)),
        Ok(Err(e)) if definitely_refused(&e) => Outcome::Failed(e.to_string()),
        Ok(Err(e)) => Outcome::Unknown(e.to_string()),
        Err(_) => Outcome::Unknown(format!("no answer in {OP_TIMEOUT:?}")),
    }
}

/// One register operation through `slot`, recorded.
pub async fn register_op(
    target: &Target,
    recorder: &Recorder,
    client: u32,
    slot: usize,
    op: RegisterOp,
) {
    let api = target.client(slot);
    let invoked_ms = target.now_ms();
    let outcome = match &op {
        RegisterOp::Write { key, value } => outcome_of(
            tokio::time::timeout(OP_TIMEOUT, api.put_attr(key, value)).await,
            |_| None,
        ),
        RegisterOp::Read { key } => {
            let read = tokio::time::timeout(OP_TIMEOUT, api.attrs(key)).await;
            outcome_of(read, |attrs| attrs.get(key).cloned())
        }
    };
    recorder.record(Entry {
        client,
        op,
        invoked_ms,
        completed_ms: target.now_ms(),
        outcome,
    });
}

/// A register client: reads and unique writes on random keys through
/// random nodes until the run stops.
pub async fn register_client(target: Target, recorder: Recorder, client: u32, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut written = 0u64;
    while !target.stopped() {
        let slot = rng.random_range(0..target.urls.len());
        let key = key(rng.random_range(0..KEYS));
        let op = if rng.random_bool(0.5) {
            written += 1;
            RegisterOp::Write {
                key,
                value: format!("c{client}-{written}"),
            }
        } else {
            RegisterOp::Read { key }
        };
        register_op(&target, &recorder, client, slot, op).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..80))).await;
    }
}

/// What the job client saw acknowledged.
#[derive(Clone, Default)]
pub struct JobLog {
    inner: Arc<Mutex<JobCounts>>,
}

#[derive(Clone, Debug, Default)]
pub struct JobCounts {
    /// Submissions acknowledged with an id.
    pub acked: Vec<u64>,
    pub refused: u32,
    pub unknown: u32,
    /// Cancels acknowledged.
    pub cancelled: Vec<u64>,
}

impl JobLog {
    fn with<R>(&self, f: impl FnOnce(&mut JobCounts) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn counts(&self) -> JobCounts {
        self.with(|c| c.clone())
    }
}

/// The rank's shell script: beat into `log` every 200 ms for `run_ms`,
/// writing a checkpoint step every fifth beat whose bytes are a function
/// of (job, rank, step) alone, so the checker can tell a restored step
/// byte for byte.
pub fn rank_script(log: &Path, run_ms: u64) -> String {
    format!(
        r#"log='{log}'
now() {{ date +%s%3N; }}
end=$(( $(now) + {run_ms} ))
step=${{SHOAL_RESTORE_STEP:-0}}
i=0
while [ "$(now)" -lt "$end" ]; do
  echo "beat $SHOAL_JOB_ID $SHOAL_EPOCH $RANK $SHOAL_API $(now)" >> "$log"
  i=$((i + 1))
  if [ $((i % 5)) -eq 0 ] && [ -n "$SHOAL_CKPT_DIR" ]; then
    step=$((step + 1))
    # A step is marked done only once its part is written whole (a full
    # disk fails the write), as a training script's save raises.
    mkdir -p "$SHOAL_CKPT_DIR/$step" &&
      {content} > "$SHOAL_CKPT_DIR/$step/part-$RANK" &&
      touch "$SHOAL_CKPT_DIR/$step/.done"
  fi
  sleep 0.2
done
"#,
        log = log.display(),
        content = r#"printf 'job %s rank %s step %s\n' "$SHOAL_JOB_ID" "$RANK" "$step""#,
    )
}

/// The bytes [`rank_script`] writes for one rank's part of a step.
pub fn checkpoint_part(job: u64, rank: u32, step: u64) -> (String, Vec<u8>) {
    (
        format!("part-{rank}"),
        format!("job {job} rank {rank} step {step}\n").into_bytes(),
    )
}

/// The job client: submits a small gang every second or so (1-2 nodes,
/// 1-4 GPUs each, half of them for the capped tenant) and now and then
/// cancels one it submitted.
pub async fn job_client(target: Target, log: JobLog, rank_log: PathBuf, nodes: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut n = 0u32;
    while !target.stopped() {
        let slot = rng.random_range(0..target.urls.len());
        let api = target.client(slot);
        let acked = log.with(|c| c.acked.clone());
        if !acked.is_empty() && rng.random_bool(0.2) {
            let job = acked[rng.random_range(0..acked.len())];
            if let Ok(Ok(_)) = tokio::time::timeout(OP_TIMEOUT, api.cancel_job(job)).await {
                log.with(|c| c.cancelled.push(job));
            }
        } else {
            n += 1;
            let req = JobSubmitRequest {
                name: format!("chaos-{n}"),
                tenant: rng.random_bool(0.5).then(|| CAPPED_TENANT.to_string()),
                nodes: rng.random_range(1..=nodes.min(2) as u32),
                gpus_per_node: [1, 2, 4][rng.random_range(0..3)],
                gpu_model: None,
                time_limit_s: 120,
                priority: rng.random_range(0..3),
                preemptible: true,
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    rank_script(&rank_log, rng.random_range(2_000..15_000)),
                ],
                env: BTreeMap::new(),
                workdir: None,
                ckpt_interval_s: None,
                max_restarts: Some(10),
                requeue: true,
                same: None,
                max_rtt_ms: None,
                labels: BTreeMap::new(),
                mem_bytes: None,
                cpus_per_task: None,
                tasks_per_node: None,
                batch: false,
                dependency: None,
                signal: None,
                nodelist: None,
                exclude: None,
                exclusive: false,
                hold: false,
                ckpt_replicas: None,
                near: None,
            };
            match tokio::time::timeout(OP_TIMEOUT, api.submit_job(&req)).await {
                Ok(Ok(resp)) => log.with(|c| c.acked.push(resp.id)),
                Ok(Err(e)) if definitely_refused(&e) => log.with(|c| c.refused += 1),
                _ => log.with(|c| c.unknown += 1),
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1_200))).await;
    }
}
