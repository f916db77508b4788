//! The eviction gate: a validating admission webhook on `pods/eviction` CREATE that answers 429 for a
//! protected pod until a verified backup covers its PVCs, so `kubectl drain`, Karpenter and Cluster
//! Autoscaler wait and retry (DESIGN.md "How snapdrain gates other drainers"). The first refused
//! eviction for a node starts a Release plan for it (source `eviction-gate`).
//!
//! - [`decision`]: pure: allow or hold, and the message a person reads.
//! - [`review`]: the AdmissionReview read and answered.
//! - [`gate`]: one request over the caches (the pod, the plans), handing plan starts to [`starter`].
//! - [`confirm`]: pure: whether Velero's Backup confirms a plan's verified backup.
//! - [`starter`]: plan creation off the request path, one node at a time.
//! - [`certs`]: pure: the CA and serving certificate, and when to renew them.
//! - [`keeper`]: the certificates' Secret and the configuration's caBundle.
//! - [`server`]: HTTPS with certificates swapped per handshake.
//! - [`limits`]: the server's caps and timeouts.
//!
//! Every replica serves the gate (not only the Lease holder): decisions read caches only, and plan
//! creation is safe from any replica (deterministic names, 409 joins).

pub mod certs;
pub mod confirm;
pub mod decision;
pub mod error;
pub mod gate;
pub mod keeper;
pub mod limits;
pub mod review;
pub mod server;
pub mod starter;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use futures::StreamExt;
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::{WatchStreamExt, reflector};

pub use certs::Lifetimes;
pub use error::{CertError, ReviewError};
pub use gate::{Gate, Protects, Sources};

use tokio::sync::watch;

use crate::api::DisruptionPlan;
use crate::api::lenient;
use crate::api::policy::DisruptionPolicySpec;
use crate::planning::protection;
use crate::telemetry::Metrics;

/// How the gate is served.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Where HTTPS listens (port 0: any free port, see [`WebhookHandle::addr`]).
    pub addr: SocketAddr,
    /// The controller's namespace: the Secret and the Service live there.
    pub namespace: String,
    /// The Secret holding the CA and serving certificate.
    pub secret: String,
    /// The Service in front of the replicas (the certificate's DNS names).
    pub service: String,
    /// The ValidatingWebhookConfiguration whose caBundle snapdrain keeps.
    pub configuration: String,
    pub lifetimes: Lifetimes,
    /// How often the Secret is read again for another replica's renewal.
    pub resync: Duration,
    /// Reviews answered at once before the gate answers 503 ([`limits::IN_FLIGHT`]; tests lower it to
    /// see the refusal, which a review answered in microseconds cannot reach otherwise).
    pub in_flight: usize,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([0, 0, 0, 0], 8443)),
            namespace: "snapdrain".into(),
            secret: "snapdrain-webhook-tls".into(),
            service: "snapdrain-webhook".into(),
            configuration: "snapdrain".into(),
            lifetimes: Lifetimes::default(),
            resync: Duration::from_secs(60),
            in_flight: limits::IN_FLIGHT,
        }
    }
}

/// A running gate. Dropping it does not stop it; [`WebhookHandle::stop`] does.
pub struct WebhookHandle {
    pub addr: SocketAddr,
    slot: Arc<server::CertSlot>,
    server: axum_server::Handle<SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl WebhookHandle {
    /// The certificate (PEM) new connections get now.
    pub fn serving(&self) -> Option<String> {
        self.slot.serving()
    }

    /// Stops listening (requests in flight get `grace` to finish) and stops the cache and the keeper.
    pub fn stop(&self, grace: Duration) {
        server::stop(&self.server, grace);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the gate: plan cache, certificates (issued or read before the first request), HTTPS.
pub async fn start(
    client: Client,
    metrics: Metrics,
    recorder: Recorder,
    caches: crate::controller::cache::Caches,
    config: WebhookConfig,
) -> Result<WebhookHandle, CertError> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let (plans, writer) = reflector::store::<DisruptionPlan>();
    let plan_client = client.clone();
    let cache = tokio::spawn(async move {
        // One plan that cannot be decoded must not keep the cache from syncing (security review H-1);
        // the leader reports it, the gate leaves it out.
        let plans = lenient::watch_decoded(
            plan_client,
            crate::controller::undecodable::stub,
            |u| tracing::debug!(plan = ?u.metadata.name, error = %u.error, "eviction gate: undecodable plan left out"),
        );
        reflector(
            writer,
            plans.modify(crate::controller::cache::trim::plan_for_gate),
        )
        .for_each(|ev| async move {
            if let Err(e) = ev {
                tracing::debug!(error = %e, "eviction gate: plan watch");
            }
        })
        .await;
    });
    let slot = Arc::new(server::CertSlot::default());
    let keeper = keeper::Keeper::new(
        client.clone(),
        keeper::KeeperConfig {
            namespace: config.namespace.clone(),
            secret: config.secret.clone(),
            service: config.service.clone(),
            configuration: config.configuration.clone(),
            lifetimes: config.lifetimes,
            resync: config.resync,
        },
        slot.clone(),
        metrics.clone(),
    );
    // The first certificates before the first request. A transient API error (a 5xx from a busy
    // or restarting API server) is retried for about half a minute rather than stopping the replica: the chaos
    // suite saw a restarted replica fail to start on one injected 500 reading the Secret.
    (|| keeper.sync())
        .retry(crate::api_errors::startup_backoff())
        .when(CertError::is_transient)
        .notify(|e, wait| {
            tracing::warn!(error = %e, ?wait, "eviction gate: cannot load its certificates yet; retrying");
        })
        .await?;
    let keeping = tokio::spawn(keeper.run());
    // The policy decides what is protected and the spec of plans the gate starts. Until it is read,
    // and for a namespace not in the cache yet, the gate protects more, never less.
    let (policy_tx, policy) = watch::channel(DisruptionPolicySpec::defaults());
    let following = tokio::spawn(crate::controller::policy::follow(
        client.clone(),
        None,
        policy_tx,
        std::future::pending(),
    ));
    let namespaces = caches.namespaces.clone();
    let protects: Protects = {
        let policy = policy.clone();
        Arc::new(move |p| {
            let spec = policy.borrow().protection.clone();
            protection::protects_or_more(&spec, p, namespaces.labels_of(p).as_ref())
        })
    };
    let (starter, starting) =
        starter::Starter::spawn(client, plans.clone(), caches.nodes.clone(), policy.clone());
    let gate = Arc::new(Gate::new(
        Sources {
            plans,
            pods: caches.pods.clone(),
            nodes: caches.nodes.clone(),
            claims: caches.node_claims.clone(),
            backups: caches.backups.clone(),
        },
        starter,
        protects,
        policy,
        metrics,
        recorder,
    ));
    let (addr, server) = server::serve(config.addr, slot.clone(), gate, config.in_flight)?;
    tracing::info!(%addr, "eviction gate serving");
    Ok(WebhookHandle {
        addr,
        slot,
        server,
        tasks: vec![cache, keeping, following, starting],
    })
}
