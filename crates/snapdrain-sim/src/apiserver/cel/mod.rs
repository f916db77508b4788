//! CEL validation rules of CRDs (`x-kubernetes-validations`) with the `cel` crate; the same
//! environment evaluates ValidatingAdmissionPolicies (`admission/policy.rs`).

mod crd;
mod library;
mod rules;

pub use crd::check as check_crd;
pub use library::{compile, context};
pub use rules::validate;
