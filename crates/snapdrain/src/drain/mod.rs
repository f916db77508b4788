//! Cordon, eviction and waiting for pods and volumes to leave a node. The decisions (which pods, in which
//! order, what an answer means) live in [`crate::planning`]; this module does the I/O.

pub mod cordon;
pub mod error;
pub mod evict;
pub mod wait;

pub use error::DrainError;
