//! The committed CRDs must match the Rust types. Regenerate with
//! `snapdrain crds --only plan > crds/disruptionplan.yaml`, `snapdrain crds --only policy >
//! crds/disruptionpolicy.yaml` (or `SNAPDRAIN_UPDATE_CRDS=1 cargo test --test e2e crds`).

use std::path::PathBuf;

use serde_json::Value;

use snapdrain::api::{DisruptionPlan, DisruptionPlanSpec, crd_yaml, policy_crd_yaml};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds/disruptionplan.yaml")
}

#[test]
fn committed_crds_are_up_to_date() {
    for (file, kind, generated) in [
        ("disruptionplan.yaml", "plan", crd_yaml()),
        ("disruptionpolicy.yaml", "policy", policy_crd_yaml()),
    ] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("crds")
            .join(file);
        if std::env::var_os("SNAPDRAIN_UPDATE_CRDS").is_some() {
            std::fs::write(&path, &generated).expect("write the CRD file");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "crds/{file} is stale: it differs from the CRD generated from src/api. Run \
             `snapdrain crds --only {kind} > crds/{file}` (or `SNAPDRAIN_UPDATE_CRDS=1 cargo test --test e2e crds`), \
             copy it to deploy/helm/snapdrain/crds/ and commit the result."
        );
    }
}

#[test]
fn committed_crd_carries_cel_rules_printer_columns_and_status() {
    let committed =
        std::fs::read_to_string(committed_path()).expect("crds/disruptionplan.yaml exists");
    let crd: serde_json::Value = serde_saphyr::from_str(&committed).expect("CRD is YAML");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "dplan");
    assert_eq!(crd["spec"]["names"]["categories"][0], "snapdrain");
    assert!(
        version["subresources"]["status"].is_object(),
        "status subresource missing"
    );

    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for name in ["Phase", "Nodes", "Backups", "Age"] {
        assert!(
            columns.contains(&name),
            "printer column {name} missing: {columns:?}"
        );
    }

    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let rules = |v: &serde_json::Value| -> Vec<String> {
        v["x-kubernetes-validations"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|r| r["rule"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(rules(spec).contains(&"has(self.nodes) != has(self.nodeSelector)".to_owned()));
    let props = &spec["properties"];
    assert!(
        rules(&props["replacement"])
            .iter()
            .any(|r| r.contains("instanceTypes"))
    );
    assert!(
        rules(&props["replacement"]["properties"]["launchTemplate"])
            .iter()
            .any(|r| r.contains("self.id"))
    );
    assert_eq!(props["nodes"]["minItems"], 1);
    assert!(props["nodes"]["items"]["pattern"].is_string());
    assert_eq!(
        props["drain"]["properties"]["maxConcurrentEvictions"]["minimum"],
        1.0
    );
    assert_eq!(
        props["backup"]["properties"]["maxAttempts"]["maximum"],
        10.0
    );
    assert!(
        props["backup"]["properties"]["ttl"]["pattern"]
            .as_str()
            .is_some_and(|p| p.contains("ms|s|m|h"))
    );
    assert_eq!(
        props["replacement"]["properties"]["bottlerocket"]["properties"]["settings"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    // A default on `nodes` would make every nodeSelector plan fail the exactly-one rule.
    assert!(props["nodes"].get("default").is_none());
}

#[test]
fn minimal_plan_deserializes_with_defaults() {
    let plan: DisruptionPlan = serde_saphyr::from_str(
        "apiVersion: snapdrain.io/v1alpha1\nkind: DisruptionPlan\nmetadata: {name: p}\nspec: {nodes: [n1]}\n",
    )
    .expect("minimal plan parses");
    let spec: &DisruptionPlanSpec = &plan.spec;
    assert_eq!(spec.nodes, ["n1"]);
    assert_eq!(spec.mode, snapdrain::api::PlanMode::Execute);
    assert_eq!(spec.backup.policy, snapdrain::api::BackupPolicy::Required);
    assert_eq!(
        spec.backup.storage_location, None,
        "Velero picks the BSL marked default"
    );
    assert_eq!(spec.backup.velero_namespace, "velero");
    assert_eq!(spec.backup.method, snapdrain::api::BackupMethod::Auto);
    assert!(spec.backup.snapshot_move_data);
    assert_eq!(spec.backup.max_attempts, 3);
    assert_eq!(spec.drain.max_concurrent_evictions, 10);
    assert!(spec.drain.ignore_daemon_sets);
    assert!(!spec.drain.delete_empty_dir_data);
    assert!(spec.termination.terminate_instance && spec.termination.delete_node);
    assert!(spec.replacement.is_none());
    assert!(!spec.dry_run);
    assert!(plan.status.is_none());
    assert!(snapdrain::api::validate(spec).is_ok());
}

/// `kubectl create -f` and `kubectl apply -f` of a plan, as a user types them: kubectl sends
/// `fieldValidation=Strict`, and kube-apiserver always knows apiVersion, kind and metadata, so only a
/// misspelt spec field is refused, with the server's strict decoding message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_creates_and_applies_a_plan_and_refuses_a_misspelt_field() {
    let h = snapdrain_testkit::harness::Harness::start().await;
    let kubectl = snapdrain_testkit::kubectl::Kubectl::new(&h.cluster);
    let plan = |name: &str, extra: &str| {
        format!(
            "apiVersion: snapdrain.io/v1alpha1\nkind: DisruptionPlan\nmetadata:\n  name: {name}\nspec:\n  nodes: [n-1]\n  dryRun: true\n{extra}"
        )
    };
    let created = kubectl.file("created.yaml", &plan("by-create", ""));
    kubectl.ok(&["create", "-f", &created]).await;
    let applied = kubectl.file("applied.yaml", &plan("by-apply", ""));
    kubectl.ok(&["apply", "-f", &applied]).await;
    kubectl.ok(&["apply", "-f", &applied]).await;
    let misspelt = kubectl.file("misspelt.yaml", &plan("misspelt", "  nodez: [n-2]\n"));
    let err = kubectl.fails(&["create", "-f", &misspelt]).await;
    assert!(
        err.contains("strict decoding error: unknown field \"spec.nodez\""),
        "{err}"
    );
    assert!(
        !err.contains("apiVersion") && !err.contains("\"kind\""),
        "{err}"
    );
}

/// A CRD upgrade keeps what exists: plans and the policy written under the previous schema (here: the
/// policy CRD without `notifications`, as before it was added) survive `kubectl apply` of the committed
/// CRDs unchanged, the new field is accepted afterwards (it was pruned before, as kube-apiserver prunes
/// unknown fields), and a controller started after the upgrade runs the old plan to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crd_upgrade_keeps_existing_plans_and_policies() {
    let h = snapdrain_testkit::harness::Harness::start().await;
    let kubectl = snapdrain_testkit::kubectl::Kubectl::new(&h.cluster);
    let current = std::fs::read_to_string(root().join("crds/disruptionpolicy.yaml"))
        .expect("the committed policy CRD");
    let mut previous: Value = serde_saphyr::from_str(&current).expect("YAML");
    let props = previous
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties")
        .and_then(Value::as_object_mut)
        .expect("the policy spec's properties");
    assert!(props.remove("notifications").is_some());
    let previous = kubectl.file(
        "previous-policy-crd.yaml",
        &serde_json::to_string(&previous).expect("JSON is YAML"),
    );
    kubectl.ok(&["apply", "-f", &previous]).await;
    let objects = kubectl.file(
        "objects.yaml",
        "apiVersion: snapdrain.io/v1alpha1\nkind: DisruptionPolicy\nmetadata: {name: default}\nspec:\n  releaseWindow: 7m\n  notifications: {webhook: {url: \"http://127.0.0.1:9/hook\", allowInsecureHttp: true, allowPrivateAddresses: true}}\n---\napiVersion: snapdrain.io/v1alpha1\nkind: DisruptionPlan\nmetadata: {name: before-upgrade}\nspec:\n  nodes: [no-such-node]\n  dryRun: true\n",
    );
    // Under the previous schema the unknown field is dropped (kubectl warns), the rest is stored.
    kubectl
        .ok(&["apply", "--validate=false", "-f", &objects])
        .await;
    let before = kubectl
        .json(&["get", "disruptionpolicy", "default", "-o", "json"])
        .await;
    assert_eq!(before["spec"]["releaseWindow"], "7m");
    assert!(before["spec"].get("notifications").is_none(), "{before}");
    let plan_before = kubectl
        .json(&["get", "disruptionplan", "before-upgrade", "-o", "json"])
        .await;

    kubectl
        .ok(&["apply", "-f", &root().join("crds").display().to_string()])
        .await;
    let after = kubectl
        .json(&["get", "disruptionpolicy", "default", "-o", "json"])
        .await;
    assert_eq!(
        after["spec"], before["spec"],
        "the upgrade changed no stored policy"
    );
    let plan_after = kubectl
        .json(&["get", "disruptionplan", "before-upgrade", "-o", "json"])
        .await;
    assert_eq!(plan_after["spec"], plan_before["spec"]);
    kubectl.ok(&["apply", "-f", &objects]).await;
    let updated = kubectl
        .json(&["get", "disruptionpolicy", "default", "-o", "json"])
        .await;
    assert_eq!(
        updated["spec"]["notifications"]["webhook"]["url"], "http://127.0.0.1:9/hook",
        "the new field is kept once the CRD knows it"
    );
    let _controller = h.controller().await;
    let done = h
        .wait_plan_until("before-upgrade", snapdrain_testkit::harness::TIMEOUT, |p| {
            p.status.is_some()
        })
        .await;
    assert!(
        done.status.is_some(),
        "the old plan is reconciled after the upgrade"
    );
}
