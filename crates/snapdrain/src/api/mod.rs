//! The DisruptionPlan CRD (`snapdrain.io/v1alpha1`) and the Velero types snapdrain reads and writes.
//!
//! - [`plan`]: the spec, with its schema constraints and CEL rules.
//! - [`status`]: the status, including what a restarted controller needs to resume.
//! - [`validate()`]: the same checks without an API server, plus the ones CEL cannot do.
//! - [`velero`]: plain serde structs for Velero Backup and BackupStorageLocation.

pub mod plan;
pub mod status;
pub mod validate;
pub mod velero;

pub use plan::{
    BackupMethod, BackupPolicy, BackupSpec, BottlerocketSpec, CapacityType, DisruptionPlan,
    DisruptionPlanSpec, DrainSpec, LaunchTemplateRef, PlanMode, PlanSource, ReplacementSpec,
    ReplacementWhen, TerminationSpec,
};
pub use status::{
    BackupRecord, DisruptionPlanStatus, NodePhase, NodeProgress, PlanPhase, ReplacementProgress,
    StatusSummary, VerifiedObject,
};
pub use validate::{SpecProblem, ValidSpec, parse_duration, problems_message, validate};

use kube::CustomResourceExt;

/// The CustomResourceDefinition of `DisruptionPlan` as YAML, exactly as committed in
/// `crds/disruptionplan.yaml` (`snapdrain crds` prints it).
pub fn crd_yaml() -> String {
    match serde_saphyr::to_string(&DisruptionPlan::crd()) {
        Ok(yaml) => yaml,
        // A CRD is plain data (strings, maps, lists, bools, numbers): serializing it cannot fail, and a
        // failure here would be a bug in the YAML serializer, caught by tests/crds.rs.
        Err(e) => panic!("serializing the DisruptionPlan CRD to YAML failed: {e}"),
    }
}
