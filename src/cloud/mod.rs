//! cloud
