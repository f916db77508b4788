//! TEMPORARY: admission webhooks are not called yet.
use super::ApiState;
use super::errors::ApiResult;
use super::request::Target;
use serde_json::Value;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

pub struct AdmissionAttributes<'a> {
    pub operation: Operation,
    pub target: &'a Target,
    pub name: &'a str,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    pub user_agent: Option<&'a str>,
}

pub async fn admit(_state: &Arc<ApiState>, _attrs: AdmissionAttributes<'_>) -> ApiResult<()> {
    Ok(())
}

#[derive(Default)]
pub struct Admission;
