//! The control plane's background work: one [`Job`] trait and one driver.
//!
//! Each job runs in a task of its own at its own interval, so none waits on another: audit
//! chaining keeps its pace while a tenant's SIEM takes seconds to answer, and the outbox
//! dispatcher goes on while checkpoints are signed. Webhook delivery goes further: each
//! tenant's round is a task of its own ([`Webhooks`]), so a slow or dead endpoint delays only
//! its own tenant. No job keeps a database transaction open across a network call.
//!
//! The driver records, per job, its last run, last success, duration, runs and errors, as
//! metrics (`gatehouse_control_plane_job_*`) and on the operator endpoint `/jobs`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Serialize;
use shared::Services;
use shared::services::audit;

use crate::AppState;

/// What a run did: how much work, and whether more is waiting (run again at once).
#[derive(Debug, Clone, Copy, Default)]
pub struct Ran {
    pub work: u64,
    pub more: bool,
}

/// A piece of background work the driver runs every `interval`.
pub trait Job: Send + 'static {
    /// The job's name in metrics, logs and `/jobs`.
    const NAME: &'static str;
    fn interval(&self) -> Duration;
    fn run(&mut self) -> impl Future<Output = Result<Ran, String>> + Send;
}

/// One job's state, as operators see it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobState {
    pub interval_ms: u64,
    pub runs: u64,
    pub errors: u64,
    pub last_run_at: Option<String>,
    pub last_success_at: Option<String>,
    pub last_duration_ms: u64,
    pub last_work: u64,
    pub last_error: Option<String>,
}

/// Every job's state (the `/jobs` endpoint reads it).
#[derive(Debug, Default)]
pub struct Board {
    jobs: Mutex<HashMap<&'static str, JobState>>,
}

impl Board {
    pub fn snapshot(&self) -> HashMap<&'static str, JobState> {
        self.jobs.lock().map(|j| j.clone()).unwrap_or_default()
    }

    fn record(
        &self,
        name: &'static str,
        interval: Duration,
        took: Duration,
        ran: &Result<Ran, String>,
    ) {
        let Ok(mut jobs) = self.jobs.lock() else { return };
        let s = jobs.entry(name).or_default();
        let now = Some(Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        s.interval_ms = interval.as_millis() as u64;
        s.runs += 1;
        s.last_run_at = now.clone();
        s.last_duration_ms = took.as_millis() as u64;
        match ran {
            Ok(r) => {
                s.last_success_at = now;
                s.last_work = r.work;
                s.last_error = None;
            }
            Err(e) => {
                s.errors += 1;
                s.last_error = Some(e.clone());
            }
        }
    }
}

/// Runs `job` forever in its own task, recording every run.
pub fn spawn<J: Job>(mut job: J, state: Arc<AppState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let started = Instant::now();
            let ran = run_contained(&mut job).await;
            let took = started.elapsed();
            state.jobs.record(J::NAME, job.interval(), took, &ran);
            let m = &state.metrics;
            let outcome = if ran.is_ok() { "ok" } else { "error" };
            m.job_runs.with_label_values(&[J::NAME, outcome]).inc();
            m.job_duration.with_label_values(&[J::NAME]).set(took.as_secs_f64());
            m.job_last_run.with_label_values(&[J::NAME]).set(Utc::now().timestamp() as f64);
            match &ran {
                Ok(r) => {
                    m.job_last_success
                        .with_label_values(&[J::NAME])
                        .set(Utc::now().timestamp() as f64);
                    if r.more {
                        continue;
                    }
                }
                Err(e) => {
                    tracing::warn!(job = J::NAME, error = %e, "background job failed; retrying")
                }
            }
            tokio::time::sleep(job.interval()).await;
        }
    })
}

/// One run of `job`; a run that panics is a failed run (recorded, retried after the interval),
/// never the end of the job's task: a message that crashes the outbox's sink must not stop
/// every later delivery of the process.
async fn run_contained<J: Job>(job: &mut J) -> Result<Ran, String> {
    use futures_util::FutureExt;
    match std::panic::AssertUnwindSafe(job.run()).catch_unwind().await {
        Ok(ran) => ran,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            // Logged once, by the caller, as the failed run it is.
            Err(format!("the run panicked: {what}"))
        }
    }
}

fn text(e: shared::Error) -> String {
    e.to_string()
}

/// Chains each tenant's new audit rows (every half second).
pub struct Chain {
    pub ds: Services,
}

impl Job for Chain {
    const NAME: &'static str = "audit_chain";
    fn interval(&self) -> Duration {
        Duration::from_millis(500)
    }
    async fn run(&mut self) -> Result<Ran, String> {
        let n = audit::chain_round(&self.ds).await.map_err(text)?;
        Ok(Ran { work: n as u64, more: false })
    }
}

/// Signs each tenant's chain head when it moved, after checking it extends the last
/// checkpoint signed; refusals are counted, logged and sent to the tenant's webhook.
pub struct Checkpoints {
    pub state: Arc<AppState>,
    pub every: Duration,
    pub anchors: audit::Anchors,
    /// When each (tenant, reason) was last alerted, so a standing refusal alerts hourly.
    pub alerted: HashMap<(i64, String), Instant>,
}

impl Job for Checkpoints {
    const NAME: &'static str = "audit_checkpoints";
    fn interval(&self) -> Duration {
        self.every
    }
    async fn run(&mut self) -> Result<Ran, String> {
        let round =
            audit::checkpoint_round(&self.state.ds, &mut self.anchors).await.map_err(text)?;
        let m = &self.state.metrics;
        if round.file_error.is_some() {
            m.audit_anchor_file_errors.inc();
        }
        for r in &round.refused {
            m.audit_checkpoint_refusals.with_label_values(&[&r.tenant]).inc();
            let key = (r.tenant_id, r.reason.clone());
            let due =
                self.alerted.get(&key).is_none_or(|t| t.elapsed() > Duration::from_secs(3600));
            if due {
                self.alerted.insert(key, Instant::now());
                let (state, refusal) = (self.state.clone(), r.clone());
                // The alert is an HTTP call: its own task, so signing never waits on it.
                tokio::spawn(async move {
                    match audit::send_alert(&state.ds, &state.fetch, &refusal).await {
                        Ok(true) => {
                            tracing::info!(tenant.handle = %refusal.tenant, "audit alert sent to the tenant's webhook")
                        }
                        Ok(false) => {
                            tracing::warn!(tenant.handle = %refusal.tenant, "audit alert not delivered (no webhook, or it refused)")
                        }
                        Err(e) => tracing::warn!(error = %e, "audit alert"),
                    }
                });
            }
        }
        if !round.signed.is_empty() {
            tracing::info!(checkpoints = round.signed.len(), "audit checkpoints signed");
        }
        match round.file_error {
            Some(e) => Err(e),
            None => Ok(Ran { work: round.signed.len() as u64, more: false }),
        }
    }
}

/// Starts one delivery task per tenant whose webhook is due; a tenant's slow endpoint holds
/// only its own task.
pub struct Webhooks {
    pub state: Arc<AppState>,
    pub policy: audit::WebhookPolicy,
    pub running: HashMap<i64, tokio::task::JoinHandle<()>>,
}

impl Job for Webhooks {
    const NAME: &'static str = "audit_webhooks";
    fn interval(&self) -> Duration {
        Duration::from_millis(250)
    }
    async fn run(&mut self) -> Result<Ran, String> {
        self.running.retain(|_, task| !task.is_finished());
        let due = audit::webhooks_due(&self.state.ds).await.map_err(text)?;
        let mut started = 0;
        for tenant in due {
            if self.running.contains_key(&tenant) {
                continue;
            }
            let (state, policy) = (self.state.clone(), self.policy);
            started += 1;
            self.running.insert(
                tenant,
                tokio::spawn(async move {
                    match audit::deliver_tenant(&state.ds, &state.fetch, policy, tenant).await {
                        Ok(done) => {
                            let m = &state.metrics.audit_webhook_deliveries;
                            m.with_label_values(&["sent"]).inc_by(done.sent as u64);
                            m.with_label_values(&["failed"]).inc_by(done.failed as u64);
                            m.with_label_values(&["dropped"]).inc_by(done.dropped as u64);
                        }
                        Err(e) => tracing::warn!(tenant.id = tenant, error = %e, "audit webhook round failed; retrying"),
                    }
                }),
            );
        }
        self.state.metrics.audit_webhook_tasks.set(self.running.len() as i64);
        Ok(Ran { work: started, more: false })
    }
}

/// Delivers queued messages through `sink`.
pub struct Outbox<S> {
    pub ds: Services,
    pub sink: S,
    pub state: Arc<AppState>,
}

impl<S: shared::services::outbox::Sink + 'static> Job for Outbox<S> {
    const NAME: &'static str = "outbox";
    fn interval(&self) -> Duration {
        Duration::from_millis(500)
    }
    async fn run(&mut self) -> Result<Ran, String> {
        let done = shared::services::outbox::dispatch_once(&self.ds, &self.sink, 50)
            .await
            .map_err(text)?;
        let deliveries = &self.state.metrics.outbox_deliveries;
        deliveries.with_label_values(&["sent"]).inc_by(done.sent as u64);
        deliveries.with_label_values(&["failed"]).inc_by(done.failed as u64);
        Ok(Ran { work: done.sent as u64, more: done.sent > 0 })
    }
}

/// Removes expired rows (sessions, codes, replay entries, ceremonies, budget ledgers).
pub struct Housekeeping {
    pub ds: Services,
}

impl Job for Housekeeping {
    const NAME: &'static str = "housekeeping";
    fn interval(&self) -> Duration {
        Duration::from_secs(300)
    }
    async fn run(&mut self) -> Result<Ran, String> {
        let removed = shared::services::housekeeping(&self.ds).await.map_err(text)?;
        Ok(Ran { work: removed, more: false })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job whose first run panics and whose second succeeds.
    struct Flaky(u32);

    impl Job for Flaky {
        const NAME: &'static str = "flaky";
        fn interval(&self) -> Duration {
            Duration::from_millis(1)
        }
        async fn run(&mut self) -> Result<Ran, String> {
            self.0 += 1;
            if self.0 == 1 {
                panic!("a message the sink cannot take");
            }
            Ok(Ran { work: 1, more: false })
        }
    }

    #[tokio::test]
    async fn a_run_that_panics_is_a_failed_run_and_the_next_one_runs() {
        let mut job = Flaky(0);
        let first = run_contained(&mut job).await;
        assert_eq!(
            first.err().as_deref(),
            Some("the run panicked: a message the sink cannot take")
        );
        let second = run_contained(&mut job).await.expect("the next run");
        assert_eq!(second.work, 1);
    }
}
