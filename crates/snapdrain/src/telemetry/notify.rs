//! Notifications: every plan Event, also POSTed as JSON to the DisruptionPolicy's notification
//! webhook, its URL from `notifications.webhook.urlSecretRef` or `.url` (Kubernetes Events are always
//! written; this is for a chat or paging system). Delivery is best effort and never slows a plan: Events are queued and sent in order by one
//! task, each retried with exponential backoff (1 s doubling, at most 5 min apart) up to `retries` times.
//! What matters during an incident is kept (review #15): a full queue drops its oldest Normal
//! notification (its oldest of all only when every one is a Warning), never the newest; and after
//! [`BREAKER_AFTER`] notifications in a row could not be delivered, the endpoint counts as down: nothing
//! is given up then, the head of the queue is tried once per pause (doubling up to 5 min) until it goes
//! through, and the backlog follows.
//!
//! Whoever edits the policy chooses where snapdrain sends requests from inside the cluster, so: https
//! only unless `allowInsecureHttp`; no loopback, link-local, private or unique-local address unless
//! `allowPrivateAddresses`, checked on the literal host and on every address a name resolves to (at
//! connect time, by the client's resolver, so a name cannot change between check and use); redirects
//! are not followed; and errors and logs show the URL's scheme and host only (its path or query is
//! often the secret of a chat webhook).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use serde::Serialize;
use tokio::sync::Notify;

use super::Metrics;
use crate::api::policy::WebhookNotification;

/// A notification webhook whose URL is known: the policy's `url`, or the value its `urlSecretRef`
/// names (read by the policy follower, `controller::notifications`).
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
    pub reasons: Vec<String>,
    pub retries: u32,
    pub allow_insecure_http: bool,
    pub allow_private_addresses: bool,
}

impl Endpoint {
    /// `webhook`'s settings with `url`.
    pub fn new(webhook: &WebhookNotification, url: &str) -> Self {
        Self {
            url: url.to_owned(),
            reasons: webhook.reasons.clone(),
            retries: webhook.retries,
            allow_insecure_http: webhook.allow_insecure_http,
            allow_private_addresses: webhook.allow_private_addresses,
        }
    }
}

/// The URL is shown redacted: its path or query is often the webhook's secret.
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &redacted(&self.url))
            .field("reasons", &self.reasons)
            .field("retries", &self.retries)
            .field("allow_insecure_http", &self.allow_insecure_http)
            .field("allow_private_addresses", &self.allow_private_addresses)
            .finish()
    }
}

/// How many notifications wait for delivery before old ones are dropped.
const QUEUE: usize = 512;

/// Notifications in a row that could not be delivered before the endpoint counts as down.
pub const BREAKER_AFTER: u32 = 3;

/// Longest pause between tries of an endpoint that is down.
const MAX_PAUSE: Duration = Duration::from_secs(300);

/// What the webhook receives, one JSON object per plan Event.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// Always `DisruptionPlanEvent`, so a receiver can tell these from other senders.
    pub kind: &'static str,
    pub plan: String,
    /// `Normal` or `Warning`, as on the Kubernetes Event.
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub phase: String,
    pub nodes: Vec<String>,
    /// RFC 3339.
    pub time: String,
}

impl Notification {
    pub fn new(
        plan: &str,
        type_: &str,
        reason: &str,
        message: &str,
        phase: &str,
        nodes: &[String],
    ) -> Self {
        Self {
            kind: "DisruptionPlanEvent",
            plan: plan.to_owned(),
            type_: type_.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            phase: phase.to_owned(),
            nodes: nodes.to_vec(),
            time: jiff::Timestamp::now().to_string(),
        }
    }
}

/// True when `webhook` wants a notification with `reason` (no `reasons` listed: every one).
pub fn wanted(webhook: &Endpoint, reason: &str) -> bool {
    webhook.reasons.is_empty() || webhook.reasons.iter().any(|r| r == reason)
}

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error(
        "cannot reach the notification webhook {url}: {source} (check the URL of notifications.webhook in the DisruptionPolicy, or the Secret its urlSecretRef names, and that snapdrain may reach it)"
    )]
    Send {
        /// Scheme and host only ([`redacted`]).
        url: String,
        /// Without its URL (`reqwest::Error::without_url`).
        #[source]
        source: reqwest::Error,
    },
    #[error("the notification webhook {url} answered {status}")]
    Status { url: String, status: u16 },
    #[error("the notification webhook {url} is refused: {why}")]
    Refused { url: String, why: String },
}

impl NotifyError {
    /// 4xx other than 408/429 will not change on a retry, nor will a refused URL.
    fn retryable(&self) -> bool {
        match self {
            Self::Send { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 408 || *status == 429,
            Self::Refused { .. } => false,
        }
    }
}

/// `url` as errors and logs show it: scheme, host and port, and `/…` when it has more.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => {
            let mut shown = format!("{}://{}", u.scheme(), u.host_str().unwrap_or(""));
            if let Some(port) = u.port() {
                shown.push_str(&format!(":{port}"));
            }
            if u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
                shown.push_str("/…");
            }
            shown
        }
        Err(_) => "(not a URL)".into(),
    }
}

/// Loopback, unspecified, link-local, private (RFC 1918, shared CGNAT 100.64/10), broadcast and
/// unique-local IPv6 addresses, and IPv4-mapped forms of them.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_link_local()
                || v4.is_private()
                || v4.is_broadcast()
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

/// What the policy's URL must be, before any request: absolute http(s), https unless allowed, and no
/// private address literal unless allowed. Names are checked when they resolve ([`PublicOnly`]).
pub fn check_url(webhook: &Endpoint) -> Result<url::Url, String> {
    let u = url::Url::parse(&webhook.url).map_err(|e| format!("{e} (an absolute https URL)"))?;
    match u.scheme() {
        "https" => {}
        "http" if webhook.allow_insecure_http => {}
        "http" => {
            return Err("plain http is refused: use https, or set allowInsecureHttp: true".into());
        }
        other => return Err(format!("scheme {other} is not http or https")),
    }
    let literal = match u.host() {
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
        Some(url::Host::Domain(d)) if d.eq_ignore_ascii_case("localhost") => {
            Some(IpAddr::from([127, 0, 0, 1]))
        }
        _ => None,
    };
    if let Some(ip) = literal.filter(|ip| is_private(*ip))
        && !webhook.allow_private_addresses
    {
        return Err(format!(
            "{ip} is a loopback, link-local or private address: set allowPrivateAddresses: true to send there"
        ));
    }
    Ok(u)
}

/// The resolver of the strict client: a name's private addresses are dropped, and a name with only
/// private ones does not resolve.
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = all.into_iter().filter(|a| !is_private(a.ip())).collect();
            if public.is_empty() {
                return Err(format!(
                    "{host} resolves only to loopback, link-local or private addresses (allowPrivateAddresses is off)"
                )
                .into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

/// The two clients: `strict` for webhooks that may not reach private addresses, `open` for those that
/// may. Neither follows redirects (a public URL could otherwise redirect inward, and 307/308 keep the
/// POST body).
struct Clients {
    strict: reqwest::Client,
    open: reqwest::Client,
}

impl Clients {
    fn build(timeout: Duration) -> Result<Self, reqwest::Error> {
        let base = || {
            reqwest::Client::builder()
                .timeout(timeout)
                .redirect(reqwest::redirect::Policy::none())
        };
        Ok(Self {
            strict: base().dns_resolver(Arc::new(PublicOnly)).build()?,
            open: base().build()?,
        })
    }

    fn for_webhook(&self, webhook: &Endpoint) -> &reqwest::Client {
        if webhook.allow_private_addresses {
            &self.open
        } else {
            &self.strict
        }
    }
}

/// How the delivery task sends: the first retry's delay (doubling), one request's timeout, and the first
/// pause once the endpoint is down (doubling up to [`MAX_PAUSE`]).
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    pub first_retry: Duration,
    pub timeout: Duration,
    pub first_pause: Duration,
}

impl Delivery {
    pub fn new(first_retry: Duration) -> Self {
        Self {
            first_retry,
            timeout: Duration::from_secs(10),
            first_pause: Duration::from_secs(15),
        }
    }
}

/// A notification waiting, with its place in the order of sending.
type Queued = (u64, Endpoint, Notification);

/// The notifications waiting, shared by the notifiers and the delivery task.
#[derive(Default)]
struct Queue {
    items: Mutex<VecDeque<Queued>>,
    sent: std::sync::atomic::AtomicU64,
    /// Set when the last notifier is gone: the task ends once the queue is empty.
    closed: std::sync::atomic::AtomicBool,
    wake: Notify,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a notification; when full, drops (and returns) the oldest Normal one, else the oldest
    /// (possibly the one being sent: [`Queue::pop`] then leaves the queue alone).
    fn push(&self, webhook: Endpoint, n: Notification) -> Option<Queued> {
        let seq = self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut items = self.lock();
        let dropped = (items.len() >= QUEUE)
            .then(|| {
                let at = items
                    .iter()
                    .position(|(_, _, n)| n.type_ != "Warning")
                    .unwrap_or(0);
                items.remove(at)
            })
            .flatten();
        items.push_back((seq, webhook, n));
        drop(items);
        self.wake.notify_one();
        dropped
    }

    /// The head of the queue, waiting for one; `None` once closed and empty.
    async fn head(&self) -> Option<Queued> {
        loop {
            let woken = self.wake.notified();
            if let Some(item) = self.lock().front().cloned() {
                return Some(item);
            }
            if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                return None;
            }
            woken.await;
        }
    }

    /// Removes notification `seq` if it is still the head.
    fn pop(&self, seq: u64) {
        let mut items = self.lock();
        if items.front().is_some_and(|(s, _, _)| *s == seq) {
            items.pop_front();
        }
    }
}

/// Closes the queue when the last notifier goes.
struct Sender {
    queue: Arc<Queue>,
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.queue
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.queue.wake.notify_one();
    }
}

/// The sending side, shared by every plan's reconcile. The webhook in force is set by whoever follows the
/// policy ([`Notifier::configure`]); without one, nothing is queued.
#[derive(Clone)]
pub struct Notifier {
    webhook: Arc<RwLock<Option<Endpoint>>>,
    sender: Arc<Sender>,
    metrics: Metrics,
}

impl Notifier {
    /// A notifier and its delivery task (which ends when every notifier is dropped and the queue is
    /// empty).
    pub fn start(metrics: Metrics, first_retry: Duration) -> Self {
        Self::start_with(metrics, Delivery::new(first_retry))
    }

    pub fn start_with(metrics: Metrics, delivery: Delivery) -> Self {
        let queue = Arc::new(Queue::default());
        tokio::spawn(deliver_all(queue.clone(), metrics.clone(), delivery));
        Self {
            webhook: Arc::new(RwLock::new(None)),
            sender: Arc::new(Sender { queue }),
            metrics,
        }
    }

    pub fn configure(&self, webhook: Option<Endpoint>) {
        *self.webhook.write().unwrap_or_else(|e| e.into_inner()) = webhook;
    }

    /// Queues `n` for the webhook in force, if it wants it. Never waits.
    pub fn send(&self, n: Notification) {
        let webhook = self
            .webhook
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(webhook) = webhook.filter(|w| wanted(w, &n.reason)) else {
            return;
        };
        if let Some((_, _, lost)) = self.sender.queue.push(webhook, n) {
            tracing::debug!(plan = %lost.plan, reason = %lost.reason, "notification queue full; the oldest dropped");
            self.metrics.notification("dropped");
        }
    }
}

/// The pause before the next try of an endpoint that is down, after `failures` in a row.
fn pause(delivery: &Delivery, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(BREAKER_AFTER).min(16);
    delivery
        .first_pause
        .saturating_mul(1 << doublings)
        .min(MAX_PAUSE)
}

async fn deliver_all(queue: Arc<Queue>, metrics: Metrics, delivery: Delivery) {
    let clients = match Clients::build(delivery.timeout) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the notification client; notifications are off");
            return;
        }
    };
    // Notifications in a row that were not delivered.
    let mut failures = 0u32;
    // In order, one at a time: a receiver sees a plan's Events as they happened.
    while let Some((seq, webhook, n)) = queue.head().await {
        let down = failures >= BREAKER_AFTER;
        if down {
            tokio::time::sleep(pause(&delivery, failures)).await;
        }
        // An endpoint that is down gets one try per pause, not a round of retries per notification.
        let retries = if down { 0 } else { webhook.retries as usize };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(delivery.first_retry)
            .with_max_delay(MAX_PAUSE)
            .with_max_times(retries);
        let client = clients.for_webhook(&webhook);
        let sent = (|| post(client, &webhook, &n))
            .retry(backoff)
            .when(NotifyError::retryable)
            .notify(|e, wait| {
                tracing::debug!(error = %e, ?wait, "notification not delivered yet; retrying");
            })
            .await;
        match sent {
            Ok(()) => {
                if down {
                    tracing::info!(
                        failures,
                        "the notification webhook answers again; sending the backlog"
                    );
                }
                failures = 0;
                queue.pop(seq);
                metrics.notification("sent");
            }
            Err(e) => {
                // Only a failure that a later try can mend, once the endpoint counts as down, keeps the
                // notification at the head; anything else is given up.
                if e.retryable() {
                    failures = failures.saturating_add(1);
                    if failures == BREAKER_AFTER {
                        tracing::warn!(error = %e, "the notification webhook is down; notifications wait and are tried again, the oldest Normal ones dropped when the queue is full");
                    }
                }
                if !e.retryable() || (!down && failures < BREAKER_AFTER) {
                    tracing::warn!(plan = %n.plan, reason = %n.reason, error = %e, "notification not delivered");
                    queue.pop(seq);
                    metrics.notification("failed");
                }
            }
        }
    }
}

async fn post(
    client: &reqwest::Client,
    webhook: &Endpoint,
    n: &Notification,
) -> Result<(), NotifyError> {
    let shown = redacted(&webhook.url);
    // The policy was validated, but a hand-built notifier (or an older policy) goes through the same
    // check before anything is sent.
    let url = check_url(webhook).map_err(|why| NotifyError::Refused {
        url: shown.clone(),
        why,
    })?;
    let answer = client
        .post(url)
        .json(n)
        .send()
        .await
        .map_err(|source| NotifyError::Send {
            url: shown.clone(),
            source: source.without_url(),
        })?;
    let status = answer.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(NotifyError::Status {
            url: shown,
            status: status.as_u16(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(reasons: &[&str]) -> Endpoint {
        Endpoint {
            url: "https://hooks.example/x".into(),
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            retries: 5,
            allow_insecure_http: false,
            allow_private_addresses: false,
        }
    }

    fn at(url: &str) -> Endpoint {
        Endpoint {
            url: url.into(),
            ..hook(&[])
        }
    }

    #[test]
    fn https_only_and_no_private_literals_unless_allowed() {
        assert!(check_url(&at("https://hooks.slack.com/services/T/B/x")).is_ok());
        let e = check_url(&at("http://hooks.example/x")).expect_err("http");
        assert!(e.contains("allowInsecureHttp"), "{e}");
        for private in [
            "https://169.254.169.254/latest/meta-data/",
            "https://127.0.0.1:8443/x",
            "https://localhost/x",
            "https://10.0.0.5/x",
            "https://[::1]/x",
            "https://[fd00::1]/x",
            "https://[::ffff:192.168.1.1]/x",
            "https://100.64.0.1/x",
        ] {
            let e = check_url(&at(private)).expect_err(private);
            assert!(e.contains("allowPrivateAddresses"), "{private}: {e}");
            let allowed = Endpoint {
                allow_private_addresses: true,
                ..at(private)
            };
            assert!(check_url(&allowed).is_ok(), "{private}");
        }
        assert!(check_url(&at("ftp://x.example/")).is_err());
        assert!(!is_private("8.8.8.8".parse().expect("ip")));
        assert!(!is_private("2606:4700::1111".parse().expect("ip")));
    }

    #[test]
    fn urls_are_shown_without_path_or_query() {
        assert_eq!(
            redacted("https://hooks.slack.com/services/T0/B0/secret?x=1"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(redacted("http://10.0.0.1:8080/"), "http://10.0.0.1:8080");
        let e = NotifyError::Status {
            url: redacted("https://h.example/secret"),
            status: 500,
        };
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    /// A receiver that redirects to a second path, counting the calls there.
    async fn redirecting_receiver() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use axum::routing::post as route_post;
        let followed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = followed.clone();
        let app = axum::Router::new()
            .route(
                "/hook",
                route_post(|| async {
                    (
                        axum::http::StatusCode::TEMPORARY_REDIRECT,
                        [(axum::http::header::LOCATION, "/inside")],
                    )
                }),
            )
            .route(
                "/inside",
                route_post(move || {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async { axum::http::StatusCode::OK }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}/hook"), followed)
    }

    /// A receiver that hangs every request (a blackhole) until `up` is set, then answers 200; it
    /// counts the requests and keeps the messages it answered, in order.
    async fn flaky_receiver() -> (
        String,
        Arc<std::sync::atomic::AtomicBool>,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<Mutex<Vec<Notification2>>>,
    ) {
        use axum::routing::post as route_post;
        use std::sync::atomic::Ordering::SeqCst;
        let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (u, t, g) = (up.clone(), tries.clone(), got.clone());
        let app = axum::Router::new().route(
            "/hook",
            route_post(move |axum::Json(n): axum::Json<Notification2>| {
                let (u, g) = (u.clone(), g.clone());
                t.fetch_add(1, SeqCst);
                async move {
                    if !u.load(SeqCst) {
                        std::future::pending::<()>().await;
                    }
                    g.lock().expect("lock").push(n);
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}/hook"), up, tries, got)
    }

    /// What the receiver reads of a notification.
    #[derive(serde::Deserialize, Clone, Debug)]
    struct Notification2 {
        reason: String,
        message: String,
    }

    /// Review #15: a blackholed endpoint and 600 Events (the last a PlanFailed Warning). Nothing waits
    /// on a dead endpoint a retry round per notification, the Normal ones go first when the queue is
    /// full, and once the endpoint answers again the PlanFailed is delivered, after everything kept,
    /// in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_plan_failed_is_delivered_after_a_blackholed_endpoint_recovers() {
        use std::sync::atomic::Ordering::SeqCst;
        let (url, up, tries, got) = flaky_receiver().await;
        let metrics = Metrics::new();
        let notifier = Notifier::start_with(
            metrics.clone(),
            Delivery {
                first_retry: Duration::from_millis(10),
                timeout: Duration::from_millis(100),
                first_pause: Duration::from_millis(50),
            },
        );
        notifier.configure(Some(Endpoint {
            retries: 1,
            allow_insecure_http: true,
            allow_private_addresses: true,
            ..at(&url)
        }));
        for i in 0..599 {
            notifier.send(Notification::new(
                "p",
                "Normal",
                "Progress",
                &i.to_string(),
                "Draining",
                &[],
            ));
        }
        notifier.send(Notification::new(
            "p",
            "Warning",
            "PlanFailed",
            "599",
            "Failed",
            &[],
        ));
        // Down: BREAKER_AFTER notifications with their retry each, then one try per pause.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let opened = BREAKER_AFTER as usize * 2 + 2;
        while tries.load(SeqCst) < opened {
            assert!(
                tokio::time::Instant::now() < deadline,
                "tries: {}",
                tries.load(SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        up.store(true, SeqCst);
        let delivered = |got: &Mutex<Vec<Notification2>>| {
            got.lock()
                .expect("lock")
                .iter()
                .any(|n| n.reason == "PlanFailed")
        };
        while !delivered(&got) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "PlanFailed not delivered"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The receiver records a notification before its answer reaches the notifier, which counts it
        // `sent` only then: wait for the last one's count before comparing the two.
        let count = |result: &str| {
            let text = metrics.render();
            let key = format!("snapdrain_notifications_total{{result=\"{result}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(key.as_str()))
                .map_or(0, |v| v.trim().parse::<usize>().expect("a count"))
        };
        let counted = || count("sent") + count("failed") + count("dropped");
        while counted() < 600 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "counted {} of 600",
                counted()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let got = got.lock().expect("lock").clone();
        let order: Vec<u32> = got
            .iter()
            .map(|n| n.message.parse().expect("an index"))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "in order: {order:?}");
        assert_eq!(got.last().map(|n| n.reason.as_str()), Some("PlanFailed"));
        // Each of the 600 delivered, given up (before the endpoint counted as down) or dropped (the
        // oldest Normal ones, once the queue was full), and only those.
        let (sent, failed, dropped) = (count("sent"), count("failed"), count("dropped"));
        assert_eq!(sent, got.len());
        assert!(failed < BREAKER_AFTER as usize, "failed {failed}");
        assert!(dropped >= 600 - QUEUE, "dropped {dropped}");
        assert_eq!(
            sent + failed + dropped,
            600,
            "sent {sent}, failed {failed}, dropped {dropped}"
        );
    }

    #[tokio::test]
    async fn redirects_are_not_followed_and_private_addresses_are_refused() {
        let (url, followed) = redirecting_receiver().await;
        let clients = Clients::build(Duration::from_secs(10)).expect("clients");
        let n = Notification::new("p", "Normal", "PlanCompleted", "m", "Completed", &[]);
        // Loopback without allowPrivateAddresses: refused before any request.
        let strict = Endpoint {
            allow_insecure_http: true,
            ..at(&url)
        };
        let e = post(clients.for_webhook(&strict), &strict, &n)
            .await
            .expect_err("refused");
        assert!(matches!(e, NotifyError::Refused { .. }), "{e}");
        assert!(!e.retryable());
        // Allowed: the 307 is the answer, not followed.
        let open = Endpoint {
            allow_private_addresses: true,
            ..strict
        };
        let e = post(clients.for_webhook(&open), &open, &n)
            .await
            .expect_err("a redirect is not a success");
        assert!(matches!(e, NotifyError::Status { status: 307, .. }), "{e}");
        assert!(!e.to_string().contains("/hook"), "{e}");
        assert_eq!(followed.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_name_resolving_only_to_private_addresses_does_not_resolve() {
        use reqwest::dns::Resolve;
        let name: reqwest::dns::Name = "localhost".parse().expect("a name");
        let e = match PublicOnly.resolve(name).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("allowPrivateAddresses is off"), "{e}");
    }

    #[test]
    fn reasons_filter_what_is_sent() {
        assert!(wanted(&hook(&[]), "PlanCompleted"));
        assert!(wanted(
            &hook(&["PlanFailed", "DeadlineMissed"]),
            "DeadlineMissed"
        ));
        assert!(!wanted(&hook(&["PlanFailed"]), "BackingUp"));
    }

    #[test]
    fn only_answers_that_can_change_are_retried() {
        let status = |s| NotifyError::Status {
            url: "u".into(),
            status: s,
        };
        assert!(status(503).retryable());
        assert!(status(429).retryable());
        assert!(!status(404).retryable());
        assert!(!status(400).retryable());
    }

    #[test]
    fn the_payload_names_the_plan_and_what_happened() {
        let n = Notification::new(
            "p1",
            "Warning",
            "PlanFailed",
            "backup failed",
            "Failed",
            &["n1".into()],
        );
        let v = serde_json::to_value(&n).expect("serializes");
        assert_eq!(v["kind"], "DisruptionPlanEvent");
        assert_eq!(v["type"], "Warning");
        assert_eq!(v["nodes"][0], "n1");
        assert!(
            v["time"]
                .as_str()
                .is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok())
        );
    }
}
