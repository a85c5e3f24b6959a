//! A sandbox's network: its policy (read and changed live) and its egress events, which the
//! egress proxies write to the audit log as `egress.allowed` / `egress.denied` with the
//! sandbox as target.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use sandcell_api::SandboxId;
use sandcell_api::network::{
    EgressEventInfo, EgressEventList, NetworkInfo, NetworkPolicy, SetNetwork,
};
use sandcell_api::time::rfc3339;
use sandcell_egress::{EgressEvent, Outcome};
use sandcell_engine::fleet::Fleet;
use sandcell_store::{AuditEvent, Store};

use crate::{Caller, Service, ServiceResult};

use sandcell_protocol::{EGRESS_HTTP_PROXY as HTTP_PROXY, EGRESS_SOCKS_PROXY as SOCKS_PROXY};

/// The audit action of an egress event.
fn action(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Allowed => "egress.allowed",
        Outcome::Denied => "egress.denied",
    }
}

/// An egress event as an audit-log entry about sandbox `id`.
pub fn audit_event(id: &str, owner: Option<String>, e: &EgressEvent) -> AuditEvent {
    AuditEvent {
        id: 0,
        at: sandcell_engine::fleet::now_ms(),
        owner,
        key_id: None,
        action: action(e.outcome).to_string(),
        target: Some(id.to_string()),
        detail: Some(serde_json::json!({
            "protocol": e.protocol.as_str(),
            "host": e.host,
            "port": e.port,
            "reason": e.reason,
            "address": e.address.map(|a| a.to_string()),
            "sni": e.sni,
            "bytes_up": e.bytes_up,
            "bytes_down": e.bytes_down,
            "duration_ms": e.duration_ms,
        })),
        request_id: None,
    }
}

/// An audit-log entry written by [`audit_event`], as the API shows it (`None`: another kind).
fn event_info(a: &AuditEvent) -> Option<EgressEventInfo> {
    let d = a.detail.as_ref()?;
    let text = |k: &str| d.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let num = |k: &str| d.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Some(EgressEventInfo {
        id: a.id,
        at: rfc3339(a.at),
        protocol: text("protocol")?,
        host: text("host")?,
        port: u16::try_from(num("port")).ok()?,
        decision: a.action.strip_prefix("egress.")?.to_string(),
        reason: text("reason"),
        address: text("address"),
        sni: text("sni"),
        bytes_up: num("bytes_up"),
        bytes_down: num("bytes_down"),
        duration_ms: num("duration_ms"),
    })
}

/// How long a listing of events waits for those already emitted to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Writes the fleet's egress events to the audit log on a thread of its own: the proxies
/// emit them on their async tasks, which a SQLite insert (a sync to disk) must not hold up.
/// A listing first waits for what was emitted before it ([`EgressLog::flush`]), so it sees
/// every connection that has ended.
#[derive(Debug, Clone, Default)]
pub struct EgressLog {
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    emitted: AtomicU64,
    written: Mutex<u64>,
    changed: Condvar,
}

impl EgressLog {
    /// Waits (at most `limit`) until every event emitted so far is written.
    pub fn flush(&self, limit: Duration) {
        let target = self.counts.emitted.load(Ordering::SeqCst);
        let written = self
            .counts
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = self
            .counts
            .changed
            .wait_timeout_while(written, limit, |w| *w < target);
    }
}

/// Sends the fleet's egress events to the audit log (each sandbox's owner as its owner),
/// through a writer thread that ends with the fleet's proxies.
pub fn record_egress(fleet: &Arc<Fleet>, store: &Arc<Store>) -> EgressLog {
    let log = EgressLog::default();
    let (tx, rx) = std::sync::mpsc::channel::<AuditEvent>();
    let counts = log.counts.clone();
    let writer_store = store.clone();
    let started = std::thread::Builder::new()
        .name("egress-log".into())
        .spawn(move || {
            // Ends when the sink (the channel's sender) is dropped with the engine.
            for event in rx {
                if let Err(e) = writer_store.audit(&event) {
                    tracing::warn!(error = %e, "could not record an egress event");
                }
                let mut w = counts
                    .written
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *w += 1;
                counts.changed.notify_all();
            }
        });
    let weak: Weak<Fleet> = Arc::downgrade(fleet);
    let counts = log.counts.clone();
    let sink_store = store.clone();
    let threaded = started.is_ok();
    if let Err(e) = started {
        tracing::warn!(error = %e, "no egress log thread: events are written on the proxies' tasks");
    }
    fleet
        .engine()
        .egress()
        .set_sink(Arc::new(move |id: &str, event: EgressEvent| {
            let owner = weak.upgrade().and_then(|f| f.owner_of(id));
            let entry = audit_event(id, owner, &event);
            if threaded {
                counts.emitted.fetch_add(1, Ordering::SeqCst);
                if tx.send(entry).is_err() {
                    // The writer is gone: nothing would count this one as written.
                    counts.emitted.fetch_sub(1, Ordering::SeqCst);
                }
                return;
            }
            if let Err(e) = sink_store.audit(&entry) {
                tracing::warn!(sandbox = id, error = %e, "could not record an egress event");
            }
        }));
    log
}

impl Service {
    /// What `id`'s network reaches now, and what its egress proxy carried.
    pub fn network_info(&self, caller: &Caller, id: &SandboxId) -> ServiceResult<NetworkInfo> {
        let record = self.fleet.get(&caller.owner, id)?;
        let live = self.fleet.sandbox_as_is(&caller.owner, id).ok();
        let network = live
            .as_ref()
            .map_or_else(|| record.spec.network.clone(), |s| s.network());
        let proxied = network != NetworkPolicy::Off;
        Ok(NetworkInfo {
            http_proxy: proxied.then(|| HTTP_PROXY.to_string()),
            socks_proxy: proxied.then(|| SOCKS_PROXY.to_string()),
            bytes: live.as_ref().map_or(0, |s| s.egress_bytes()),
            open_connections: live.as_ref().map_or(0, |s| s.egress_connections()),
            network,
        })
    }

    /// Changes what `id`'s network reaches, from its next connection on.
    pub fn set_network(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: SetNetwork,
    ) -> ServiceResult<NetworkInfo> {
        self.fleet
            .set_network(&caller.owner, id, req.network.clone())?;
        self.audit(
            caller,
            "sandbox.network",
            Some(id),
            serde_json::json!({ "network": req.network }),
        );
        self.network_info(caller, id)
    }

    /// `id`'s egress events, newest first: `limit` of them (0: the default page), older
    /// than event `before` when given.
    pub fn egress_events(
        &self,
        caller: &Caller,
        id: &SandboxId,
        before: Option<i64>,
        limit: u32,
    ) -> ServiceResult<EgressEventList> {
        self.fleet.get(&caller.owner, id)?;
        self.egress_log.flush(FLUSH_WAIT);
        let page = self.store.list_audit_of(id, "egress.", before, limit)?;
        let full = page.len() == sandcell_store::page_size(limit) as usize;
        let events: Vec<EgressEventInfo> = page.iter().filter_map(event_info).collect();
        Ok(EgressEventList {
            next_before: if full {
                page.last().map(|a| a.id)
            } else {
                None
            },
            events,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcell_egress::Protocol;

    #[test]
    fn an_egress_event_round_trips_through_the_audit_log_form() {
        let e = EgressEvent {
            protocol: Protocol::Connect,
            host: "pypi.example".into(),
            port: 443,
            outcome: Outcome::Denied,
            reason: Some("not on the allow-list".into()),
            address: None,
            sni: Some("pypi.example".into()),
            bytes_up: 3,
            bytes_down: 4,
            duration_ms: 5,
            intercepted: false,
            secrets: Vec::new(),
        };
        let mut a = audit_event("sb-1", Some("alice".into()), &e);
        a.id = 7;
        assert_eq!(a.action, "egress.denied");
        assert_eq!(a.target.as_deref(), Some("sb-1"));
        let info = event_info(&a).unwrap();
        assert_eq!(info.id, 7);
        assert_eq!(info.decision, "denied");
        assert_eq!(info.protocol, "connect");
        assert_eq!((info.host.as_str(), info.port), ("pypi.example", 443));
        assert_eq!(info.reason.as_deref(), Some("not on the allow-list"));
        assert_eq!(
            (info.bytes_up, info.bytes_down, info.duration_ms),
            (3, 4, 5)
        );
        assert!(event_info(&AuditEvent { detail: None, ..a }).is_none());
    }
}
