//! TokenRequest (`k8s.io/api/authentication/v1`, `kubectl create token`:
//! `kubectl/pkg/cmd/create/create_token.go`) and SelfSubjectAccessReview
//! (`k8s.io/api/authorization/v1`, `kubectl auth can-i`: `kubectl/pkg/cmd/auth/cani.go`).

use k8s_pb::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_pb::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use serde_json::Value;

use super::fields::{Obj, Result};
use super::meta;

pub fn token_request(t: TokenRequest) -> Result<Value> {
    let TokenRequest {
        metadata,
        spec,
        status,
    } = t;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.embedded("spec", spec, |path, s: TokenRequestSpec| {
        let TokenRequestSpec {
            audiences,
            expiration_seconds,
            bound_object_ref,
        } = s;
        let mut o = Obj::new(path);
        o.strings("audiences", audiences);
        o.ptr("expirationSeconds", expiration_seconds);
        o.message("boundObjectRef", bound_object_ref, |path, r| {
            let BoundObjectReference {
                kind,
                api_version,
                name,
                u_id,
            } = r;
            let mut o = Obj::new(path);
            o.string("kind", kind);
            o.string("apiVersion", api_version);
            o.string("name", name);
            o.string("uid", u_id);
            o.done()
        })?;
        o.done()
    })?;
    o.unmapped("status", &status)?;
    o.done()
}

pub fn self_subject_access_review(r: SelfSubjectAccessReview) -> Result<Value> {
    let SelfSubjectAccessReview {
        metadata,
        spec,
        status,
    } = r;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    // Not omitempty: an empty spec is still sent, and validation then names what is missing.
    let spec = spec.unwrap_or_default();
    let spec_path = o.at("spec");
    o.set("spec", review_spec(&spec_path, spec)?);
    o.unmapped("status", &status)?;
    o.done()
}

fn review_spec(path: &str, s: SelfSubjectAccessReviewSpec) -> Result<Value> {
    let SelfSubjectAccessReviewSpec {
        resource_attributes,
        non_resource_attributes,
    } = s;
    let mut o = Obj::new(path);
    o.message("resourceAttributes", resource_attributes, |path, a| {
        let ResourceAttributes {
            namespace,
            verb,
            group,
            version,
            resource,
            subresource,
            name,
            field_selector,
            label_selector,
        } = a;
        let mut o = Obj::new(path);
        o.string("namespace", namespace);
        o.string("verb", verb);
        o.string("group", group);
        o.string("version", version);
        o.string("resource", resource);
        o.string("subresource", subresource);
        o.string("name", name);
        o.unmapped("fieldSelector", &field_selector)?;
        o.unmapped("labelSelector", &label_selector)?;
        o.done()
    })?;
    o.message(
        "nonResourceAttributes",
        non_resource_attributes,
        |path, a| {
            let NonResourceAttributes { path: url, verb } = a;
            let mut o = Obj::new(path);
            o.string("path", url);
            o.string("verb", verb);
            o.done()
        },
    )?;
    o.done()
}
