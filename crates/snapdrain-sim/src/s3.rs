//! S3 standing in for MinIO: s3s + s3s-fs on a real loopback socket.
//!
//! Path-style only, SigV4 auth with the keys given at start, buckets created at start.
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
}

impl Default for S3SimConfig {
    fn default() -> Self {
        S3SimConfig {
            access_key: "minio".into(),
            secret_key: "minio123".into(),
            region: "us-west-2".into(),
            buckets: vec!["velero".into()],
            data_dir: None,
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
    writes: broadcast::Sender<S3Write>,
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
        };
        let mut builder = s3s::service::S3ServiceBuilder::new(observed);
        builder.set_auth(s3s::auth::SimpleAuth::from_single(
            config.access_key.clone(),
            config.secret_key.clone(),
        ));
        let service = builder.build();

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(S3SimError::Bind)?;
        let addr = listener.local_addr().map_err(S3SimError::Bind)?;
        let outage = Arc::new(AtomicBool::new(false));
        let server = tokio::spawn(serve(listener, service, outage.clone()));
        Ok(S3Sim {
            inner: Arc::new(Inner {
                addr,
                root,
                config,
                outage,
                writes,
                server,
                _tmp: tmp,
            }),
        })
    }

    /// `http://127.0.0.1:PORT`, for `s3Url` in a BackupStorageLocation or `AWS_ENDPOINT_URL_S3`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.inner.addr)
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

    /// While on, every request is answered with 503 `ServiceUnavailable`.
    pub fn set_outage(&self, on: bool) {
        self.inner.outage.store(on, Ordering::SeqCst);
    }

    /// A client for this server: static credentials, path-style addressing.
    pub fn client(&self) -> aws_sdk_s3::Client {
        client_for(
            &self.endpoint(),
            self.region(),
            self.access_key(),
            self.secret_key(),
        )
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

fn valid_bucket_name(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.'])
}

async fn serve(
    listener: tokio::net::TcpListener,
    service: s3s::service::S3Service,
    outage: Arc<AtomicBool>,
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
        let outage = outage.clone();
        let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let service = service.clone();
            let down = outage.load(Ordering::SeqCst);
            async move {
                if down {
                    return Ok(outage_response());
                }
                service.call(req.map(s3s::Body::from)).await
            }
        });
        let conn = http
            .serve_connection(TokioIo::new(socket), svc)
            .into_owned();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "S3 simulator: connection ended with an error");
            }
        });
    }
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
        let mut req = req;
        req.input.key = self.stored(&req.input.bucket, &req.input.key)?;
        let out = self.fs.put_object(req).await?;
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
