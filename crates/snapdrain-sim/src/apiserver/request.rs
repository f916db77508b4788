//! Parsing of resource request paths and query parameters into what the handlers act on.

use std::collections::HashMap;

use super::errors::{ApiError, ApiResult};
use super::resources::ResourceDef;
use super::store::Store;

/// `/api/v1/...` or `/apis/{group}/{version}/...`, resolved against the registry.
#[derive(Clone, Debug)]
pub struct Target {
    pub def: ResourceDef,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Target {
    pub fn api_version(&self) -> String {
        self.def.api_version(&self.version)
    }

    /// `pods`, `pods/eviction`, `statefulsets.apps/status`: how audit and fault rules name the target.
    pub fn resource_name(&self) -> String {
        let base = if self.def.group.is_empty() {
            self.def.plural.clone()
        } else {
            format!("{}.{}", self.def.plural, self.def.group)
        };
        match &self.subresource {
            Some(s) => format!("{base}/{s}"),
            None => base,
        }
    }
}

pub fn parse_path(store: &Store, path: &str) -> ApiResult<Target> {
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_found_path(path)),
    };
    let served = |plural: &str| store.lookup(group, version, plural);
    let (namespace, rest): (Option<String>, &[&str]) = match rest {
        ["namespaces", ns, plural, tail @ ..] if served(plural).is_some() => {
            (Some(ns.to_string()), {
                // Re-slice to `plural, tail...`.
                let start = rest.len() - tail.len() - 1;
                &rest[start..]
            })
        }
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(not_found_path(path)),
    };
    let def = served(plural).ok_or_else(|| not_found_path(path))?;
    if namespace.is_some() && !def.namespaced {
        return Err(not_found_path(path));
    }
    if let Some(s) = &sub
        && !def.has_subresource(s)
    {
        return Err(not_found_path(path));
    }
    Ok(Target {
        def,
        version: version.to_string(),
        namespace,
        name,
        subresource: sub,
    })
}

fn not_found_path(path: &str) -> ApiError {
    let mut e = ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    e.causes.push(super::errors::Cause {
        reason: "UnexpectedServerResponse".into(),
        message: format!("404 page not found: {path}"),
        field: String::new(),
    });
    e
}

/// Query parameters, decoded.
#[derive(Clone, Debug, Default)]
pub struct Query(pub HashMap<String, String>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(raw.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true") | Some("1"))
    }

    pub fn number(&self, key: &str) -> ApiResult<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid value for {key}: {v:?} (must be an integer)"
                ))
            }),
        }
    }

    pub fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }
}
