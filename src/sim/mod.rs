//! sim: the simulated cluster used by the demo and the tests.

pub mod apiserver;
