//! Turns a PATCH request (or a PUT) into the object to store: applies the body by patch type and keeps
//! `metadata.managedFields` current, so that server-side apply sees the owners of every field.

use serde_json::Value;

use super::errors::{ApiError, ApiResult, Cause};
use super::meta::now_rfc3339;
use super::patch::{self, ApplyRequest, PatchError, PatchType, Schema, Scope};
use super::request::Target;

impl From<PatchError> for ApiError {
    fn from(e: PatchError) -> Self {
        let mut err = ApiError::new(e.code(), e.reason(), e.to_string());
        err.causes = e
            .causes()
            .into_iter()
            .map(|c| Cause {
                reason: c.reason.to_string(),
                message: c.message,
                field: c.field,
            })
            .collect();
        err
    }
}

/// Built-in kinds have merge keys compiled in; custom resources follow only the metadata rules.
fn schema_for(target: &Target) -> &'static Schema {
    if target.def.custom {
        Schema::generic()
    } else {
        Schema::builtin(&target.api_version(), &target.def.kind).unwrap_or(Schema::generic())
    }
}

fn request<'a>(target: &Target, manager: &'a str, force: bool, time: &'a str) -> ApplyRequest<'a> {
    ApplyRequest {
        manager,
        force,
        scope: if target.subresource.as_deref() == Some("status") {
            Scope::Status
        } else {
            Scope::Main
        },
        status_subresource: target.def.status_subresource,
        time,
    }
}

/// The object after applying `body` of type `kind` to `current` (None only for apply, which creates).
pub fn apply_patch(
    target: &Target,
    current: Option<&Value>,
    kind: PatchType,
    body: &Value,
    manager: Option<&str>,
    force: bool,
) -> ApiResult<Value> {
    let time = now_rfc3339();
    let schema = schema_for(target);
    if kind == PatchType::Apply {
        let manager = manager
            .ok_or_else(|| ApiError::bad_request("fieldManager is required for apply requests"))?;
        // A resourceVersion in the applied object is a precondition, as for an update: kube-apiserver
        // keeps it on the patched object and GuaranteedUpdate refuses a stale one
        // (kubernetes/kubernetes#63104; `endpoints/handlers/patch.go`).
        let rv = |o: &Value| {
            o.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .filter(|rv| !rv.is_empty())
                .map(str::to_owned)
        };
        if let (Some(live), Some(wanted)) = (current, rv(body))
            && rv(live).as_deref() != Some(wanted.as_str())
        {
            return Err(ApiError::conflict(
                &target.def.group,
                &target.def.plural,
                target.name.as_deref().unwrap_or(""),
            ));
        }
        return Ok(patch::apply(
            current,
            body,
            &request(target, manager, force, &time),
            schema,
        )?);
    }
    let current = current.ok_or_else(|| {
        ApiError::not_found(
            &target.def.group,
            &target.def.plural,
            target.name.as_deref().unwrap_or(""),
        )
    })?;
    let patched = match kind {
        PatchType::Json => patch::json_patch(current, body)?,
        PatchType::Merge => patch::merge_patch(current, body)?,
        PatchType::Strategic => {
            if target.def.custom {
                return Err(PatchType::unsupported(true).into());
            }
            patch::strategic_merge(current, body, schema)?
        }
        PatchType::Apply => unreachable_apply(),
    };
    track_update(target, Some(current), patched, manager)
}

/// Records which fields an ordinary write changed as owned by its manager (`Update` operation).
pub fn track_update(
    target: &Target,
    old: Option<&Value>,
    new: Value,
    manager: Option<&str>,
) -> ApiResult<Value> {
    let Some(manager) = manager else {
        return Ok(new);
    };
    let time = now_rfc3339();
    Ok(patch::record_update(
        old,
        &new,
        &request(target, manager, false, &time),
        schema_for(target),
    )?)
}

// Apply returns early above; this keeps the match exhaustive without a panic path.
fn unreachable_apply() -> Value {
    Value::Null
}
