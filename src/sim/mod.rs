//! The simulated cluster used by the demo and the tests.

pub mod ec2;
pub mod s3;
