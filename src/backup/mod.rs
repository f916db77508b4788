//! Velero Backups and their verification in object storage.
//!
//! - [`location`]: BackupStorageLocation + credentials Secret → S3 target and object keys (pure).
//! - [`verify`]: checks of the objects fetched from the bucket (pure).

pub mod location;
pub mod verify;
