//! The simulated Kubernetes API server: HTTPS on loopback with a CA of its own ([`tls`]), speaking the
//! Kubernetes REST API closely enough that kubectl and kube-rs (Api, watcher, reflector, Controller)
//! work against it unchanged, with every client's credentials checked ([`auth`]).
//!
//! Layout: `resources` (what is served, discovery), `store` (objects, versions, watches), `handlers`
//! (REST verbs) and `response` (what they return), `watch`, `table` (server-side printing), `patch` +
//! `patching`, `selectors` + `filter`, `eviction` (PDB-checked evictions) and `pdb` (PDB status),
//! `admission` (validating webhooks), `faults` and `audit` (the `/sim/` control surface), `control` (its
//! routes), `tls` (the CA and serving certificate), `auth` (who a request is from, what RBAC allows) and
//! `kubeconfig` (how clients are configured to reach the server).

pub mod admission;
pub mod audit;
pub mod auth;
pub mod cel;
mod control;
pub mod errors;
pub mod eviction;
pub mod faults;
pub mod filter;
pub mod handlers;
mod kubeconfig;
pub mod label_selector;
pub mod meta;
pub mod objects;
pub mod openapi;
pub mod patch;
mod patching;
pub mod pdb;
pub mod protobuf;
pub mod request;
pub mod resources;
pub mod response;
pub mod schema;
pub mod selectors;
pub mod store;
pub mod strict;
pub mod table;
pub mod tls;
pub mod validation;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};

use self::audit::Audit;
use self::errors::ApiError;
use self::faults::Faults;
pub use self::kubeconfig::{KubeconfigUser, admin_config, kubeconfig};
use self::request::{Query, Target};
use self::response::json_response;
use self::store::Store;

/// Tunables of the server itself.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// How the eviction subresource answers for a pod covered by several PodDisruptionBudgets.
    pub multi_pdb_reply: MultiPdbReply,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            bookmark_interval: Duration::from_secs(5),
            multi_pdb_reply: MultiPdbReply::default(),
        }
    }
}

/// The two answers kube-apiserver versions give to an eviction of a pod covered by several PDBs. Both
/// refuse; clients must read both as a refusal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MultiPdbReply {
    /// HTTP 500 InternalError: `guardPDB` in kubernetes `pkg/registry/core/pod/storage/eviction.go`
    /// returns `apierrors.NewInternalError(...)` (current servers).
    #[default]
    InternalError,
    /// HTTP 201 with a `Failure` Status body of code 500: older `eviction.go` returns
    /// `&metav1.Status{Status: Failure, Code: 500, ...}, nil` as the REST result, and
    /// `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go` writes a returned object with
    /// `http.StatusCreated` (the body's code is only filled in when it is 0).
    CreatedWithFailureBody,
}

/// Everything a request handler can reach.
pub struct ApiState {
    pub store: Store,
    pub faults: Arc<Faults>,
    pub audit: Arc<Audit>,
    pub settings: Settings,
    /// `https://127.0.0.1:<port>`, once bound.
    pub address: String,
    pub admission: admission::Admission,
    pub auth: auth::Auth,
}

/// Why the API server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// The most concurrent HTTP/2 streams one connection may open: kube-apiserver's default
/// (`staging/src/k8s.io/apiserver/pkg/server/secure_serving.go` `Serve`, `maxConcurrentStreams = 100`).
const MAX_CONCURRENT_STREAMS: u32 = 100;

/// A running API server.
pub struct ApiServer {
    pub state: Arc<ApiState>,
    pub addr: SocketAddr,
    /// The CA clients trust and the serving certificate it signed.
    pub pki: tls::ServingPki,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: axum_server::Handle<SocketAddr>,
}

impl ApiServer {
    /// Binds `addr` (use port 0 for any free port) and serves HTTPS until dropped or `shutdown` is
    /// called.
    pub async fn start(
        addr: SocketAddr,
        store: Store,
        audit: Arc<Audit>,
        faults: Arc<Faults>,
        settings: Settings,
    ) -> Result<Self, StartError> {
        let pki = tls::ServingPki::generate(addr.ip())?;
        let tls_config = axum_server::tls_rustls::RustlsConfig::from_config(pki.server_config()?);
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ApiState {
            store,
            faults,
            audit,
            settings,
            address: https_url(addr),
            admission: admission::Admission::default(),
            auth: auth::Auth::default(),
        });
        let app = router(state.clone());
        let (tx, rx) = tokio::sync::watch::channel(false);
        pdb::start(state.store.clone(), rx);
        // Go's net package turns Nagle's algorithm off on every TCP connection (TCPConn.SetNoDelay: "the
        // default is true (no delay)"), kube-apiserver's included: replies leave at once.
        let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(tls_config)
            .acceptor(axum_server::accept::NoDelayAcceptor::new());
        let mut server = axum_server::from_tcp(listener)?.acceptor(acceptor);
        server
            .http_builder()
            .http2()
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
        let handle = axum_server::Handle::new();
        let server = server.handle(handle.clone());
        tokio::spawn(async move {
            if let Err(e) = server.serve(app.into_make_service()).await {
                tracing::error!(error = %e, "simulated API server stopped");
            }
        });
        Ok(Self {
            state,
            addr,
            pki,
            shutdown: tx,
            server: handle,
        })
    }

    pub fn url(&self) -> String {
        https_url(self.addr)
    }

    /// A kube-rs configuration for this server as its admin (the kubeconfig's user), trusting its CA.
    pub fn admin_config(&self) -> Result<kube::Config, String> {
        admin_config(&self.url(), &self.pki.ca_pem)
    }

    /// A kubeconfig for this server trusting its CA, as its admin.
    pub fn kubeconfig(&self) -> String {
        kubeconfig(
            &self.url(),
            &self.pki.ca_pem,
            KubeconfigUser::Token(auth::ADMIN_TOKEN),
        )
    }

    /// Stops accepting connections and lets requests in flight finish.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        self.server.graceful_shutdown(None);
    }
}

/// `https://<addr>`; an unspecified listening address (`0.0.0.0`, `::`) is reached through loopback,
/// which the serving certificate names.
fn https_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("https://{}", SocketAddr::new(ip, addr.port()))
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub fn router(state: Arc<ApiState>) -> Router {
    Router::new().fallback(entry).with_state(state)
}

/// The object as the requested version presents it (CRD versions share one schema here: no conversion).
pub fn present(obj: &Value, target: &Target) -> Value {
    let mut v = obj.clone();
    if target.version != target.def.storage_version() {
        v["apiVersion"] = json!(target.api_version());
    }
    v
}

fn version_info() -> Value {
    json!({"major": "1", "minor": "35", "gitVersion": "v1.35.0-snapdrain-sim", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25.0", "compiler": "gc", "platform": "linux/amd64"})
}

fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.to_status(),
    );
    if let Some(secs) = e.retry_after_seconds
        && let Ok(v) = secs.to_string().parse()
    {
        r.headers_mut().insert("retry-after", v);
    }
    r
}

async fn entry(
    State(state): State<Arc<ApiState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query = Query::parse(uri.query());
    // The simulator's own control surface, not part of the Kubernetes API.
    if path.starts_with("/sim/") {
        return control::handle(&state, &method, &path, &query, &body).await;
    }
    let user = match state.auth.authenticate(&headers) {
        Ok(u) => u,
        Err(e) => return error_response(&e),
    };
    if method == Method::GET && !is_resource_path(&path) {
        let attrs = auth::rbac::Attributes::NonResource {
            verb: "get".into(),
            path: path.clone(),
        };
        if let Err(e) = state.auth.authorize(&state.store, &user, &attrs) {
            return error_response(&e);
        }
    }
    if let Some(r) = discovery(&state, &method, &path) {
        return r;
    }
    let target = match request::parse_path(&state.store, &path) {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    let verb = handlers::verb(&method, &target, &query);
    let attrs = auth::rbac::Attributes::Resource {
        verb: verb.to_string(),
        group: target.def.group.clone(),
        resource: target.def.plural.clone(),
        subresource: target.subresource.clone(),
        namespace: target.namespace.clone(),
        name: target.name.clone(),
    };
    if let Err(e) = state.auth.authorize(&state.store, &user, &attrs) {
        handlers::audit(
            &state,
            verb,
            &target,
            headers.get("user-agent").and_then(|v| v.to_str().ok()),
            e.code,
        );
        return error_response(&e);
    }
    let user_agent = headers
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let injection = state.faults.check_request(
        verb,
        &target.resource_name(),
        &body,
        query.get("fieldManager"),
    );
    if !injection.delay.is_zero() {
        tokio::time::sleep(injection.delay).await;
    }
    if let Some(err) = injection.error {
        handlers::audit(&state, verb, &target, user_agent.as_deref(), err.code);
        return error_response(&err);
    }
    let req = handlers::Request {
        user,
        method,
        target: target.clone(),
        query,
        headers,
        body,
    };
    let response = match handlers::dispatch(state.clone(), req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    handlers::audit(
        &state,
        verb,
        &target,
        user_agent.as_deref(),
        response.status().as_u16(),
    );
    response
}

/// `/api/v1/...` and `/apis/<group>/<version>/<resource>...`: a resource request for RBAC; the
/// discovery documents above them (`/api`, `/api/v1`, `/apis/<group>/<version>`) are not.
fn is_resource_path(path: &str) -> bool {
    let n = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .count();
    (path.starts_with("/api/") && n >= 3) || (path.starts_with("/apis/") && n >= 4)
}

fn discovery(state: &ApiState, method: &Method, path: &str) -> Option<Response> {
    if method != Method::GET {
        return None;
    }
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let ok = |v: Value| Some(json_response(StatusCode::OK, &v));
    // Only discovery documents need the registry: cloning it for every request showed in profiles.
    let registry = || state.store.registry();
    match segments.as_slice() {
        ["version"] => ok(version_info()),
        ["healthz"] | ["readyz"] | ["livez"] => Some(
            Response::builder()
                .status(200)
                .header("content-type", "text/plain")
                .body(axum::body::Body::from("ok"))
                .unwrap_or_else(|_| Response::new(axum::body::Body::empty())),
        ),
        ["api"] => ok(registry().core_versions(state.address.trim_start_matches("https://"))),
        ["apis"] => ok(registry().group_list()),
        ["api", version] => Some(match registry().resource_list("", version) {
            Some(v) => json_response(StatusCode::OK, &v),
            None => error_response(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )),
        }),
        ["apis", group] => Some(match registry().group(group) {
            Some(v) => json_response(StatusCode::OK, &v),
            None => error_response(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )),
        }),
        ["apis", group, version] => Some(match registry().resource_list(group, version) {
            Some(v) => json_response(StatusCode::OK, &v),
            None => error_response(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )),
        }),
        ["openapi", "v3"] => ok(openapi::index(&state.store)),
        // The protobuf v2 document is not served: kubectl uses v3 when it finds it.
        ["openapi", "v3", gv @ ..] => {
            Some(match openapi::group_version_document(&state.store, gv) {
                Some(v) => json_response(StatusCode::OK, &v),
                None => error_response(&ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )),
            })
        }
        ["openapi", ..] => Some(error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ))),
        _ => None,
    }
}
