//! Velero Backups and their verification in object storage.
//!
//! - [`credentials`]: which Secret holds the credentials Velero uses (pure).
//! - [`credentials_file`]: the static keys of a profile in that Secret's AWS credentials file (pure).
//! - [`gobool`]: Go's `strconv.ParseBool`, as the AWS plugin reads BSL flags (pure).
//! - [`sse`]: the SSE-C customer key of a location (pure).
//! - [`location`]: BackupStorageLocation + credentials Secret → S3 target and object keys (pure).
//! - [`verify`]: checks of the objects fetched from the bucket (pure).
//! - [`bucket`]: fetching those objects with aws-sdk-s3.
//! - [`insecure_tls`]: the HTTPS client for a location with `insecureSkipTLSVerify`.
//! - [`velero`]: Velero Backups, BackupStorageLocations and their credentials through the Kubernetes API.

pub mod bucket;
pub mod credentials;
pub mod credentials_file;
pub mod gobool;
pub mod insecure_tls;
pub mod location;
pub mod sse;
pub mod velero;
pub mod verify;
