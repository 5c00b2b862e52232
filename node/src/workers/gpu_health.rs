//! Keeps broken GPUs out of placement: a GPU with an uncorrectable ECC
//! error, a fatal XID, or gone from the driver is reported to the ledger,
//! which stops the job on it (it runs again elsewhere) and gives the GPU no
//! work until an operator returns it (`shoal gpu undrain`).

use crate::gpu::health::faults;
use crate::gpu::Gpus;
use crate::ledger_client::LedgerClient;
use crate::node::LocalMember;
use crate::worker::Worker;
use shoal_consensus::ledger::GpuFaultReport;
use shoal_consensus::Command;
use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::time::Duration;

pub struct GpuHealth {
    pub local: LocalMember,
    pub ledger: LedgerClient,
    pub gpus: Gpus,
}

impl Worker for GpuHealth {
    fn period(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let found = faults(&self.local.spec.gpus, &self.gpus.latest());
        if found.is_empty() {
            return ControlFlow::Continue(());
        }
        let known: BTreeSet<u32> = match self.ledger.read() {
            Ok(d) => d
                .ledger
                .workload
                .gpu_faults
                .get(&self.local.id)
                .map(|g| g.keys().copied().collect())
                .unwrap_or_default(),
            Err(_) => return ControlFlow::Break(()),
        };
        for (gpu, reason) in found.into_iter().filter(|(g, _)| !known.contains(g)) {
            tracing::warn!(gpu, %reason, "a GPU failed; it takes no more work");
            let cmd = Command::SetGpuFault {
                node: self.local.id,
                gpu,
                fault: Some(GpuFaultReport {
                    reason,
                    detected: true,
                }),
            };
            if let Err(e) = self.ledger.write(cmd).await {
                tracing::debug!(error = %e, gpu, "could not report the GPU fault yet");
            }
        }
        ControlFlow::Continue(())
    }
}
