//! What a worker learns from NATS between requests (R4, R18): the global kill switch, tenant
//! switches and revocations, applied in memory the moment they arrive, and the in-flight
//! requests of each connection so a revocation can cancel them.
//!
//! Memory only ever refuses sooner; it never admits. The entry path trusts the in-memory kill
//! switch only while NATS is connected (the watch replays the latest value on every reconnect);
//! otherwise the per-request context query decides, as it always does after this check.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use shared::bus::{Bus, Event, Pushed};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub struct Live {
    global_kill: AtomicBool,
    nats_connected: AtomicBool,
    /// Tenants (by handle) whose agent access NATS last said is off.
    /// Read by every call and every woken listen stream, written on a switch's push.
    tenants_off: RwLock<HashSet<String>>,
    /// In-flight requests by connection handle.
    inflight: Mutex<HashMap<String, Vec<(u64, CancellationToken)>>>,
    next_id: AtomicU64,
    /// The stamp of the latest change applied per key: a change arrives over the fast path and
    /// from the bucket, and an older copy arriving late must not undo a newer one.
    applied: Mutex<HashMap<String, i128>>,
}

/// Unregisters an in-flight request when it ends.
pub struct InFlight {
    live: Arc<Live>,
    connection: String,
    id: u64,
    pub token: CancellationToken,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut map = self.live.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(list) = map.get_mut(&self.connection) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                map.remove(&self.connection);
            }
        }
    }
}

impl Live {
    /// True when NATS says agents are paused everywhere (and NATS is connected to say so).
    pub fn killed(&self) -> bool {
        self.nats_connected.load(Ordering::Acquire) && self.global_kill.load(Ordering::Acquire)
    }

    pub fn tenant_off(&self, tenant: &str) -> bool {
        self.nats_connected.load(Ordering::Acquire)
            && self.tenants_off.read().unwrap_or_else(|p| p.into_inner()).contains(tenant)
    }

    pub fn nats_connected(&self) -> bool {
        self.nats_connected.load(Ordering::Acquire)
    }

    pub fn register(self: &Arc<Self>, connection: &str) -> InFlight {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(connection.to_owned())
            .or_default()
            .push((id, token.clone()));
        InFlight { live: self.clone(), connection: connection.to_owned(), id, token }
    }

    /// Whether a change that arrives stamped no later than the last of its key still wakes
    /// listen streams: a tenant change carries no state to order, so one from a publisher
    /// whose clock runs behind is not lost (a woken stream re-reads and compares; a duplicate
    /// costs one re-read). Switches and revocations are ordered and stay stale.
    pub fn wakes_when_stale(event: &Event) -> bool {
        matches!(event, Event::TenantChanged { .. })
    }

    /// Whether this very change (its key and stamp) was applied already: the same change
    /// arrives over the fast path and from the bucket, and its second copy wakes nothing.
    pub fn already_applied(&self, pushed: &Pushed) -> bool {
        self.applied.lock().unwrap_or_else(|p| p.into_inner()).get(&pushed.event.key())
            == Some(&pushed.sent_ns)
    }

    /// Applies a change unless a newer one of its key was applied; true when applied.
    pub fn apply_pushed(&self, pushed: &Pushed) -> bool {
        {
            let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
            let last = applied.entry(pushed.event.key()).or_insert(i128::MIN);
            if pushed.sent_ns <= *last {
                return false;
            }
            *last = pushed.sent_ns;
        }
        self.apply(&pushed.event);
        true
    }

    fn apply(&self, event: &Event) {
        match event {
            Event::GlobalKill(on) => self.global_kill.store(*on, Ordering::Release),
            Event::TenantAccess { tenant, on } => {
                let mut off = self.tenants_off.write().unwrap_or_else(|p| p.into_inner());
                if *on {
                    off.remove(tenant);
                } else {
                    off.insert(tenant.clone());
                }
            }
            // Nothing in memory depends on it; listen streams re-check (see `follow`).
            Event::TenantChanged { .. } => {}
            Event::Revoked { connection } => {
                let cancelled = self
                    .inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(connection)
                    .unwrap_or_default();
                for (_, token) in &cancelled {
                    token.cancel();
                }
                if !cancelled.is_empty() {
                    tracing::info!(
                        connection.handle = %connection,
                        requests = cancelled.len(),
                        "cancelled in-flight requests of a revoked connection"
                    );
                }
            }
        }
    }
}

/// Follows the bucket for the life of the worker: replays its history on every (re)connect,
/// then applies each change; notices a lost connection within a second and watches again.
pub async fn follow(
    bus: Bus,
    live: Arc<Live>,
    metrics: Arc<crate::metrics::Metrics>,
    streams: Arc<crate::listen::Streams>,
) {
    loop {
        let stream = match bus.watch().await {
            Some(Ok(stream)) => stream,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "NATS watch failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            None => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        live.nats_connected.store(true, Ordering::Release);
        metrics.nats_connected.set(1);
        // Pushes may have been missed while NATS was away: every stream checks again.
        streams.poke_all();
        // Changes stamped before the watch began are history being replayed, not pushes.
        let watching_since = shared::bus::now_ns();
        let mut stream = std::pin::pin!(stream);
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                pushed = stream.next() => match pushed {
                    Some(pushed) => {
                        if !live.apply_pushed(&pushed) {
                            if Live::wakes_when_stale(&pushed.event)
                                && !live.already_applied(&pushed)
                            {
                                streams.poke(&pushed.event);
                            }
                            continue;
                        }
                        tracing::debug!(bus.key = %pushed.event.key(), "push applied");
                        // A switch that turned agents away: the streams concerned are told at
                        // once (their list is empty), without each waking its task.
                        let away = match &pushed.event {
                            Event::TenantAccess { tenant, on: false } => {
                                (live.killed() || live.tenant_off(tenant)).then_some(Some(tenant.as_str()))
                            }
                            Event::GlobalKill(true) => live.killed().then_some(None),
                            _ => None,
                        };
                        match away {
                            Some(tenant) => {
                                let lag_ms =
                                    (shared::bus::now_ns() - pushed.sent_ns).max(0) as f64 / 1e6;
                                let began = std::time::Instant::now();
                                let told = streams.turn_away(tenant);
                                // One line per switch: how many streams, how long the push took
                                // to arrive and the worker to hand every event to its response.
                                tracing::info!(
                                    tenant = tenant.unwrap_or("(all)"),
                                    streams.told = told,
                                    push_lag_ms = lag_ms,
                                    fan_out_ms = began.elapsed().as_secs_f64() * 1000.0,
                                    "agents turned away: listen streams told"
                                );
                                metrics.listen_events.with_label_values(&["changed"]).inc_by(told as u64);
                            }
                            None => streams.poke(&pushed.event),
                        }
                        let kind = match pushed.event {
                            Event::GlobalKill(_) => "global_kill",
                            Event::TenantAccess { .. } => "tenant_access",
                            Event::Revoked { .. } => "revoked",
                            Event::TenantChanged { .. } => "tenant_changed",
                        };
                        metrics.bus_events.with_label_values(&[kind]).inc();
                        if pushed.sent_ns >= watching_since {
                            let lag = (shared::bus::now_ns() - pushed.sent_ns).max(0) as f64 / 1e9;
                            metrics.bus_push_lag.with_label_values(&[kind]).observe(lag);
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => if !bus.connected().await { break },
            }
        }
        live.nats_connected.store(false, Ordering::Release);
        metrics.nats_connected.set(0);
        tracing::warn!("lost the NATS watch; Postgres alone decides until it is back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_tenant_change_still_wakes_and_a_late_switch_does_not_undo() {
        let live = Live::default();
        let changed =
            |ns| Pushed { event: Event::TenantChanged { tenant: "ten_a".into() }, sent_ns: ns };
        assert!(live.apply_pushed(&changed(10)));
        // Stamped earlier (a publisher's clock behind): not applied, but it wakes.
        assert!(!live.apply_pushed(&changed(5)));
        assert!(Live::wakes_when_stale(&changed(5).event));
        // A switch stamped earlier than the last never undoes it, nor wakes.
        let off = Pushed {
            event: Event::TenantAccess { tenant: "ten_a".into(), on: false },
            sent_ns: 20,
        };
        let on_late =
            Pushed { event: Event::TenantAccess { tenant: "ten_a".into(), on: true }, sent_ns: 15 };
        live.nats_connected.store(true, Ordering::Release);
        assert!(live.apply_pushed(&off));
        assert!(!live.apply_pushed(&on_late));
        assert!(live.tenant_off("ten_a"), "the newer switch stands");
        assert!(!Live::wakes_when_stale(&on_late.event));
        // The same change a second time (fast path, then bucket) was applied already.
        assert!(live.already_applied(&changed(10)));
        assert!(!live.already_applied(&changed(5)), "an older copy is not the same change");
    }
}
