//! The DisruptionPlan CRD (`snapdrain.io/v1alpha1`) and the Velero types snapdrain reads and writes.
//!
//! - [`backup_hooks`]: the DisruptionPolicy's default backup hooks, shaped as Velero's.
//! - [`duration`]: Go duration strings, parsed without overflow.
//! - [`karpenter`]: plain serde structs for the Karpenter EC2NodeClass a replacement may launch from.
//! - [`launch`]: the DisruptionPolicy's allow-lists of what a replacement may launch.
//! - [`lenient`]: objects decoded one by one, so one bad object never fails a list or a watch.
//! - [`plan`]: the spec, with its schema constraints and CEL rules.
//! - [`policy`]: the cluster-wide DisruptionPolicy for plans made from signals.
//! - [`status`]: the status, including what a restarted controller needs to resume.
//! - [`validate()`]: the same checks without an API server, plus the ones CEL cannot do.
//! - [`velero`]: plain serde structs for Velero Backup and BackupStorageLocation.
//! - [`velero_schedule`]: Velero's Schedule, as snapdrain writes it for warm backups.
//! - [`volume`]: each protected volume's class (network or node-local) and backup method.
//! - [`warm`]: the policy's warm backups (a Velero Schedule per protected namespace).

pub mod backup_hooks;
pub mod duration;
pub mod karpenter;
pub mod launch;
pub mod lenient;
pub mod plan;
pub mod policy;
pub mod status;
pub mod validate;
pub mod velero;
pub mod velero_schedule;
pub mod volume;
pub mod warm;

pub use plan::{
    BackupMethod, BackupPolicy, BackupScope, BackupSpec, BottlerocketSpec, CapacityType,
    DisruptionPlan, DisruptionPlanSpec, DrainSpec, LaunchTemplateRef, NodeClassRef, PlanMode,
    PlanSource, ReplacementSpec, ReplacementWhen, TerminationSpec,
};
/// Annotation a person sets to stop a plan; it rolls back what snapdrain did.
pub const ABORT_ANNOTATION: &str = "snapdrain.io/abort";

/// A finished plan annotated `snapdrain.io/keep: "true"` is never deleted by the policy's `history`.
pub const KEEP_ANNOTATION: &str = "snapdrain.io/keep";

pub use policy::{DEFAULT_POLICY, DisruptionPolicy, DisruptionPolicySpec};
pub use status::{
    BackupRecord, DisruptionPlanStatus, NodePhase, NodeProgress, PlanPhase, ReplacementProgress,
    StatusSummary, VerifiedObject,
};
pub use validate::{SpecProblem, ValidSpec, parse_duration, problems_message, validate};

use kube::CustomResourceExt;

/// The CustomResourceDefinition of `DisruptionPlan` as YAML, exactly as committed in
/// `crds/disruptionplan.yaml` (`snapdrain crds --only plan` prints it).
pub fn crd_yaml() -> String {
    to_yaml(&DisruptionPlan::crd())
}

/// The CustomResourceDefinition of `DisruptionPolicy` as YAML, as committed in `crds/disruptionpolicy.yaml`.
pub fn policy_crd_yaml() -> String {
    to_yaml(&DisruptionPolicy::crd())
}

fn to_yaml(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> String {
    match serde_saphyr::to_string(crd) {
        Ok(yaml) => yaml,
        // A CRD is plain data (strings, maps, lists, bools, numbers): serializing it cannot fail, and a
        // failure here would be a bug in the YAML serializer, caught by tests/crds.rs.
        Err(e) => panic!("serializing a CRD to YAML failed: {e}"),
    }
}
