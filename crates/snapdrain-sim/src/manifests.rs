//! Reading plain manifests (a YAML list of objects, or `---`-separated documents) for the simulator.

use serde_json::Value;

use super::error::SimError;

/// Parses `text` from `file` into objects, flattening `List` kinds and lists of objects.
pub fn parse_objects(text: &str, file: &str) -> Result<Vec<Value>, SimError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| SimError::Scenario {
        file: file.to_string(),
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        match doc {
            Value::Null => {}
            Value::Array(items) => out.extend(items),
            Value::Object(ref m)
                if m.get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                out.extend(
                    m.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            Value::Object(_) => out.push(doc),
            other => {
                return Err(SimError::Scenario {
                    file: file.to_string(),
                    message: format!(
                        "document {} is {other}, expected an object or a list of objects",
                        i + 1
                    ),
                });
            }
        }
    }
    for (i, obj) in out.iter().enumerate() {
        if obj.get("apiVersion").and_then(Value::as_str).is_none()
            || obj.get("kind").and_then(Value::as_str).is_none()
        {
            return Err(SimError::Scenario {
                file: file.to_string(),
                message: format!(
                    "object {} has no apiVersion or kind; every object needs both",
                    i + 1
                ),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lists_and_documents_and_names_bad_ones() {
        let text = "- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n";
        assert_eq!(parse_objects(text, "s.yaml").unwrap().len(), 2);
        let err = parse_objects("- {metadata: {name: a}}\n", "bad.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bad.yaml") && err.contains("object 1"),
            "{err}"
        );
        assert!(
            parse_objects("a: [unclosed\n", "broken.yaml")
                .unwrap_err()
                .to_string()
                .contains("broken.yaml")
        );
    }
}
