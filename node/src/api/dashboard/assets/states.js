// Job states, as shoal_sdk::JobState names them; a unit test of the
// dashboard module keeps this file equal to the enum.
export const JOB_STATES = ["pending", "running", "checkpointing", "requeued", "completed", "failed", "cancelled", "preempted", "timeout", "node_fail", "out_of_memory"];
// The final ones: how a job ended.
export const FINAL_STATES = ["completed", "failed", "cancelled", "timeout", "node_fail", "out_of_memory"];
