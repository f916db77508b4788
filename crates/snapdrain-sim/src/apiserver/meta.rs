//! Reading and writing an object's metadata, and the timestamp format the server writes there. A leaf:
//! the store, the handlers, the OpenAPI documents and the world controllers all read metadata, and none
//! of them should need the store for it.

use serde_json::{Value, json};

pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub(super) fn rfc3339_in(seconds: i64) -> String {
    let ts = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(seconds);
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

pub(super) fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"][field] = value;
}

pub(super) fn remove_meta(obj: &mut Value, field: &str) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove(field);
    }
}
