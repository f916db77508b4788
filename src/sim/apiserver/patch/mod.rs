//! TEMPORARY minimal patches until the full implementation merges.
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" => Some(Self::Apply),
            _ => None,
        }
    }
}

pub fn merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch)
}
pub fn json(target: &mut Value, patch: &Value) -> Result<(), String> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| e.to_string())?;
    json_patch::patch(target, &p).map_err(|e| e.to_string())
}
