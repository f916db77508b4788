//! Cloud provider edges: EC2 termination and launch, Bottlerocket user data.

pub mod bottlerocket;
pub mod ec2;
