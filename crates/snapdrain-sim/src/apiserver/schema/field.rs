//! Field errors as apimachinery `pkg/util/validation/field/errors.go` renders them (`ErrorBody`): the
//! type's text, the bad value (`%v` for numbers and booleans, `%q` for strings, JSON otherwise), then the
//! detail. Each becomes one `Status.details.causes` entry.

use serde_json::Value;

use crate::apiserver::errors::Cause;

/// `%v` / `%q` / JSON, as `ErrorBody` prints a bad value.
pub fn render(v: &Value) -> String {
    match v {
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        other => other.to_string(),
    }
}

fn cause(reason: &str, path: &str, message: String) -> Cause {
    Cause {
        reason: reason.into(),
        field: path.into(),
        message,
    }
}

pub fn required(path: &str) -> Cause {
    cause("FieldValueRequired", path, "Required value".into())
}

pub fn forbidden(path: &str, detail: &str) -> Cause {
    cause("FieldValueForbidden", path, format!("Forbidden: {detail}"))
}

pub fn invalid(path: &str, value: &Value, detail: &str) -> Cause {
    cause(
        "FieldValueInvalid",
        path,
        format!("Invalid value: {}: {detail}", render(value)),
    )
}

/// `Required` with a detail (a CEL rule's message).
pub fn required_detail(path: &str, detail: &str) -> Cause {
    cause(
        "FieldValueRequired",
        path,
        format!("Required value: {detail}"),
    )
}

/// `Duplicate`: the value, no detail.
pub fn duplicate(path: &str, value: &Value) -> Cause {
    cause(
        "FieldValueDuplicate",
        path,
        format!("Duplicate value: {}", render(value)),
    )
}

/// Invalid with the value left out (`field.OmitValueType`, for objects and arrays).
pub fn invalid_omitted(path: &str, detail: &str) -> Cause {
    cause(
        "FieldValueInvalid",
        path,
        format!("Invalid value: {detail}"),
    )
}

/// `TypeInvalid`: reads like Invalid, with its own reason.
pub fn type_invalid(path: &str, value: &Value, detail: &str) -> Cause {
    cause(
        "FieldValueTypeInvalid",
        path,
        format!("Invalid value: {}: {detail}", render(value)),
    )
}

/// `NotSupported` for an enum: every allowed value quoted (`strconv.Quote`), non-strings as JSON first.
pub fn not_supported(path: &str, value: &Value, allowed: &[Value]) -> Cause {
    let quoted: Vec<String> = allowed
        .iter()
        .map(|a| {
            let text = match a {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            serde_json::to_string(&text).unwrap_or_default()
        })
        .collect();
    let mut message = format!("Unsupported value: {}", render(value));
    if !quoted.is_empty() {
        message.push_str(&format!(": supported values: {}", quoted.join(", ")));
    }
    cause("FieldValueNotSupported", path, message)
}

/// `TooLong`: the value is left out of the message.
pub fn too_long(path: &str, max: u64) -> Cause {
    let unit = if max == 1 { "byte" } else { "bytes" };
    cause(
        "FieldValueTooLong",
        path,
        format!("Too long: may not be more than {max} {unit}"),
    )
}

/// `TooMany`, for maxItems and maxProperties.
pub fn too_many(path: &str, actual: usize, max: u64) -> Cause {
    let unit = if max == 1 { "item" } else { "items" };
    cause(
        "FieldValueTooMany",
        path,
        format!("Too many: {actual}: must have at most {max} {unit}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_read_like_error_body() {
        assert_eq!(
            not_supported("spec.x", &json!("c"), &[json!("a"), json!("b")]).message,
            "Unsupported value: \"c\": supported values: \"a\", \"b\""
        );
        assert_eq!(
            invalid(
                "spec.n",
                &json!(0),
                "spec.n in body should be greater than or equal to 1"
            )
            .message,
            "Invalid value: 0: spec.n in body should be greater than or equal to 1"
        );
        assert_eq!(
            too_long("a", 5).message,
            "Too long: may not be more than 5 bytes"
        );
        assert_eq!(
            too_many("a", 4, 3).message,
            "Too many: 4: must have at most 3 items"
        );
        assert_eq!(required("spec.a").message, "Required value");
    }
}
