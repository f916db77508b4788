//! S3 standing in for MinIO: s3s + s3s-fs on a real loopback socket.
//!
//! Path-style only, SigV4 auth with the keys given at start (more identities can be granted later, as an
//! IAM policy would), buckets created at start. Optionally the buckets live in an AWS region, and requests
//! signed for another region are redirected the way AWS S3 does.
//! Two test hooks: an outage switch (every request gets S3's 503 `ServiceUnavailable`) and a
//! broadcast of every successful write, which the simulator's audit log records.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aws_credential_types::Credentials;
use hyper_util::rt::{TokioExecutor, TokioIo};
use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result};
use thiserror::Error;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::apiserver::faults::Faults;

/// Errors starting or driving the S3 simulator.
#[derive(Debug, Error)]
pub enum S3SimError {
    #[error("could not prepare the S3 data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bucket name {0:?} is not valid (3-63 lower-case letters, digits, '-' and '.')")]
    BucketName(String),
    #[error("could not bind the S3 simulator to 127.0.0.1: {0}")]
    Bind(std::io::Error),
    #[error("cannot set up TLS for the S3 simulator: {0}")]
    Tls(String),
    #[error("s3s-fs could not open {path}: {message}")]
    Backend { path: PathBuf, message: String },
    #[error("S3 request for s3://{bucket}/{key} failed: {message}")]
    Request {
        bucket: String,
        key: String,
        message: String,
    },
}

/// How to start the S3 simulator.
#[derive(Debug, Clone)]
pub struct S3SimConfig {
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
    pub buckets: Vec<String>,
    /// Where objects live; a fresh temporary directory when `None`.
    pub data_dir: Option<PathBuf>,
    /// The AWS region the buckets live in, when this endpoint stands for AWS S3. Then a request signed
    /// for another region gets S3's 301 `PermanentRedirect` with `x-amz-bucket-region`, and HeadBucket
    /// answers carry that header. None behaves like MinIO: any signing region is accepted.
    pub bucket_region: Option<String>,
    /// Serve HTTPS with this certificate instead of plain HTTP.
    pub tls: Option<S3Tls>,
}

/// A server certificate for the S3 endpoint and the private CA that signed it.
#[derive(Clone, Debug)]
pub struct S3Tls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl S3Tls {
    /// A fresh private CA and a certificate for `127.0.0.1` and `localhost` signed by it, as a MinIO
    /// install with its own CA has.
    pub fn private_ca() -> Result<Self, String> {
        let err = |e: rcgen::Error| format!("cannot make the test CA: {e}");
        let ca_key = rcgen::KeyPair::generate().map_err(err)?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "snapdrain-sim object store CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(err)?;
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
            .map_err(err)?
            .signed_by(&key, &ca)
            .map_err(err)?;
        Ok(Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
        use rustls::pki_types::pem::PemObject as _;
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("certificate PEM: {e}"))?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| format!("key PEM: {e}"))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| e.to_string())?;
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

impl Default for S3SimConfig {
    fn default() -> Self {
        S3SimConfig {
            access_key: "minio".into(),
            secret_key: "minio123".into(),
            region: "us-west-2".into(),
            buckets: vec!["velero".into()],
            data_dir: None,
            bucket_region: None,
            tls: None,
        }
    }
}

/// Which kind of write happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3WriteKind {
    Put,
    Copy,
    CompleteMultipartUpload,
    Delete,
}

/// One successful write to a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Write {
    pub bucket: String,
    pub key: String,
    /// Object size after the write (0 for deletes).
    pub size: u64,
    pub kind: S3WriteKind,
}

/// Handle to a running S3 simulator; clones share it. The server stops when the last handle drops.
#[derive(Clone)]
pub struct S3Sim {
    inner: Arc<Inner>,
}

struct Inner {
    addr: SocketAddr,
    root: PathBuf,
    config: S3SimConfig,
    outage: Arc<AtomicBool>,
    faults: FaultHook,
    writes: broadcast::Sender<S3Write>,
    keys: GrantedKeys,
    server: JoinHandle<()>,
    // Kept so the temporary directory lives as long as the server.
    _tmp: Option<tempfile::TempDir>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl S3Sim {
    /// Creates the buckets, binds 127.0.0.1:0 and starts serving.
    pub async fn start(config: S3SimConfig) -> Result<S3Sim, S3SimError> {
        let (root, tmp) = match &config.data_dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let tmp = tempfile::tempdir().map_err(|source| S3SimError::DataDir {
                    path: std::env::temp_dir(),
                    source,
                })?;
                (tmp.path().to_path_buf(), Some(tmp))
            }
        };
        for bucket in &config.buckets {
            if !valid_bucket_name(bucket) {
                return Err(S3SimError::BucketName(bucket.clone()));
            }
            // s3s-fs treats each top-level directory as a bucket.
            let path = root.join(bucket);
            std::fs::create_dir_all(&path)
                .map_err(|source| S3SimError::DataDir { path, source })?;
        }
        let fs = s3s_fs::FileSystem::new(&root).map_err(|e| S3SimError::Backend {
            path: root.clone(),
            message: format!("{e:?}"),
        })?;
        let (writes, _) = broadcast::channel(1024);
        let observed = ObservedFs {
            fs,
            root: root.clone(),
            writes: writes.clone(),
            long_keys: Default::default(),
            sse_c: Default::default(),
        };
        let mut builder = s3s::service::S3ServiceBuilder::new(observed);
        let keys = GrantedKeys::default();
        keys.grant(&config.access_key, &config.secret_key);
        builder.set_auth(keys.clone());
        let service = builder.build();

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(S3SimError::Bind)?;
        let addr = listener.local_addr().map_err(S3SimError::Bind)?;
        let outage = Arc::new(AtomicBool::new(false));
        let region = RegionCheck {
            region: config.bucket_region.clone(),
            buckets: config.buckets.clone(),
        };
        let acceptor = match &config.tls {
            Some(t) => Some(t.acceptor().map_err(S3SimError::Tls)?),
            None => None,
        };
        let faults = FaultHook::default();
        let server = tokio::spawn(serve(
            listener,
            service,
            Gates {
                outage: outage.clone(),
                faults: faults.clone(),
            },
            Arc::new(region),
            acceptor,
        ));
        Ok(S3Sim {
            inner: Arc::new(Inner {
                addr,
                root,
                config,
                outage,
                faults,
                writes,
                keys,
                server,
                _tmp: tmp,
            }),
        })
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS), for `s3Url` in a BackupStorageLocation or
    /// `AWS_ENDPOINT_URL_S3`.
    pub fn endpoint(&self) -> String {
        let scheme = if self.inner.config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.inner.addr)
    }

    /// The PEM of the private CA that signed the endpoint's certificate, when it serves TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.inner.config.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    pub fn access_key(&self) -> &str {
        &self.inner.config.access_key
    }

    pub fn secret_key(&self) -> &str {
        &self.inner.config.secret_key
    }

    pub fn region(&self) -> &str {
        &self.inner.config.region
    }

    /// The buckets created at start.
    pub fn buckets(&self) -> &[String] {
        &self.inner.config.buckets
    }

    /// The directory holding the buckets.
    pub fn data_dir(&self) -> &Path {
        &self.inner.root
    }

    /// Every successful write from now on.
    pub fn subscribe_writes(&self) -> broadcast::Receiver<S3Write> {
        self.inner.writes.subscribe()
    }

    /// Lets another identity read and write the buckets (an IAM role's keys, as STS would hand them out
    /// to IRSA or EKS Pod Identity). Every other key is refused with `InvalidAccessKeyId`.
    pub fn grant(&self, access_key: &str, secret_key: &str) {
        self.inner.keys.grant(access_key, secret_key);
    }

    /// While on, every request is answered with 503 `ServiceUnavailable`.
    pub fn set_outage(&self, on: bool) {
        self.inner.outage.store(on, Ordering::SeqCst);
    }

    /// Follows the `s3` rules of the simulator's fault rules (`/sim/faults`) from now on.
    pub fn attach_faults(&self, faults: Arc<Faults>) {
        let _ = self.inner.faults.set(faults);
    }

    /// A client for this server: static credentials, path-style addressing.
    pub fn client(&self) -> aws_sdk_s3::Client {
        let client = client_for(
            &self.endpoint(),
            self.region(),
            self.access_key(),
            self.secret_key(),
        );
        match self.ca_pem().map(trusting) {
            Some(Ok(http)) => aws_sdk_s3::Client::from_conf(
                client.config().to_builder().http_client(http).build(),
            ),
            // The CA was parsed when the server started, so it parses again.
            _ => client,
        }
    }

    /// Fault injection: removes an object (through the API, so it is reported as a write).
    pub async fn delete_object(&self, bucket: &str, key: &str) -> Result<(), S3SimError> {
        self.client()
            .delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| request_error(bucket, key, e))?;
        Ok(())
    }

    /// Fault injection: replaces an object's content (e.g. with a truncated or corrupt body).
    pub async fn overwrite_object(
        &self,
        bucket: &str,
        key: &str,
        body: impl Into<Vec<u8>>,
    ) -> Result<(), S3SimError> {
        self.client()
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(body.into().into())
            .send()
            .await
            .map_err(|e| request_error(bucket, key, e))?;
        Ok(())
    }
}

fn request_error<E: std::error::Error + 'static>(bucket: &str, key: &str, e: E) -> S3SimError {
    S3SimError::Request {
        bucket: bucket.into(),
        key: key.into(),
        message: aws_smithy_types::error::display::DisplayErrorContext(e).to_string(),
    }
}

/// An S3 client with static credentials and path-style addressing, for any S3-compatible endpoint.
pub fn client_for(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
) -> aws_sdk_s3::Client {
    let creds = Credentials::new(access_key, secret_key, None, None, "snapdrain-sim");
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new(region.to_string()))
        .endpoint_url(endpoint)
        .credentials_provider(creds)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// An HTTPS client trusting only the CA in `pem`.
pub fn trusting(pem: &str) -> Result<aws_sdk_s3::config::SharedHttpClient, String> {
    use aws_smithy_http_client::tls;
    let context = tls::TlsContext::builder()
        .with_trust_store(tls::TrustStore::empty().with_pem_certificate(pem.as_bytes().to_vec()))
        .build()
        .map_err(|e| e.to_string())?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(context)
        .build_https())
}

fn valid_bucket_name(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.'])
}

/// The fault rules, once the cluster attaches them.
type FaultHook = Arc<std::sync::OnceLock<Arc<Faults>>>;

/// What can make the endpoint fail before a request reaches the store.
#[derive(Clone)]
struct Gates {
    outage: Arc<AtomicBool>,
    faults: FaultHook,
}

async fn serve(
    listener: tokio::net::TcpListener,
    service: s3s::service::S3Service,
    gates: Gates,
    region: Arc<RegionCheck>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "S3 simulator: accept failed");
                continue;
            }
        };
        let service = service.clone();
        let gates = gates.clone();
        let region = region.clone();
        let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let service = service.clone();
            let down = gates.outage.load(Ordering::SeqCst);
            let injected = gates
                .faults
                .get()
                .map(|f| f.s3(operation(&req)))
                .unwrap_or_default();
            let region = region.clone();
            async move {
                if down {
                    return Ok::<_, s3s::HttpError>(outage_response());
                }
                if !injected.delay.is_zero() {
                    tokio::time::sleep(injected.delay).await;
                }
                if let Some((status, code)) = injected.error {
                    return Ok(injected_error(status, &code));
                }
                if let Some(redirect) = region.redirect(&req) {
                    return Ok(redirect);
                }
                let head_bucket = region.head_bucket(&req);
                let mut resp = service.call(req.map(s3s::Body::from)).await?;
                if let Some(value) = head_bucket {
                    resp.headers_mut().insert("x-amz-bucket-region", value);
                }
                Ok(resp)
            }
        });
        let http = http.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let result = match tls {
                None => {
                    http.serve_connection(TokioIo::new(socket), svc)
                        .into_owned()
                        .await
                }
                Some(acceptor) => match acceptor.accept(socket).await {
                    Ok(stream) => {
                        http.serve_connection(TokioIo::new(stream), svc)
                            .into_owned()
                            .await
                    }
                    Err(e) => {
                        // A client that does not trust the CA hangs up here.
                        tracing::debug!(error = %e, "S3 simulator: TLS handshake failed");
                        return;
                    }
                },
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "S3 simulator: connection ended with an error");
            }
        });
    }
}

/// Access keys the endpoint accepts, shared with the running service so identities can be granted later.
#[derive(Clone, Default)]
struct GrantedKeys(Arc<std::sync::RwLock<std::collections::HashMap<String, String>>>);

impl GrantedKeys {
    fn grant(&self, access_key: &str, secret_key: &str) {
        // A poisoned lock only means a panic elsewhere mid-insert; the map is still usable.
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(access_key.to_string(), secret_key.to_string());
    }
}

#[async_trait::async_trait]
impl s3s::auth::S3Auth for GrantedKeys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<s3s::auth::SecretKey> {
        let keys = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match keys.get(access_key) {
            Some(secret) => Ok(secret.clone().into()),
            // AWS S3's answer to an unknown key (403).
            None => Err(s3s::s3_error!(
                InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records."
            )),
        }
    }
}

/// AWS S3's answer to a request made in the wrong region, for buckets that live in one.
struct RegionCheck {
    region: Option<String>,
    buckets: Vec<String>,
}

impl RegionCheck {
    /// The bucket a path-style request addresses, if it is one of ours.
    fn bucket<'a>(&self, path: &'a str) -> Option<&'a str> {
        let first = path.trim_start_matches('/').split('/').next()?;
        self.buckets.iter().any(|b| b == first).then_some(first)
    }

    /// S3 answers a request signed for another region than the bucket's with 301 `PermanentRedirect`
    /// and the bucket's region in `x-amz-bucket-region` (no body for HEAD); aws-sdk-s3 does not follow
    /// it (AWS S3 User Guide "Making requests" / `PermanentRedirect` in the S3 error-code list;
    /// aws-sdk-go-v2 `feature/s3/manager/bucket_region.go` reads the header from this answer).
    fn redirect<B>(&self, req: &http::Request<B>) -> Option<s3s::HttpResponse> {
        let region = self.region.as_deref()?;
        let bucket = self.bucket(req.uri().path())?;
        let signed = signing_region(req)?;
        if signed == region {
            return None;
        }
        let body = if req.method() == http::Method::HEAD {
            String::new()
        } else {
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>PermanentRedirect</Code><Message>The bucket you are attempting to access must be addressed using the specified endpoint. Please send all future requests to this endpoint.</Message><Endpoint>{bucket}.s3.{region}.amazonaws.com</Endpoint><Bucket>{bucket}</Bucket><RequestId>{}</RequestId></Error>",
                uuid::Uuid::new_v4()
            )
        };
        let mut resp = http::Response::new(s3s::Body::from(body));
        *resp.status_mut() = http::StatusCode::MOVED_PERMANENTLY;
        let headers = resp.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/xml"),
        );
        if let Ok(v) = http::HeaderValue::from_str(region) {
            headers.insert("x-amz-bucket-region", v);
        }
        Some(resp)
    }

    /// HeadBucket's `x-amz-bucket-region` header, for a HEAD on one of the buckets.
    fn head_bucket<B>(&self, req: &http::Request<B>) -> Option<http::HeaderValue> {
        let region = self.region.as_deref()?;
        let path = req.uri().path().trim_matches('/');
        if req.method() != http::Method::HEAD || self.bucket(path)? != path {
            return None;
        }
        http::HeaderValue::from_str(region).ok()
    }
}

/// The region in a SigV4 credential scope (`Credential=AK/DATE/REGION/s3/aws4_request`), from the
/// Authorization header or a presigned URL's `X-Amz-Credential`.
fn signing_region<B>(req: &http::Request<B>) -> Option<String> {
    let scope = match req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        Some(auth) => auth
            .split("Credential=")
            .nth(1)?
            .split(',')
            .next()?
            .to_string(),
        None => req
            .uri()
            .query()?
            .split('&')
            .find_map(|kv| kv.strip_prefix("X-Amz-Credential="))?
            .replace("%2F", "/"),
    };
    scope.split('/').nth(2).map(str::to_string)
}

/// The S3 operation a request asks for, by method, path and query (S3 API reference): enough to aim a
/// fault rule at reads, writes or listings.
fn operation<B>(req: &http::Request<B>) -> &'static str {
    let path = req.uri().path().trim_start_matches('/');
    let on_object = path.split_once('/').is_some_and(|(_, key)| !key.is_empty());
    let query = req.uri().query().unwrap_or("");
    let has = |p: &str| {
        query
            .split('&')
            .any(|kv| kv == p || kv.starts_with(&format!("{p}=")))
    };
    let method = req.method();
    match (method.as_str(), on_object) {
        ("GET", true) => "GetObject",
        ("HEAD", true) => "HeadObject",
        ("PUT", true) if has("partNumber") => "UploadPart",
        ("PUT", true) if req.headers().contains_key("x-amz-copy-source") => "CopyObject",
        ("PUT", true) => "PutObject",
        ("DELETE", true) => "DeleteObject",
        ("POST", true) if has("uploads") => "CreateMultipartUpload",
        ("POST", true) => "CompleteMultipartUpload",
        ("GET", false) if path.is_empty() => "ListBuckets",
        ("GET", false) if has("location") => "GetBucketLocation",
        ("GET", false) if has("list-type") => "ListObjectsV2",
        ("GET", false) => "ListObjects",
        ("HEAD", false) => "HeadBucket",
        ("POST", false) if has("delete") => "DeleteObjects",
        _ => "Other",
    }
}

/// S3's error document for an injected fault (S3 API reference, "Error responses": `<Error>` with
/// `Code`, `Message` and `RequestId`).
fn injected_error(status: u16, code: &str) -> s3s::HttpResponse {
    let message = match code {
        "SlowDown" => "Please reduce your request rate.",
        "InternalError" => "We encountered an internal error. Please try again.",
        _ => "Service is unable to handle request.",
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message><RequestId>{}</RequestId></Error>",
        uuid::Uuid::new_v4()
    );
    let mut resp = http::Response::new(s3s::Body::from(body));
    *resp.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/xml"),
    );
    resp
}

fn outage_response() -> s3s::HttpResponse {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>ServiceUnavailable</Code><Message>Simulated outage: the S3 endpoint is down. Please reduce your request rate.</Message><RequestId>{}</RequestId></Error>",
        uuid::Uuid::new_v4()
    );
    let mut resp = http::Response::new(s3s::Body::from(body));
    *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/xml"),
    );
    resp
}

/// s3s-fs with every successful write reported on a channel.
struct ObservedFs {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
    writes: broadcast::Sender<S3Write>,
    /// (bucket, stored key) → the client's key, for keys too long for s3s-fs (see [`ObservedFs::stored`]).
    long_keys: std::sync::Mutex<std::collections::HashMap<(String, String), String>>,
    /// (bucket, key) → base64 MD5 of the SSE-C customer key the object was written with.
    sse_c: std::sync::Mutex<std::collections::HashMap<(String, String), String>>,
}

/// SSE-C as AWS S3 applies it (S3 User Guide, "Using server-side encryption with customer-provided keys
/// (SSE-C)"): a PUT may carry algorithm AES256, the key and its MD5; the object can then be read (GET or
/// HEAD) only with the same key. Without the headers S3 answers 400 `InvalidRequest`, with another key
/// 403 `AccessDenied`.
fn check_customer_key(
    stored: Option<&String>,
    algorithm: Option<&str>,
    key_md5: Option<&str>,
) -> S3Result<()> {
    let Some(stored) = stored else { return Ok(()) };
    match (algorithm, key_md5) {
        (Some(_), Some(md5)) if md5 == stored => Ok(()),
        (Some(_), Some(_)) => Err(s3s::s3_error!(AccessDenied, "Access Denied")),
        _ => Err(s3s::s3_error!(
            InvalidRequest,
            "The object was stored using a form of Server Side Encryption. The correct parameters must be provided to retrieve the object."
        )),
    }
}

/// The MD5 of an SSE-C key as sent, refusing a key whose MD5 does not match (400 `InvalidArgument`).
fn customer_key_md5(
    algorithm: Option<&str>,
    key: Option<&str>,
    key_md5: Option<&str>,
) -> S3Result<Option<String>> {
    let (Some(algorithm), Some(key), Some(key_md5)) = (algorithm, key, key_md5) else {
        return Ok(None);
    };
    if algorithm != "AES256" {
        return Err(s3s::s3_error!(
            InvalidEncryptionAlgorithmError,
            "The encryption request you specified is not valid. The valid value is AES256."
        ));
    }
    use base64::Engine as _;
    use md5::Digest as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let raw = b64.decode(key).unwrap_or_default();
    if raw.len() != 32 || b64.encode(md5::Md5::digest(&raw)) != key_md5 {
        return Err(s3s::s3_error!(
            InvalidArgument,
            "The calculated MD5 hash of the key did not match the hash that was provided."
        ));
    }
    Ok(Some(key_md5.to_string()))
}

impl ObservedFs {
    /// The key s3s-fs stores for a client's key. s3s-fs keeps each object's checksums in a file named after
    /// the base64 of bucket and key, which must fit in a 255-byte file name, so keys far below S3's 1,024
    /// bytes would fail there. Such a key is stored as its directory part (so listings by prefix and
    /// delimiter still find it) plus a hash of the whole key, and mapped back in listings. Keys over
    /// 1,024 bytes get S3's own `KeyTooLongError`.
    fn stored(&self, bucket: &str, key: &str) -> S3Result<String> {
        if key.len() > 1024 {
            return Err(s3s::s3_error!(KeyTooLongError, "Your key is too long"));
        }
        let b64 = |n: usize| n.div_ceil(3) * 4;
        let room =
            255 - ".bucket-".len() - b64(bucket.len()) - ".object-".len() - ".internal.json".len();
        if b64(key.len()) <= room {
            return Ok(key.to_string());
        }
        use sha2::Digest as _;
        let hash: String = sha2::Sha256::digest(key.as_bytes())
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect();
        let tail = format!("~{hash}");
        let max_dir = (room / 4 * 3).saturating_sub(tail.len());
        // The longest directory part (ending in '/') that fits, cut at a character boundary.
        let mut dir = key.rfind('/').map_or("", |i| &key[..=i]);
        while dir.len() > max_dir {
            dir = dir[..dir.len() - 1].rfind('/').map_or("", |i| &dir[..=i]);
        }
        let stored = format!("{dir}{tail}");
        self.long_map()
            .insert((bucket.to_string(), stored.clone()), key.to_string());
        Ok(stored)
    }

    /// The client's key for a stored one.
    fn original(&self, bucket: &str, stored: &str) -> String {
        self.long_map()
            .get(&(bucket.to_string(), stored.to_string()))
            .cloned()
            .unwrap_or_else(|| stored.to_string())
    }

    fn sse_map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), String>> {
        // As for long_map: the map stays usable after a panic elsewhere.
        self.sse_c
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn long_map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), String>> {
        // A poisoned lock only means another request panicked mid-insert; the map is still usable.
        self.long_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn restore_keys(&self, bucket: &str, contents: &mut Option<Vec<s3s::dto::Object>>) {
        if let Some(objects) = contents {
            for o in objects.iter_mut() {
                if let Some(k) = &o.key {
                    o.key = Some(self.original(bucket, k));
                }
            }
            objects.sort_by(|a, b| a.key.cmp(&b.key));
        }
    }

    async fn report(&self, bucket: &str, key: &str, kind: S3WriteKind) {
        let stored = self.stored(bucket, key).unwrap_or_else(|_| key.to_string());
        let size = match kind {
            S3WriteKind::Delete => 0,
            // s3s-fs stores an object as the file <root>/<bucket>/<stored key>.
            _ => tokio::fs::metadata(self.root.join(bucket).join(stored))
                .await
                .map(|m| m.len())
                .unwrap_or(0),
        };
        // No receiver is fine: nobody is auditing.
        let _ = self.writes.send(S3Write {
            bucket: bucket.into(),
            key: key.into(),
            size,
            kind,
        });
    }
}

#[async_trait::async_trait]
impl S3 for ObservedFs {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.fs.create_bucket(req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        if let s3s::dto::CopySource::Bucket { bucket, key, .. } = &mut req.input.copy_source {
            *key = self.stored(bucket, key)?.into();
        }
        let out = self.fs.copy_object(req).await?;
        self.report(&bucket, &key, S3WriteKind::Copy).await;
        Ok(out)
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.fs.delete_bucket(req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        let out = self.fs.delete_object(req).await?;
        self.sse_map().remove(&(bucket.clone(), key.clone()));
        self.report(&bucket, &key, S3WriteKind::Delete).await;
        Ok(out)
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let bucket = req.input.bucket.clone();
        let mut req = req;
        for obj in req.input.delete.objects.iter_mut() {
            obj.key = self.stored(&bucket, &obj.key)?;
        }
        let mut out = self.fs.delete_objects(req).await?;
        for obj in out.output.deleted.iter_mut().flatten() {
            if let Some(key) = &obj.key {
                let key = self.original(&bucket, key);
                self.report(&bucket, &key, S3WriteKind::Delete).await;
                obj.key = Some(key);
            }
        }
        Ok(out)
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.fs.get_bucket_location(req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        check_customer_key(
            self.sse_map()
                .get(&(req.input.bucket.clone(), req.input.key.clone())),
            req.input.sse_customer_algorithm.as_deref(),
            req.input.sse_customer_key_md5.as_deref(),
        )?;
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        self.fs.get_object(req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.fs.head_bucket(req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        check_customer_key(
            self.sse_map()
                .get(&(req.input.bucket.clone(), req.input.key.clone())),
            req.input.sse_customer_algorithm.as_deref(),
            req.input.sse_customer_key_md5.as_deref(),
        )?;
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        self.fs.head_object(req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.fs.list_buckets(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let bucket = req.input.bucket.clone();
        let mut out = self.fs.list_objects(req).await?;
        self.restore_keys(&bucket, &mut out.output.contents);
        Ok(out)
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let bucket = req.input.bucket.clone();
        let mut out = self.fs.list_objects_v2(req).await?;
        self.restore_keys(&bucket, &mut out.output.contents);
        Ok(out)
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let sse = customer_key_md5(
            req.input.sse_customer_algorithm.as_deref(),
            req.input.sse_customer_key.as_deref(),
            req.input.sse_customer_key_md5.as_deref(),
        )?;
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        let out = self.fs.put_object(req).await?;
        match sse {
            Some(md5) => self.sse_map().insert((bucket.clone(), key.clone()), md5),
            None => self.sse_map().remove(&(bucket.clone(), key.clone())),
        };
        self.report(&bucket, &key, S3WriteKind::Put).await;
        Ok(out)
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        self.fs.create_multipart_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        self.fs.upload_part(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        if let s3s::dto::CopySource::Bucket { bucket, key, .. } = &mut req.input.copy_source {
            *key = self.stored(bucket, key)?.into();
        }
        self.fs.upload_part_copy(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        self.fs.list_parts(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        let out = self.fs.complete_multipart_upload(req).await?;
        self.report(&bucket, &key, S3WriteKind::CompleteMultipartUpload)
            .await;
        Ok(out)
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        self.fs.abort_multipart_upload(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(method: &str, uri: &str) -> &'static str {
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .expect("a request");
        operation(&req)
    }

    #[test]
    fn operations_are_told_apart_by_method_path_and_query() {
        assert_eq!(op("GET", "/velero/backups/b/b.tar.gz"), "GetObject");
        assert_eq!(op("HEAD", "/velero/backups/b/b.tar.gz"), "HeadObject");
        assert_eq!(op("PUT", "/velero/k"), "PutObject");
        assert_eq!(op("PUT", "/velero/k?partNumber=2&uploadId=x"), "UploadPart");
        assert_eq!(op("POST", "/velero/k?uploads"), "CreateMultipartUpload");
        assert_eq!(
            op("POST", "/velero/k?uploadId=x"),
            "CompleteMultipartUpload"
        );
        assert_eq!(op("DELETE", "/velero/k"), "DeleteObject");
        assert_eq!(
            op("GET", "/velero?list-type=2&prefix=backups/"),
            "ListObjectsV2"
        );
        assert_eq!(op("GET", "/velero/?location"), "GetBucketLocation");
        assert_eq!(op("HEAD", "/velero"), "HeadBucket");
        assert_eq!(op("GET", "/"), "ListBuckets");
        let copy = http::Request::builder()
            .method("PUT")
            .uri("/velero/k2")
            .header("x-amz-copy-source", "/velero/k")
            .body(())
            .expect("a request");
        assert_eq!(operation(&copy), "CopyObject");
    }
}
