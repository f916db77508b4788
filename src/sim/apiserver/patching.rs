//! Applies a PATCH request body to the stored object, by patch type.

use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::patch::{self, PatchType};
use super::request::Target;

pub fn apply_patch(
    target: &Target,
    current: Option<&Value>,
    kind: PatchType,
    body: &Value,
    manager: Option<&str>,
    force: bool,
) -> ApiResult<Value> {
    let _ = (manager, force);
    let mut obj = current.cloned().unwrap_or_else(|| serde_json::json!({}));
    match kind {
        PatchType::Json => {
            patch::json(&mut obj, body).map_err(|e| ApiError::new(422, "Invalid", e))?
        }
        PatchType::Merge | PatchType::Strategic | PatchType::Apply => patch::merge(&mut obj, body),
    }
    let _ = target;
    Ok(obj)
}
