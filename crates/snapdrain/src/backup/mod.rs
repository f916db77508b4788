//! Velero Backups and their verification in object storage.
//!
//! - [`location`]: BackupStorageLocation + credentials Secret → S3 target and object keys (pure).
//! - [`verify`]: checks of the objects fetched from the bucket (pure).
//! - [`bucket`]: fetching those objects with aws-sdk-s3.
//! - [`velero`]: Velero Backups, BackupStorageLocations and their credentials through the Kubernetes API.

pub mod bucket;
pub mod location;
pub mod velero;
pub mod verify;
