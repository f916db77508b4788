//! REST verbs on resources: get, list, watch, create, update, patch, delete, deletecollection, and the
//! `status`, `scale` and `binding` subresources (eviction lives in `eviction.rs`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use super::admission::{self, AdmissionAttributes, Operation};
use super::audit::Record;
use super::errors::{ApiError, ApiResult};
use super::filter::ListFilter;
use super::meta::meta_str;
use super::patch::{self, PatchType};
use super::request::{Query, Target};
use super::response::{Reply, json_response};
use super::store::{DeleteOptions, Deleted, WriteOptions};
use super::watch::{self, WatchRequest};
use super::{ApiState, eviction, present, schema, strict, table};

/// The verb as audit logs and fault rules name it.
pub fn verb(method: &Method, target: &Target, query: &Query) -> &'static str {
    match (method.as_str(), target.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if query.flag("watch") => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

pub struct Request {
    /// Who sent it (authenticated from its bearer token).
    pub user: super::auth::UserInfo,
    pub method: Method,
    pub target: Target,
    pub query: Query,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn user_agent(&self) -> Option<&str> {
        self.header("user-agent")
    }

    fn content_type(&self) -> &str {
        self.header("content-type").unwrap_or("application/json")
    }

    fn wants_table(&self) -> bool {
        table::wants_table(self.header("accept"))
    }

    /// The request body as JSON (or YAML, or protobuf for the kinds `protobuf` converts, where the
    /// content type says so).
    fn body_value(&self) -> ApiResult<Value> {
        let ct = self.content_type();
        if ct.contains("protobuf") {
            return Ok(super::protobuf::to_json(&self.body)?);
        }
        if ct.contains("cbor") {
            return Err(ApiError::unsupported_media_type(ct));
        }
        if self.body.is_empty() {
            return Err(ApiError::bad_request(
                "the request body is empty; send the object as JSON",
            ));
        }
        if ct.contains("yaml") {
            let text = std::str::from_utf8(&self.body)
                .map_err(|_| ApiError::bad_request("the request body is not valid UTF-8"))?;
            return serde_saphyr::from_str::<Value>(text)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")));
        }
        deep_json(&self.body)
    }

    /// `?fieldManager=`, or as the real server defaults it: the user agent up to the first `/`.
    fn field_manager(&self) -> String {
        self.query
            .get("fieldManager")
            .map(str::to_string)
            .unwrap_or_else(|| {
                self.user_agent()
                    .and_then(|ua| ua.split('/').next())
                    .unwrap_or("unknown")
                    .to_string()
            })
    }

    fn write_opts(&self) -> WriteOptions {
        WriteOptions {
            dry_run: self.query.dry_run(),
            internal: false,
        }
    }
}

pub async fn dispatch(state: Arc<ApiState>, req: Request) -> Reply {
    let t = &req.target;
    match (
        req.method.as_str(),
        t.name.is_some(),
        t.subresource.as_deref(),
    ) {
        ("GET", true, Some("scale")) => get_scale(&state, &req),
        ("GET", true, _) => get(&state, &req),
        ("GET", false, _) if req.query.flag("watch") => {
            let filter = ListFilter::from_query(&t.def, t.namespace.clone(), &req.query)?;
            let w = WatchRequest::from_query(t.clone(), filter, &req.query, req.wants_table())?;
            Ok(watch::respond(state, w))
        }
        ("GET", false, _) => list(&state, &req),
        ("POST", false, None)
            if t.def.group == "authorization.k8s.io"
                && t.def.plural == "selfsubjectaccessreviews" =>
        {
            self_subject_access_review(&state, &req)
        }
        ("POST", false, None) => create(&state, &req).await,
        ("POST", true, Some("eviction")) => {
            eviction::handle(
                &state,
                &req.target,
                &req.query,
                req.body_value()?,
                req.user_agent(),
                &req.user,
            )
            .await
        }
        ("POST", true, Some("binding")) => bind(&state, &req),
        ("POST", true, Some("token")) => token_request(&state, &req),
        ("PUT", true, Some("scale")) => update_scale(&state, &req),
        ("PUT", true, _) => update(&state, &req).await,
        ("PATCH", true, Some("scale")) => patch_scale(&state, &req),
        ("PATCH", true, _) => patch_object(&state, &req).await,
        ("DELETE", true, None) => delete(&state, &req).await,
        ("DELETE", false, None) => delete_collection(&state, &req).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({} {})",
            req.method,
            t.resource_name()
        ))),
    }
}

/// SelfSubjectAccessReview (`kubectl auth can-i`): the authorizer's answer for the requesting user.
/// Nothing is stored.
fn self_subject_access_review(state: &ApiState, req: &Request) -> Reply {
    let review = req.body_value()?;
    let attrs = super::auth::review::attributes(&review)?;
    let allowed = state
        .auth
        .authorize(&state.store, &req.user, &attrs)
        .is_ok();
    Ok(json_response(
        StatusCode::CREATED,
        &super::auth::review::answer(&review, allowed),
    ))
}

/// TokenRequest (`kubectl create token`): a token that authenticates as the ServiceAccount. The
/// ServiceAccount must exist, as the real registry (`serviceaccount/storage/token.go`) requires.
fn token_request(state: &ApiState, req: &Request) -> Reply {
    let t = &req.target;
    let ns = t.namespace.as_deref().unwrap_or("default");
    let name = t.name.as_deref().unwrap_or("");
    if state.store.get(&t.def.key(), Some(ns), name).is_none() {
        return Err(ApiError::not_found("", "serviceaccounts", name));
    }
    // An empty body asks for the defaults; a body that cannot be read is an error, not an empty
    // spec (a protobuf body's audiences and duration would otherwise be lost).
    let spec = if req.body.is_empty() {
        json!({})
    } else {
        req.body_value()?
            .get("spec")
            .cloned()
            .unwrap_or_else(|| json!({}))
    };
    let seconds = spec
        .get("expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(seconds);
    let token = state.auth.issue(ns, name);
    Ok(json_response(
        StatusCode::CREATED,
        &json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()},
        }),
    ))
}

fn object_response(req: &Request, code: StatusCode, obj: &Value) -> Response {
    if req.wants_table() {
        let rv = meta_str(obj, "resourceVersion").unwrap_or("");
        return json_response(code, &table::table(&req.target.def, &[obj], rv, None, true));
    }
    json_response(code, &present(obj, &req.target))
}

fn get(state: &ApiState, req: &Request) -> Reply {
    let t = &req.target;
    let name = t.name.as_deref().unwrap_or("");
    let obj = state
        .store
        .get(&t.def.key(), t.namespace.as_deref(), name)
        .ok_or_else(|| ApiError::not_found(&t.def.group, &t.def.plural, name))?;
    Ok(object_response(req, StatusCode::OK, &obj))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: u64,
    ns: String,
    name: String,
}

fn list(state: &ApiState, req: &Request) -> Reply {
    let t = &req.target;
    let filter = ListFilter::from_query(&t.def, t.namespace.clone(), &req.query)?;
    let limit = req
        .query
        .number("limit")?
        .filter(|l| *l > 0)
        .map(|l| l as usize);
    let after = match req.query.get("continue") {
        None => None,
        Some(tok) => {
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(tok)
                .map_err(|_| {
                    ApiError::bad_request("continue key is not valid: illegal base64 data")
                })?;
            let tok: ContinueToken = serde_json::from_slice(&bytes).map_err(|_| {
                ApiError::bad_request("continue key is not valid: unparseable token")
            })?;
            Some(tok)
        }
    };
    let after_key = after.as_ref().map(|t| (t.ns.clone(), t.name.clone()));
    let page = state.store.list(
        &t.def.key(),
        t.namespace.as_deref(),
        &|o| filter.matches(o),
        limit,
        after_key.as_ref(),
    );
    // A continued list reports the resourceVersion of its first page.
    let rv = after.as_ref().map_or(page.rv, |t| t.rv);
    let cont = page.next.map(|(ns, name)| {
        let tok = serde_json::to_vec(&ContinueToken { rv, ns, name }).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tok)
    });
    if req.wants_table() {
        let objs: Vec<&Value> = page.items.iter().map(|a| a.as_ref()).collect();
        return Ok(json_response(
            StatusCode::OK,
            &table::table(&t.def, &objs, &rv.to_string(), cont.as_deref(), true),
        ));
    }
    // Streamed by hand: large lists (150,000 pods) serialize item by item without building one big Value.
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = &cont {
        meta["continue"] = json!(c);
    }
    // `write_json` reserves what the cached items need; others grow the buffer as they go.
    let mut buf = Vec::with_capacity(4096);
    buf.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut buf, &format!("{}List", t.def.kind))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    buf.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut buf, &t.api_version())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    buf.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut buf, &meta).map_err(|e| ApiError::internal(e.to_string()))?;
    buf.extend_from_slice(b",\"items\":[");
    if t.version == t.def.storage_version() {
        // Each object's JSON is cached in the store until it changes: a list concatenates bytes.
        state
            .store
            .write_json(&t.def.key(), &page.items, &mut buf)
            .map_err(|e| ApiError::internal(e.to_string()))?;
    } else {
        for (i, item) in page.items.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            serde_json::to_writer(&mut buf, &present(item, t))
                .map_err(|e| ApiError::internal(e.to_string()))?;
        }
    }
    buf.extend_from_slice(b"]}");
    Ok(Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(buf))
        .unwrap_or_else(|_| Response::new(Body::empty())))
}

fn check_kind(req: &Request, body: &Value) -> ApiResult<()> {
    let t = &req.target;
    if let Some(kind) = body.get("kind").and_then(Value::as_str)
        && kind != t.def.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the provided object ({kind}) does not match the resource ({})",
            t.def.kind
        )));
    }
    if let Some(ns) = body.pointer("/metadata/namespace").and_then(Value::as_str)
        && t.namespace.as_deref().is_some_and(|n| n != ns)
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

/// Strict field validation (`strict/`), after a custom resource is coerced by its CRD schema (pruned
/// and defaulted, as the real decoder does before admission). `raw` checks the request bytes for
/// duplicate keys (a patch's bytes are not the object). Returns the warnings to send.
fn check_fields(
    state: &ApiState,
    req: &Request,
    obj: &mut Value,
    raw: bool,
) -> ApiResult<Vec<String>> {
    let directive = strict::Directive::from_query(req.query.get("fieldValidation"))?;
    let t = &req.target;
    let duplicates = if raw && !req.content_type().contains("yaml") {
        strict::duplicate_fields(&req.body)
    } else {
        Vec::new()
    };
    let unknown = if t.def.custom {
        let crd = state.store.crd_of(&t.def);
        match crd.as_deref().and_then(|c| schema::of_crd(c, &t.version)) {
            Some(s) => schema::coerce(obj, s),
            None => Vec::new(),
        }
    } else {
        strict::builtin_unknown_fields(&t.def.group, &t.def.kind, obj)
    };
    strict::Findings::new(&duplicates, &unknown).apply(directive, &t.def.kind, &t.version)
}

/// Adds one `Warning` header per warning, which kubectl prints and kube-rs logs.
fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        if let Ok(v) = axum::http::HeaderValue::from_str(&strict::warning_header(w)) {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

async fn create(state: &Arc<ApiState>, req: &Request) -> Reply {
    let t = &req.target;
    if t.def.namespaced && t.namespace.is_none() {
        return Err(ApiError::method_not_allowed(format!(
            "{} must be created in a namespace: POST to /.../namespaces/<namespace>/{}",
            t.def.plural, t.def.plural
        )));
    }
    let mut body = req.body_value()?;
    check_kind(req, &body)?;
    let warnings = check_fields(state, req, &mut body, true)?;
    let name = meta_str(&body, "name").map(str::to_string);
    admission::admit(
        state,
        AdmissionAttributes {
            operation: Operation::Create,
            target: t,
            name: name.as_deref().unwrap_or(""),
            object: Some(&body),
            old_object: None,
            dry_run: req.query.dry_run(),
            user_agent: req.user_agent(),
            user: &req.user,
        },
    )
    .await?;
    let body = super::patching::track_update(t, None, body, Some(&req.field_manager()))?;
    let created =
        state
            .store
            .create(&t.def.key(), t.namespace.as_deref(), body, req.write_opts())?;
    Ok(with_warnings(
        object_response(req, StatusCode::CREATED, &created),
        &warnings,
    ))
}

async fn update(state: &Arc<ApiState>, req: &Request) -> Reply {
    let t = &req.target;
    let name = t.name.as_deref().unwrap_or("");
    let mut body = req.body_value()?;
    check_kind(req, &body)?;
    let warnings = check_fields(state, req, &mut body, true)?;
    let old = state.store.get(&t.def.key(), t.namespace.as_deref(), name);
    admission::admit(
        state,
        AdmissionAttributes {
            operation: Operation::Update,
            target: t,
            name,
            object: Some(&body),
            old_object: old.as_deref(),
            dry_run: req.query.dry_run(),
            user_agent: req.user_agent(),
            user: &req.user,
        },
    )
    .await?;
    let sub = t.subresource.as_deref();
    let manager = req.field_manager();
    let updated = state.store.modify(
        &t.def.key(),
        t.namespace.as_deref(),
        name,
        sub,
        req.write_opts(),
        |current| super::patching::track_update(t, Some(current), body, Some(&manager)),
    )?;
    Ok(with_warnings(
        object_response(req, StatusCode::OK, &updated),
        &warnings,
    ))
}

async fn patch_object(state: &Arc<ApiState>, req: &Request) -> Reply {
    let t = &req.target;
    let name = t.name.as_deref().unwrap_or("");
    let ct = req.content_type();
    let kind =
        PatchType::from_content_type(ct).ok_or_else(|| ApiError::unsupported_media_type(ct))?;
    let body = req.body_value()?;
    let manager = match kind {
        PatchType::Apply => req.query.get("fieldManager").map(str::to_string),
        _ => Some(req.field_manager()),
    };
    let force = req.query.flag("force");
    if kind == PatchType::Apply && manager.is_none() {
        return Err(ApiError::bad_request(
            "PATCH: fieldManager is required for apply requests",
        ));
    }
    let old = state.store.get(&t.def.key(), t.namespace.as_deref(), name);
    if old.is_none() && kind != PatchType::Apply {
        return Err(ApiError::not_found(&t.def.group, &t.def.plural, name));
    }
    // Admission sees the object as it will be after the patch.
    let mut preview = match &old {
        Some(o) => Some(super::patching::apply_patch(
            t,
            Some(o),
            kind,
            &body,
            manager.as_deref(),
            force,
        )?),
        None => Some(super::patching::apply_patch(
            t,
            None,
            kind,
            &body,
            manager.as_deref(),
            force,
        )?),
    };
    let warnings = match preview.as_mut() {
        Some(p) => check_fields(state, req, p, false)?,
        None => Vec::new(),
    };
    admission::admit(
        state,
        AdmissionAttributes {
            operation: if old.is_some() {
                Operation::Update
            } else {
                Operation::Create
            },
            target: t,
            name,
            object: preview.as_ref(),
            old_object: old.as_deref(),
            dry_run: req.query.dry_run(),
            user_agent: req.user_agent(),
            user: &req.user,
        },
    )
    .await?;
    let sub = t.subresource.as_deref();
    let (obj, created) = state.store.upsert(
        &t.def.key(),
        t.namespace.as_deref(),
        name,
        sub,
        req.write_opts(),
        |current| {
            if current.is_none() && kind != PatchType::Apply {
                return Err(ApiError::not_found(&t.def.group, &t.def.plural, name));
            }
            super::patching::apply_patch(t, current, kind, &body, manager.as_deref(), force)
        },
    )?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_warnings(object_response(req, code, &obj), &warnings))
}

fn delete_options(req: &Request) -> ApiResult<DeleteOptions> {
    let body: Value = if req.body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let grace = match req.query.number("gracePeriodSeconds")? {
        Some(g) => Some(g),
        None => body.get("gracePeriodSeconds").and_then(Value::as_i64),
    };
    let dry_run = req.query.dry_run()
        || body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|v| v == "All"));
    Ok(DeleteOptions {
        grace_period_seconds: grace,
        precondition_uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        precondition_rv: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string),
        dry_run,
    })
}

async fn delete(state: &Arc<ApiState>, req: &Request) -> Reply {
    let t = &req.target;
    let name = t.name.as_deref().unwrap_or("");
    let opts = delete_options(req)?;
    let old = state
        .store
        .get(&t.def.key(), t.namespace.as_deref(), name)
        .ok_or_else(|| ApiError::not_found(&t.def.group, &t.def.plural, name))?;
    admission::admit(
        state,
        AdmissionAttributes {
            operation: Operation::Delete,
            target: t,
            name,
            object: None,
            old_object: Some(&old),
            dry_run: opts.dry_run,
            user_agent: req.user_agent(),
            user: &req.user,
        },
    )
    .await?;
    match state
        .store
        .delete(&t.def.key(), t.namespace.as_deref(), name, &opts)?
    {
        Deleted::Pending(obj) => Ok(object_response(req, StatusCode::OK, &obj)),
        Deleted::Gone(obj) => {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": t.def.group, "kind": t.def.plural,
                    "uid": meta_str(&obj, "uid").unwrap_or("")}});
            Ok(json_response(StatusCode::OK, &status))
        }
    }
}

async fn delete_collection(state: &Arc<ApiState>, req: &Request) -> Reply {
    let t = &req.target;
    let filter = ListFilter::from_query(&t.def, t.namespace.clone(), &req.query)?;
    let opts = delete_options(req)?;
    let page = state.store.list(
        &t.def.key(),
        t.namespace.as_deref(),
        &|o| filter.matches(o),
        None,
        None,
    );
    let mut deleted = Vec::new();
    for obj in page.items {
        let ns = meta_str(&obj, "namespace").map(str::to_string);
        let name = meta_str(&obj, "name").unwrap_or("").to_string();
        match state
            .store
            .delete(&t.def.key(), ns.as_deref(), &name, &opts)
        {
            Ok(Deleted::Pending(o)) | Ok(Deleted::Gone(o)) => deleted.push(present(&o, t)),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({"kind": format!("{}List", t.def.kind), "apiVersion": t.api_version(),
        "metadata": {"resourceVersion": state.store.current_rv().to_string()}, "items": deleted});
    Ok(json_response(StatusCode::OK, &list))
}

/// `POST pods/{name}/binding`: the scheduler's way to set `spec.nodeName`.
fn bind(state: &ApiState, req: &Request) -> Reply {
    let t = &req.target;
    let name = t.name.as_deref().unwrap_or("");
    let body = req.body_value()?;
    let node = body
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request("Binding.target.name is required: the node to bind the pod to")
        })?
        .to_string();
    state.store.modify(&t.def.key(), t.namespace.as_deref(), name, None, req.write_opts(), |pod| {
        if let Some(existing) = pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) {
            return Err(ApiError::new(409, "Conflict", format!(
                "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{existing}\""
            )));
        }
        let mut p = pod.clone();
        p["spec"]["nodeName"] = json!(node);
        Ok(p)
    })?;
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    Ok(json_response(StatusCode::CREATED, &status))
}

fn scale_of(t: &Target, obj: &Value) -> Value {
    let selector = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": obj.pointer("/metadata/name"), "namespace": t.namespace, "uid": obj.pointer("/metadata/uid"),
            "resourceVersion": obj.pointer("/metadata/resourceVersion"), "creationTimestamp": obj.pointer("/metadata/creationTimestamp")},
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {"replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)), "selector": selector}})
}

fn get_scale(state: &ApiState, req: &Request) -> Reply {
    let t = &req.target;
    let name = t.name.as_deref().unwrap_or("");
    let obj = state
        .store
        .get(&t.def.key(), t.namespace.as_deref(), name)
        .ok_or_else(|| ApiError::not_found(&t.def.group, &t.def.plural, name))?;
    Ok(json_response(StatusCode::OK, &scale_of(t, &obj)))
}

fn write_scale(
    state: &ApiState,
    req: &Request,
    f: impl FnOnce(&Value) -> ApiResult<Value>,
) -> Reply {
    let t = &req.target;
    let name = t.name.as_deref().unwrap_or("");
    let mut scale = Value::Null;
    let updated = state.store.modify(&t.def.key(), t.namespace.as_deref(), name, None, req.write_opts(), |obj| {
        let new_scale = f(&scale_of(t, obj))?;
        let replicas = new_scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .ok_or_else(|| ApiError::bad_request("Scale.spec.replicas must be an integer"))?;
        if replicas < 0 {
            return Err(ApiError::new(422, "Invalid", format!("Scale.autoscaling \"{name}\" is invalid: spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0")));
        }
        let mut o = obj.clone();
        o["spec"]["replicas"] = json!(replicas);
        scale = new_scale;
        Ok(o)
    })?;
    let _ = scale;
    Ok(json_response(StatusCode::OK, &scale_of(t, &updated)))
}

fn update_scale(state: &ApiState, req: &Request) -> Reply {
    let body = req.body_value()?;
    write_scale(state, req, |_| Ok(body))
}

fn patch_scale(state: &ApiState, req: &Request) -> Reply {
    let ct = req.content_type();
    let kind =
        PatchType::from_content_type(ct).ok_or_else(|| ApiError::unsupported_media_type(ct))?;
    let body = req.body_value()?;
    write_scale(state, req, |current| {
        Ok(match kind {
            PatchType::Json => patch::json_patch(current, &body)?,
            _ => patch::merge_patch(current, &body)?,
        })
    })
}

/// Records a mutating request in the audit log.
pub fn audit(state: &ApiState, verb: &str, target: &Target, user_agent: Option<&str>, code: u16) {
    if matches!(verb, "get" | "list" | "watch") {
        return;
    }
    state.audit.record(Record {
        source: "api",
        verb,
        resource: &target.resource_name(),
        namespace: target.namespace.as_deref(),
        name: target.name.as_deref(),
        user_agent,
        code: Some(code),
        detail: Value::Null,
    });
}

/// How deep the simulated server lets a JSON body nest. kube-apiserver decodes with sigs.k8s.io/json, a
/// fork of Go's encoding/json, whose scanner refuses more than 10,000 levels (`maxNestingDepth`) with
/// "exceeded max depth". The simulator stops at 512 because its store recurses over the value; what it
/// must model is that the server keeps objects far deeper than serde_json's default limit of 128, which
/// is where a Rust client's decoding of a list stops (security review H-1).
pub const MAX_JSON_DEPTH: usize = 512;

/// Decodes a JSON request body as kube-apiserver does: deep nesting is accepted up to
/// [`MAX_JSON_DEPTH`], beyond which the error is the server's.
pub fn deep_json(body: &[u8]) -> Result<Value, ApiError> {
    let parse_error = |e: String| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    };
    if nesting(body) > MAX_JSON_DEPTH {
        return Err(parse_error("exceeded max depth".into()));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    // Bounded by the check above; serde_json's own limit (128) is lower than the real server's.
    de.disable_recursion_limit();
    let value = <Value as serde::Deserialize>::deserialize(&mut de)
        .map_err(|e| parse_error(e.to_string()))?;
    de.end().map_err(|e| parse_error(e.to_string()))?;
    Ok(value)
}

/// The deepest nesting of arrays and objects in `body`, outside strings.
fn nesting(body: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod deep_json_tests {
    use super::*;

    #[test]
    fn nesting_counts_arrays_and_objects_outside_strings() {
        assert_eq!(nesting(br#"{"a":[1,{"b":2}]}"#), 3);
        // Brackets and escaped quotes inside strings are text.
        assert_eq!(nesting(br#"{"a":"[[{\"[","b":1}"#), 1);
        assert_eq!(nesting(b"1"), 0);
    }

    #[test]
    fn bodies_deeper_than_serde_jsons_default_are_accepted_up_to_the_limit() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(
            serde_json::from_str::<Value>(&deep(200)).is_err(),
            "serde_json's own limit is 128"
        );
        assert!(deep_json(deep(200).as_bytes()).is_ok());
        assert!(deep_json(deep(MAX_JSON_DEPTH).as_bytes()).is_ok());
        let err = deep_json(deep(MAX_JSON_DEPTH + 1).as_bytes()).expect_err("too deep");
        assert!(format!("{err:?}").contains("exceeded max depth"), "{err:?}");
        assert!(deep_json(b"{} trailing").is_err());
    }
}
