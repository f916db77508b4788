//! The chaos suite: plans of every mode run while faults are injected from outside the controller,
//! judged by the independent oracle. A run is decided by its seed ([`schedule`]), driven against the
//! simulated cluster ([`run`]) and judged from the evidence the simulator kept ([`judge`]).
//!
//! The short form (fixed seeds) runs in `tests/e2e/chaos.rs`; the long form is the ignored test
//! `chaos_long` there, shaped by `SNAPDRAIN_CHAOS_SEEDS` and `SNAPDRAIN_CHAOS_PLANS` (README, "Chaos").

pub mod judge;
pub mod process;
pub mod replicas;
pub mod rng;
pub mod run;
pub mod schedule;

pub use judge::Verdict;
pub use run::{Options, RunReport, run};
