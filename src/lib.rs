//! The `snapdrain` command. The product (controller, planning, backup, drain, cloud) is the `snapdrain`
//! crate; this crate is its command line, and with the default `sim` feature also:
//! - [`demo`]: `snapdrain demo`: the simulated cluster and the controller in one process, narrated.
//! - [`bench`]: measurements behind `snapdrain bench`.

pub mod cli;

#[cfg(feature = "sim")]
pub mod bench;
#[cfg(feature = "sim")]
pub mod demo;
