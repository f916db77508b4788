//! Watch responses: a stream of JSON lines (`{"type":..., "object":...}`) that resumes from a
//! resourceVersion, sends bookmarks, ends at `timeoutSeconds`, and reports a compacted resourceVersion as
//! an ERROR event with a 410 Status, exactly as kube-apiserver does.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::ApiState;
use super::errors::{ApiError, ApiResult};
use super::filter::ListFilter;
use super::request::{Query, Target};
use super::store::{EventType, WatchEvent, WatchFrom};
use super::table;

/// Longest watch when the client does not say (the real server picks 30-60 minutes).
const DEFAULT_WATCH_SECONDS: u64 = 1800;

pub struct WatchRequest {
    pub target: Target,
    pub filter: ListFilter,
    pub as_table: bool,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub from: WatchFrom,
    pub timeout: Duration,
}

impl WatchRequest {
    pub fn from_query(
        target: Target,
        filter: ListFilter,
        query: &Query,
        as_table: bool,
    ) -> ApiResult<Self> {
        let send_initial_events = query.flag("sendInitialEvents");
        let from = match query.get("resourceVersion") {
            _ if send_initial_events => WatchFrom::Everything,
            None | Some("0") => WatchFrom::Everything,
            Some(rv) => WatchFrom::Rv(rv.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid resourceVersion {rv:?}: must be an integer"
                ))
            })?),
        };
        let timeout = query
            .number("timeoutSeconds")?
            .map_or(DEFAULT_WATCH_SECONDS, |s| s.max(1) as u64);
        Ok(Self {
            target,
            filter,
            as_table,
            bookmarks: query.flag("allowWatchBookmarks"),
            send_initial_events,
            from,
            timeout: Duration::from_secs(timeout),
        })
    }
}

/// What a filtered watcher sees of one change: real servers turn a change in whether an object matches
/// into ADDED or DELETED.
pub fn translate(event: &WatchEvent, filter: &ListFilter) -> Option<EventType> {
    let now = filter.matches(&event.object);
    let before = event.previous.as_ref().is_some_and(|p| filter.matches(p));
    match (event.type_, before, now) {
        (EventType::Added, _, true) => Some(EventType::Added),
        (EventType::Deleted, b, n) if b || n => Some(EventType::Deleted),
        (EventType::Modified, true, true) => Some(EventType::Modified),
        (EventType::Modified, false, true) => Some(EventType::Added),
        (EventType::Modified, true, false) => Some(EventType::Deleted),
        _ => None,
    }
}

fn line(v: &Value) -> Bytes {
    let mut buf = serde_json::to_vec(v).unwrap_or_default();
    buf.push(b'\n');
    Bytes::from(buf)
}

struct Emitter {
    req: WatchRequest,
    tx: mpsc::Sender<Bytes>,
    first_table: bool,
    last_rv: u64,
}

impl Emitter {
    async fn send(&mut self, type_: &str, object: &Value) -> bool {
        let object = if self.req.as_table && type_ != "BOOKMARK" && type_ != "ERROR" {
            let t = table::table(&self.req.target.def, &[object], "", None, self.first_table);
            self.first_table = false;
            t
        } else {
            super::present(object, &self.req.target)
        };
        self.tx
            .send(line(&json!({"type": type_, "object": object})))
            .await
            .is_ok()
    }

    async fn event(&mut self, ev: &WatchEvent) -> bool {
        self.last_rv = self.last_rv.max(ev.rv);
        match translate(ev, &self.req.filter) {
            Some(t) => self.send(t.as_str(), &ev.object).await,
            None => true,
        }
    }

    async fn bookmark(&mut self, initial_events_end: bool) -> bool {
        let mut meta = json!({"resourceVersion": self.last_rv.to_string()});
        if initial_events_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.req.target.def.kind, "apiVersion": self.req.target.api_version(), "metadata": meta});
        self.tx
            .send(line(&json!({"type": "BOOKMARK", "object": obj})))
            .await
            .is_ok()
    }
}

pub fn respond(state: Arc<ApiState>, req: WatchRequest) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(run(state, req, tx));
    let stream = ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

async fn run(state: Arc<ApiState>, req: WatchRequest, tx: mpsc::Sender<Bytes>) {
    let key = req.target.def.key();
    let resource = req.target.resource_name();
    let mut epoch = state.store.watch_epoch();
    epoch.mark_unchanged();
    let resumed = matches!(req.from, WatchFrom::Rv(rv) if rv > 0);
    let start = if resumed && state.faults.watch_gone(&resource) {
        // A fault rule: the resourceVersion counts as older than the watch cache's window.
        Err(ApiError::gone(format!(
            "too old resource version: {} ({})",
            match req.from {
                WatchFrom::Rv(rv) => rv,
                _ => 0,
            },
            state.store.current_rv()
        )))
    } else {
        state.store.watch(&key, req.from)
    };
    let start = match start {
        Ok(s) => s,
        Err(e) => {
            // A compacted resourceVersion is reported inside the stream, not as an HTTP error.
            let _ = tx
                .send(line(&json!({"type": "ERROR", "object": e.to_status()})))
                .await;
            return;
        }
    };
    let send_initial_end = req.send_initial_events && req.bookmarks;
    let bookmarks = req.bookmarks;
    let timeout = req.timeout;
    let bookmark_every = state.settings.bookmark_interval;
    let mut em = Emitter {
        req,
        tx,
        first_table: true,
        last_rv: start.rv,
    };
    for ev in &start.initial {
        if !em.event(ev).await {
            return;
        }
    }
    em.last_rv = em.last_rv.max(start.rv);
    if send_initial_end && !em.bookmark(true).await {
        return;
    }
    let mut receiver = start.receiver;
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(bookmark_every);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            _ = epoch.changed() => return,
            _ = em.tx.closed() => return,
            _ = ticker.tick(), if bookmarks => {
                if state.faults.watch_drop(&resource) || !em.bookmark(false).await { return; }
            }
            ev = receiver.recv() => match ev {
                Ok(ev) => {
                    if ev.rv <= start.rv { continue; }
                    // A fault rule: the server ends the stream here; the client resumes from the
                    // last resourceVersion it saw.
                    if state.faults.watch_drop(&resource) { return; }
                    if !em.event(&ev).await { return; }
                }
                // Too slow to keep up: the real server drops such watchers too; the client resumes.
                Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}
