//! CEL validation rules of CRDs (`x-kubernetes-validations`) with the `cel` crate.

mod crd;
mod library;
mod rules;

pub use crd::check as check_crd;
pub use rules::validate;
