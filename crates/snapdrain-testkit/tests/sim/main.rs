//! The simulated cluster through real clients: kube-rs, kubectl, the AWS SDK. One test binary, one module
//! per part of the simulator.

mod admission;
mod drainers;
mod ec2;
mod ec2_architecture;
mod ec2_launch_templates;
mod ec2_snapshots;
mod eviction;
mod karpenter;
mod kube_client;
mod kubectl;
mod kubectl_gate;
mod protobuf;
mod s3;
mod scenario_runs;
mod scenarios;
mod validation;
mod velero;
mod velero_datapath;
mod velero_install;
mod world;
