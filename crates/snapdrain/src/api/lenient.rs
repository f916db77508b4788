//! One object of a list or watch, decoded on its own: a plan that snapdrain cannot read must not stop
//! it from reading every other plan.
//!
//! kube-client decodes a whole LIST response (or watch line) with serde_json, whose recursion limit is
//! 128 levels. The API server stores much deeper JSON under `x-kubernetes-preserve-unknown-fields`
//! (a plan's Bottlerocket `settings`): it decodes with sigs.k8s.io/json, a fork of Go's encoding/json,
//! whose scanner allows 10,000 levels (`maxNestingDepth` in `encoding/json/scanner.go`), and it stores objects written before a schema change that the
//! current types refuse. Without this wrapper one such object fails the LIST, the watcher never syncs,
//! no plan is reconciled and the gate answers 500 for every eviction (security review H-1).
//!
//! `Lenient<K>` is what the list and watch decode instead of `K`: the item is first taken as raw JSON
//! (serde_json skips raw values iteratively, without a depth limit), then decoded as `K` on its own. An
//! item that fails keeps its metadata and the decoding error, so the controller can say which object is
//! wrong and what is wrong with it.

use std::borrow::Cow;
use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// An object as listed or watched: decoded, or not decodable.
#[derive(Clone, Debug)]
pub enum Lenient<K> {
    Decoded(K),
    /// Boxed: rare, and much larger than a decoded object's handle.
    Undecodable(Box<Undecodable>),
}

/// An object that did not decode: its metadata (when that much could be read) and why.
#[derive(Clone, Debug)]
pub struct Undecodable {
    pub metadata: ObjectMeta,
    pub error: String,
}

impl<K> Lenient<K> {
    /// The decoded object, if it decoded.
    pub fn decoded(&self) -> Option<&K> {
        match self {
            Self::Decoded(k) => Some(k),
            Self::Undecodable(_) => None,
        }
    }

    /// The decoded object, if it decoded.
    pub fn into_decoded(self) -> Option<K> {
        match self {
            Self::Decoded(k) => Some(k),
            Self::Undecodable(_) => None,
        }
    }
}

/// Only the metadata of an object; every other field is skipped without being decoded.
#[derive(Deserialize)]
struct MetadataOnly {
    #[serde(default)]
    metadata: ObjectMeta,
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
        Ok(match serde_json::from_str::<K>(raw.get()) {
            Ok(k) => Self::Decoded(k),
            Err(e) => Self::Undecodable(Box::new(Undecodable {
                metadata: serde_json::from_str::<MetadataOnly>(raw.get())
                    .map(|m| m.metadata)
                    .unwrap_or_default(),
                error: e.to_string(),
            })),
        })
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Decoded(k) => k.meta(),
            Self::Undecodable(u) => &u.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Decoded(k) => k.meta_mut(),
            Self::Undecodable(u) => &mut u.metadata,
        }
    }
}

/// Objects per page of [`list_decoded`]: kube-apiserver's own default for paging clients (client-go's
/// `pager.defaultPageSize`), so no single response holds every plan ever made.
pub const LIST_PAGE: u32 = 500;

/// Every object of kind `K` that decodes, listed cluster-wide a page at a time; one that does not is
/// left out instead of failing the list.
pub async fn list_decoded<K>(client: &Client) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    each_page(
        &Api::<Lenient<K>>::all(client.clone()),
        Lenient::into_decoded,
    )
    .await
}

/// What `keep` picks of every object `api` lists, read [`LIST_PAGE`] objects at a time (as client-go's
/// pager): only one page and what was kept are ever held, whatever the cluster's size.
pub async fn each_page<K, T>(
    api: &Api<K>,
    mut keep: impl FnMut(K) -> Option<T>,
) -> Result<Vec<T>, kube::Error>
where
    K: Resource + DeserializeOwned + Clone + Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items.into_iter().filter_map(&mut keep));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// A cluster-wide watch (with kube-runtime's default backoff) of the objects of kind `K` that decode,
/// for a reflector of `K`: each object that does not decode goes to `report` instead (see
/// [`decodable`]).
pub fn watch_decoded<K>(
    client: Client,
    stub: fn(ObjectMeta) -> K,
    report: impl Fn(&Undecodable) + Send + 'static,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug + Send + Sync + 'static,
{
    decodable(
        watcher(Api::<Lenient<K>>::all(client), watcher::Config::default()).default_backoff(),
        stub,
        report,
    )
}

/// A watch over [`Lenient`] objects as a watch over the ones that decode, for a reflector of `K`: each
/// object that does not decode goes to `report` instead. A stored object that stops decoding keeps its
/// last decoded version in the reflector (its controller acts on what it last understood, and its
/// writes, guarded by the old resourceVersion, are refused); its deletion still removes it, through
/// `stub`, which makes a `K` from metadata alone for the reflector to look up by name.
fn decodable<K, S>(
    events: S,
    stub: fn(ObjectMeta) -> K,
    report: impl Fn(&Undecodable) + Send + 'static,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<Lenient<K>>, watcher::Error>> + Send,
{
    use futures::StreamExt;
    use watcher::Event;
    events.filter_map(move |r| {
        let kept = match r {
            Err(e) => Some(Err(e)),
            Ok(Event::Init) => Some(Ok(Event::Init)),
            Ok(Event::InitDone) => Some(Ok(Event::InitDone)),
            Ok(Event::InitApply(Lenient::Decoded(k))) => Some(Ok(Event::InitApply(k))),
            Ok(Event::Apply(Lenient::Decoded(k))) => Some(Ok(Event::Apply(k))),
            Ok(Event::Delete(Lenient::Decoded(k))) => Some(Ok(Event::Delete(k))),
            Ok(Event::Delete(Lenient::Undecodable(u))) => Some(Ok(Event::Delete(stub(u.metadata)))),
            Ok(
                Event::InitApply(Lenient::Undecodable(u)) | Event::Apply(Lenient::Undecodable(u)),
            ) => {
                report(&u);
                None
            }
        };
        std::future::ready(kept)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DisruptionPlan;
    use kube::ResourceExt;
    use kube::core::ObjectList;

    fn plan_json(name: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "7"},
            "spec": {"nodes": ["node-a"], "reason": "test"}
        })
    }

    /// A `settings` value nested 200 levels deep: more than serde_json's recursion limit of 128.
    fn too_deep() -> String {
        "[".repeat(200) + &"]".repeat(200)
    }

    #[test]
    fn one_deep_plan_fails_alone_and_the_list_still_decodes() {
        let good = plan_json("good").to_string();
        let deep = plan_json("deep").to_string().replace(
            r#""reason":"test""#,
            &format!(
                r#""reason":"test","replacement":{{"bottlerocket":{{"settings":{{"x":{}}}}}}}"#,
                too_deep()
            ),
        );
        assert!(deep.contains("[[[["), "the fixture nests: {deep}");
        let list = format!(
            r#"{{"apiVersion":"snapdrain.io/v1alpha1","kind":"DisruptionPlanList","metadata":{{"resourceVersion":"9"}},"items":[{good},{deep}]}}"#
        );
        // What kube-client does for a LIST of plain `DisruptionPlan`s: the whole list fails.
        assert!(serde_json::from_str::<ObjectList<DisruptionPlan>>(&list).is_err());

        let list: ObjectList<Lenient<DisruptionPlan>> =
            serde_json::from_str(&list).expect("a lenient list decodes");
        assert_eq!(list.items.len(), 2);
        let good = list.items[0].decoded().expect("the good plan decodes");
        assert_eq!(good.name_any(), "good");
        match &list.items[1] {
            Lenient::Undecodable(u) => {
                assert_eq!(u.metadata.name.as_deref(), Some("deep"));
                assert_eq!(u.metadata.uid.as_deref(), Some("uid-deep"));
                assert!(u.error.contains("recursion limit"), "{}", u.error);
            }
            Lenient::Decoded(_) => panic!("a plan nested past the limit cannot decode"),
        }
        assert_eq!(list.items[1].name_any(), "deep");
    }

    #[test]
    fn a_watch_event_with_a_bad_object_decodes_as_undecodable() {
        let line = format!(
            r#"{{"type":"MODIFIED","object":{}}}"#,
            serde_json::json!({
                "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
                "metadata": {"name": "odd"}, "spec": {"nodes": "not-a-list"}
            })
        );
        let ev: kube::core::WatchEvent<Lenient<DisruptionPlan>> =
            serde_json::from_str(&line).expect("the event decodes");
        match ev {
            kube::core::WatchEvent::Modified(Lenient::Undecodable(u)) => {
                assert_eq!(u.metadata.name.as_deref(), Some("odd"));
            }
            other => panic!("expected an undecodable MODIFIED, got {other:?}"),
        }
    }
}
