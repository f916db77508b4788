//! Notifications: every plan Event, also POSTed as JSON to the DisruptionPolicy's
//! `notifications.webhook.url` (Kubernetes Events are always written; this is for a chat or paging
//! system). Delivery is best effort and never slows a plan: Events are queued and sent by one task, each
//! retried with exponential backoff (1 s doubling, at most 5 min apart) up to `retries` times; a full
//! queue drops the newest and counts it.
//!
//! Whoever edits the policy chooses where snapdrain sends requests from inside the cluster, so: https
//! only unless `allowInsecureHttp`; no loopback, link-local, private or unique-local address unless
//! `allowPrivateAddresses`, checked on the literal host and on every address a name resolves to (at
//! connect time, by the client's resolver, so a name cannot change between check and use); redirects
//! are not followed; and errors and logs show the URL's scheme and host only (its path or query is
//! often the secret of a chat webhook).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use serde::Serialize;
use tokio::sync::mpsc;

use super::Metrics;
use crate::api::policy::WebhookNotification;

/// How many notifications wait for delivery before new ones are dropped.
const QUEUE: usize = 512;

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
pub fn wanted(webhook: &WebhookNotification, reason: &str) -> bool {
    webhook.reasons.is_empty() || webhook.reasons.iter().any(|r| r == reason)
}

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error(
        "cannot reach the notification webhook {url}: {source} (check notifications.webhook.url in the DisruptionPolicy and that snapdrain may reach it)"
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
pub fn check_url(webhook: &WebhookNotification) -> Result<url::Url, String> {
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
    fn build() -> Result<Self, reqwest::Error> {
        let base = || {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
        };
        Ok(Self {
            strict: base().dns_resolver(Arc::new(PublicOnly)).build()?,
            open: base().build()?,
        })
    }

    fn for_webhook(&self, webhook: &WebhookNotification) -> &reqwest::Client {
        if webhook.allow_private_addresses {
            &self.open
        } else {
            &self.strict
        }
    }
}

/// The sending side, shared by every plan's reconcile. The webhook in force is set by whoever follows the
/// policy ([`Notifier::configure`]); without one, nothing is queued.
#[derive(Clone)]
pub struct Notifier {
    webhook: Arc<RwLock<Option<WebhookNotification>>>,
    tx: mpsc::Sender<(WebhookNotification, Notification)>,
    metrics: Metrics,
}

impl Notifier {
    /// A notifier and its delivery task (which ends when every notifier is dropped).
    pub fn start(metrics: Metrics, first_retry: Duration) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(deliver_all(rx, metrics.clone(), first_retry));
        Self {
            webhook: Arc::new(RwLock::new(None)),
            tx,
            metrics,
        }
    }

    pub fn configure(&self, webhook: Option<WebhookNotification>) {
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
        if self.tx.try_send((webhook, n)).is_err() {
            self.metrics.notification("dropped");
        }
    }
}

async fn deliver_all(
    mut rx: mpsc::Receiver<(WebhookNotification, Notification)>,
    metrics: Metrics,
    first_retry: Duration,
) {
    let clients = match Clients::build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the notification client; notifications are off");
            return;
        }
    };
    // In order, one at a time: a receiver sees a plan's Events as they happened.
    while let Some((webhook, n)) = rx.recv().await {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(first_retry)
            .with_max_delay(Duration::from_secs(300))
            .with_max_times(webhook.retries as usize);
        let client = clients.for_webhook(&webhook);
        let sent = (|| post(client, &webhook, &n))
            .retry(backoff)
            .when(NotifyError::retryable)
            .notify(|e, wait| {
                tracing::debug!(error = %e, ?wait, "notification not delivered yet; retrying");
            })
            .await;
        match sent {
            Ok(()) => metrics.notification("sent"),
            Err(e) => {
                tracing::warn!(plan = %n.plan, reason = %n.reason, error = %e, "notification not delivered");
                metrics.notification("failed");
            }
        }
    }
}

async fn post(
    client: &reqwest::Client,
    webhook: &WebhookNotification,
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

    fn hook(reasons: &[&str]) -> WebhookNotification {
        WebhookNotification {
            url: "https://hooks.example/x".into(),
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            retries: 5,
            allow_insecure_http: false,
            allow_private_addresses: false,
        }
    }

    fn at(url: &str) -> WebhookNotification {
        WebhookNotification {
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
            let allowed = WebhookNotification {
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

    #[tokio::test]
    async fn redirects_are_not_followed_and_private_addresses_are_refused() {
        let (url, followed) = redirecting_receiver().await;
        let clients = Clients::build().expect("clients");
        let n = Notification::new("p", "Normal", "PlanCompleted", "m", "Completed", &[]);
        // Loopback without allowPrivateAddresses: refused before any request.
        let strict = WebhookNotification {
            allow_insecure_http: true,
            ..at(&url)
        };
        let e = post(clients.for_webhook(&strict), &strict, &n)
            .await
            .expect_err("refused");
        assert!(matches!(e, NotifyError::Refused { .. }), "{e}");
        assert!(!e.retryable());
        // Allowed: the 307 is the answer, not followed.
        let open = WebhookNotification {
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
