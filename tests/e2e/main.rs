//! snapdrain against the simulated cluster, through real interfaces: the controller over HTTP with a kube
//! client, the demo, the CRD and the Helm chart. One test binary, one module per subject.

mod admission_policies;
mod caches;
mod chaos;
mod controller;
mod crds;
mod datapath;
mod demo;
mod deploy;
mod drain_cli;
mod gate;
mod gate_fuzz;
mod helm;
mod history;
mod holds_cli;
mod hostile_input;
mod iam_policy;
mod image;
mod kustomize;
mod launch_policy;
mod least_privilege;
mod monitoring;
mod moto;
mod notifications;
mod posture;
mod real_backup;
mod real_cloud;
mod real_drain;
mod real_velero;
mod release;
mod replacement_join;
mod resilience;
mod rollout;
mod signals;
mod sim_serve;
mod version;
