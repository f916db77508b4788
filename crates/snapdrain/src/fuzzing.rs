//! What every parser of untrusted input must hold for any bytes: the bodies of the fuzz targets.
//!
//! `fuzz/` (cargo-fuzz, libFuzzer) calls each function below from a target of the same name; the unit
//! tests at the end run each over its corpus, the crashes found so far (`fuzz/regressions/`) and a
//! seeded stream of mutated inputs, so CI runs every target for a bounded number of inputs on the normal
//! toolchain. A function returns normally for any input; it panics only when a property is broken, and
//! the panic says which. Pure: no I/O, no clock (a fixed instant stands for "now").

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::duration::{MAX_SPEC_DURATION, parse_go_duration, parse_spec_duration};
use crate::api::policy::MaintenanceWindow;
use crate::cloud::bottlerocket::{self, NodeSettings};

/// A fuzz target's body: returns for any input, panics only on a broken property.
pub type Target = fn(&[u8]);

/// The fuzz targets by name, as `fuzz/Cargo.toml` names its binaries and `fuzz/corpus/` its folders.
pub const TARGETS: &[(&str, Target)] = &[
    ("admission_review", admission_review),
    ("duration", duration),
    ("quantity", quantity),
    ("maintenance_window", maintenance_window),
    ("velero_backup_json", velero_backup_json),
    ("velero_volume_info", velero_volume_info),
    ("credentials_file", credentials_file),
    ("bottlerocket_user_data", bottlerocket_user_data),
    ("bottlerocket_render", bottlerocket_render),
    ("annotations", annotations),
];

/// A fixed "now" (2026-01-01T00:00:00Z) for parsers that compare with the clock.
fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_767_225_600).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

/// Splits `data` at NUL bytes into exactly `N` strings (lossy UTF-8; missing parts are empty).
fn parts<const N: usize>(data: &[u8]) -> [String; N] {
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (slot, piece) in out.iter_mut().zip(data.splitn(N, |b| *b == 0)) {
        *slot = String::from_utf8_lossy(piece).into_owned();
    }
    out
}

/// An AdmissionReview body POSTed to the gate: read without panicking, and every answer the gate can
/// give to what was read is a well-formed review echoing the request's uid.
pub fn admission_review(data: &[u8]) {
    use crate::webhook::review;
    match review::parse(data) {
        Ok(asked) => {
            for answer in [
                review::allow(&asked.request, Some("warning".into())),
                review::hold(&asked.request, "held"),
            ] {
                assert_eq!(
                    answer.body["response"]["uid"].as_str(),
                    Some(asked.request.uid.as_str()),
                    "an answer echoes the request's uid: {}",
                    answer.body
                );
                assert_eq!(answer.body["kind"], "AdmissionReview", "{}", answer.body);
            }
        }
        Err(e) => {
            let answer = review::unreadable(&e);
            assert_eq!(answer.status.as_u16(), 400);
            assert!(
                answer.body["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())
            );
        }
    }
}

/// Durations as written in plans, the policy and the `karpenter.sh/do-not-disrupt` annotation: Go's
/// reader never panics, and the spec reader never returns more than its bound.
pub fn duration(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let go = parse_go_duration(&text);
    match parse_spec_duration(&text) {
        Ok(d) => {
            assert!(d <= MAX_SPEC_DURATION, "{text:?} read as {d:?}");
            assert_eq!(
                go,
                Ok(d),
                "the spec reader agrees with Go's reader on {text:?}"
            );
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    if let Some(d) = crate::api::validate::parse_duration(&text) {
        assert!(d <= MAX_SPEC_DURATION, "{text:?} read as {d:?}");
    }
}

/// Kubernetes quantities in Bottlerocket settings (kube-reserved, eviction thresholds).
pub fn quantity(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = bottlerocket::rules::quantity(&text);
}

/// A maintenance window of the policy: schedule, duration and time zone, evaluated at a fixed instant.
pub fn maintenance_window(data: &[u8]) {
    let [schedule, duration, time_zone] = parts::<3>(data);
    let spec = MaintenanceWindow {
        schedule,
        duration,
        time_zone,
    };
    if let Ok(window) = crate::signals::window::Window::new(&spec) {
        let _ = window.open_at(now());
        let _ = crate::signals::window::open(&[window], now());
    }
}

/// `velero-backup.json` from the bucket.
pub fn velero_backup_json(data: &[u8]) {
    let uid = "0b6c1e8a-1111-2222-3333-444455556666";
    let accepted =
        crate::backup::verify::check_backup_json("backups/b/velero-backup.json", data, uid).is_ok();
    // serde skips fields it does not read without checking their escapes, so a document serde_json
    // would not take whole can still be accepted for the two fields that matter; those are checked.
    if accepted && let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) {
        assert_eq!(doc["metadata"]["uid"], uid, "accepted with another uid");
        assert_eq!(
            doc["status"]["phase"], "Completed",
            "accepted in another phase"
        );
    }
}

/// `<backup>-volumeinfo.json.gz` from the bucket: gzip, then JSON, each bounded.
pub fn velero_volume_info(data: &[u8]) {
    let expected = [("db".to_owned(), "data-pg-0".to_owned())];
    if let Ok(found) =
        crate::backup::verify::check_volume_info("backups/b/b-volumeinfo.json.gz", data, &expected)
    {
        assert_eq!(
            found.len(),
            expected.len(),
            "one result per expected volume"
        );
    }
}

/// An AWS credentials file from a Secret in the Velero namespace: static keys or a refusal.
pub fn credentials_file(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(keys) = crate::backup::credentials_file::static_keys(&text, "default") {
        assert!(
            !keys.access_key_id.is_empty() && !keys.secret_access_key.is_empty(),
            "accepted without keys: {text:?}"
        );
    }
}

/// User data of a replaced instance (what Karpenter or a node group wrote), read for its cluster
/// settings: plain or gzip TOML, or an error.
pub fn bottlerocket_user_data(data: &[u8]) {
    let _ = bottlerocket::validate_bytes(data);
    let _ = bottlerocket::cluster_settings(data);
}

/// Settings from a plan rendered to Bottlerocket TOML: whatever `render` returns, Bottlerocket's rules
/// accept and the cluster settings read back unchanged.
pub fn bottlerocket_render(data: &[u8]) {
    let [
        cluster_name,
        api_server,
        ca,
        label_key,
        label_value,
        taint,
        sysctl_key,
        sysctl_value,
    ] = parts::<8>(data);
    let settings = NodeSettings {
        cluster_name: cluster_name.clone(),
        api_server: api_server.clone(),
        cluster_certificate: ca,
        cluster_dns_ip: None,
        max_pods: None,
        node_labels: BTreeMap::from([(label_key.clone(), label_value)]),
        node_taints: BTreeMap::from([(label_key, vec![taint])]),
        sysctls: BTreeMap::from([(sysctl_key, sysctl_value)]),
        extra: Default::default(),
    };
    if let Ok(toml) = bottlerocket::render(&settings) {
        if let Err(e) = bottlerocket::validate(&toml) {
            panic!("rendered user data fails validation: {e}\n{toml}");
        }
        let read = bottlerocket::cluster_settings(toml.as_bytes())
            .unwrap_or_else(|e| panic!("rendered user data cannot be read back: {e}\n{toml}"));
        assert_eq!(read.cluster_name.as_deref(), Some(cluster_name.as_str()));
        assert_eq!(read.api_server.as_deref(), Some(api_server.as_str()));
    }
}

/// Annotations a tenant writes on a pod: `karpenter.sh/do-not-disrupt` (a Go duration or "true") and
/// snapdrain's own hold marks, read for the hold state and the patches that change it.
pub fn annotations(data: &[u8]) {
    use crate::planning::holds;
    let [do_not_disrupt, held, safe_to_evict] = parts::<3>(data);
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            annotations: Some(BTreeMap::from([
                ("karpenter.sh/do-not-disrupt".to_owned(), do_not_disrupt),
                ("snapdrain.io/held".to_owned(), held),
                (
                    "cluster-autoscaler.kubernetes.io/safe-to-evict".to_owned(),
                    safe_to_evict,
                ),
            ])),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = crate::planning::inventory::do_not_disrupt_active(&pod, now());
    let _ = holds::state(&pod);
    let _ = holds::own_do_not_disrupt(&pod);
    for ca in [
        crate::api::policy::ClusterAutoscalerHold::Gate,
        crate::api::policy::ClusterAutoscalerHold::SafeToEvictFalse,
    ] {
        let _ = holds::place(&pod, ca);
        let _ = holds::restore(&pod, ca);
    }
    let _ = holds::release(&pod, "plan");
    let _ = holds::remove(&pod);
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::TARGETS;

    /// Mutated inputs per target in the smoke run (a few seconds in all on a debug build).
    const MUTATIONS: usize = 3_000;

    fn fuzz_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
    }

    fn files(dir: &Path) -> Vec<Vec<u8>> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        paths.sort();
        paths
            .iter()
            .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
            .collect()
    }

    /// One of a few byte-level changes libFuzzer also makes: flip, insert, delete, splice, repeat.
    fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
        let mut out = seeds[rng.random_range(0..seeds.len())].clone();
        for _ in 0..rng.random_range(1..=4) {
            let at = rng.random_range(0..=out.len());
            match rng.random_range(0..6) {
                0 if !out.is_empty() => {
                    let i = at.min(out.len() - 1);
                    out[i] ^= 1 << rng.random_range(0..8);
                }
                1 => out.insert(at, rng.random()),
                2 if at < out.len() => {
                    out.remove(at);
                }
                3 => {
                    let other = &seeds[rng.random_range(0..seeds.len())];
                    let from = rng.random_range(0..=other.len());
                    out.splice(at..at, other[from..].iter().copied().take(64));
                }
                4 => {
                    let interesting: &[&[u8]] = &[
                        b"\0",
                        b"9999999999999999h",
                        b"\xff\xfe",
                        b"[",
                        b"{",
                        b"\"",
                        b"=",
                        b"\n",
                        b"-1",
                        b"1e309",
                        b"\x1f\x8b",
                    ];
                    out.splice(
                        at..at,
                        interesting[rng.random_range(0..interesting.len())].to_vec(),
                    );
                }
                _ => {
                    let end = (at + rng.random_range(1..16)).min(out.len());
                    let piece = out[at..end].to_vec();
                    for _ in 0..rng.random_range(1..64) {
                        out.splice(at..at, piece.iter().copied());
                    }
                }
            }
        }
        out
    }

    /// Every target over its corpus, its regressions and seeded mutations of both. A panic names the
    /// target and the input, so it can be added to `fuzz/regressions/<target>/`.
    #[test]
    fn every_fuzz_target_holds_on_its_corpus_and_seeded_mutations() {
        for (i, (name, target)) in TARGETS.iter().enumerate() {
            let mut seeds = files(&fuzz_dir().join("corpus").join(name));
            assert!(!seeds.is_empty(), "fuzz/corpus/{name}/ has no seed input");
            seeds.extend(files(&fuzz_dir().join("regressions").join(name)));
            let mut rng = StdRng::seed_from_u64(0x5eed ^ i as u64);
            let inputs = seeds
                .clone()
                .into_iter()
                .chain((0..MUTATIONS).map(|_| mutate(&mut rng, &seeds)));
            for input in inputs {
                let outcome = std::panic::catch_unwind(|| target(&input));
                assert!(
                    outcome.is_ok(),
                    "fuzz target {name} panicked on {:?}",
                    String::from_utf8_lossy(&input)
                );
            }
        }
    }

    #[test]
    fn every_target_has_a_binary_in_the_fuzz_crate() {
        let manifest =
            std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
        for (name, _) in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{name}\"")),
                "fuzz/Cargo.toml has no [[bin]] {name}"
            );
            assert!(
                fuzz_dir().join(format!("fuzz_targets/{name}.rs")).exists(),
                "fuzz/fuzz_targets/{name}.rs is missing"
            );
        }
    }
}
