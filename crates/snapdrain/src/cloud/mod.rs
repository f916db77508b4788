//! Cloud provider edges: EC2 termination and launch, Bottlerocket user data.

pub mod bottlerocket;
pub mod ebs;
pub mod ec2;
