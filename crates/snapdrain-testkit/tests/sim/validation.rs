//! Validation as kube-apiserver does it, through real kubectl (v1.32), kube-rs and raw HTTP:
//! custom resources against their CRD's OpenAPI v3 schema (apiextensions-apiserver
//! `pkg/apiserver/validation/validation.go`, `schema/pruning`, `schema/defaulting`), and
//! `fieldValidation` Strict / Warn / Ignore for unknown and duplicate fields of every kind
//! (k8s.io/apiserver `pkg/endpoints/handlers/create.go`, apimachinery `pkg/runtime/serializer/json`).

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use serde_json::{Value, json};
use snapdrain_testkit::{Kubectl, raw_client, start_cluster};

/// A CRD the simulated world serves, as shipped upstream (Velero v1.18.2, Karpenter v1.14.1).
fn upstream_crd(file: &str) -> String {
    format!(
        "{}/../snapdrain-sim/src/scenario/crds/{file}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn nodepool(name: &str, disruption: Value) -> Value {
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
        "spec": {"disruption": disruption, "template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": []}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodepool_schema_refuses_bad_budgets_defaults_and_prunes_like_kube_apiserver() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    k.ok(&["apply", "-f", &upstream_crd("karpenter.sh_nodepools.yaml")])
        .await;

    // Karpenter's schema: budgets[].nodes has a pattern, budgets[].reasons an enum, consolidateAfter
    // is required in spec.disruption.
    let bad = nodepool(
        "bad",
        json!({"budgets": [{"nodes": "lots", "reasons": ["Sometimes"]}]}),
    );
    let bad = k.file("bad.json", &bad.to_string());
    let err = k.fails(&["create", "-f", &bad]).await;
    for want in [
        "The NodePool \"bad\" is invalid",
        "spec.disruption.budgets[0].nodes: Invalid value: \"lots\": spec.disruption.budgets[0].nodes in body should match '^((100|[0-9]{1,2})%|[0-9]+)$'",
        "spec.disruption.budgets[0].reasons[0]: Unsupported value: \"Sometimes\": supported values: \"Underutilized\", \"Empty\", \"Drifted\"",
        "spec.disruption.consolidateAfter: Required value",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    let wrong_type = nodepool("typed", json!({"consolidateAfter": 30}));
    let wrong_type = k.file("typed.json", &wrong_type.to_string());
    let err = k.fails(&["create", "-f", &wrong_type]).await;
    assert!(
        err.contains("spec.disruption.consolidateAfter: Invalid value: \"integer\": spec.disruption.consolidateAfter in body must be of type string: \"integer\""),
        "{err}"
    );

    // Defaults from the schema fill what was left out, nested ones included.
    let good = nodepool("good", json!({"consolidateAfter": "30s"}));
    let good = k.file("good.json", &good.to_string());
    k.ok(&["create", "-f", &good]).await;
    let stored = k.json(&["get", "nodepool", "good"]).await;
    assert_eq!(
        stored["spec"]["disruption"]["budgets"],
        json!([{"nodes": "10%"}])
    );
    assert_eq!(
        stored["spec"]["disruption"]["consolidationPolicy"],
        "WhenEmptyOrUnderutilized"
    );
    assert_eq!(stored["spec"]["template"]["spec"]["expireAfter"], "720h");

    // Unknown fields: refused under Strict (kubectl's default), warned about under Warn, and pruned
    // from what is stored whenever the write goes through.
    let mut extra = nodepool("extra", json!({"consolidateAfter": "30s", "typo": 1}));
    extra["spec"]["bogus"] = json!(true);
    let extra = k.file("extra.json", &extra.to_string());
    let err = k.fails(&["create", "-f", &extra]).await;
    assert!(
        err.contains("strict decoding error: unknown field \"spec.bogus\", unknown field \"spec.disruption.typo\""),
        "{err}"
    );
    let out = k.run(&["create", "--validate=warn", "-f", &extra]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: unknown field \"spec.bogus\""),
        "{stderr}"
    );
    let stored = k.json(&["get", "nodepool", "extra"]).await;
    assert!(stored["spec"].get("bogus").is_none(), "{stored}");
    assert!(
        stored["spec"]["disruption"].get("typo").is_none(),
        "{stored}"
    );

    // A valid update through kube-rs' PUT path is checked too (the status is the server's).
    let client = snapdrain_testkit::client(&cluster);
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        client,
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"),
            "nodepools",
        ),
    );
    let mut current = api.get("good").await.expect("nodepool good");
    current.data["spec"]["disruption"]["budgets"] = json!([{"nodes": "110%"}]);
    let err = api
        .replace("good", &Default::default(), &current)
        .await
        .expect_err("a budget of 110% is refused by the pattern");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}");
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    let causes = status.details.expect("details with causes").causes;
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!(causes[0].field, "spec.disruption.budgets[0].nodes");
    assert_eq!(causes[0].reason, "FieldValueInvalid");
}

/// One raw POST of `body` with `?fieldValidation=<directive>` (none when empty): status, warnings, body.
async fn post_configmap(
    cluster: &snapdrain_sim::SimCluster,
    directive: &str,
    body: &str,
) -> (u16, Vec<String>, Value) {
    let url = cluster.url();
    let query = if directive.is_empty() {
        String::new()
    } else {
        format!("?fieldValidation={directive}")
    };
    let resp = raw_client(cluster.ca_pem())
        .post(format!("{url}/api/v1/namespaces/default/configmaps{query}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("the simulator answers");
    let code = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap_or("").to_string())
        .collect();
    let body = resp.json().await.expect("a JSON body");
    (code, warnings, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_validation_reports_unknown_and_duplicate_fields_of_built_in_kinds() {
    let cluster = start_cluster().await;
    // serde_json would keep only the last "data"; the strict decoder sees both.
    let body = |name: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","bogus":1}},"data":{{"k":"v"}},"data":{{"k":"w"}},"extra":true}}"#
        )
    };
    let (code, _, status) = post_configmap(&cluster, "Strict", &body("strict")).await;
    assert_eq!(code, 400, "{status}");
    let message = status["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with(
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: duplicate field \"data\", "
        ) && message.contains("unknown field \"metadata.bogus\"")
            && message.contains("unknown field \"extra\""),
        "{message}"
    );

    for directive in ["Warn", ""] {
        let name = format!("warn{}", directive.to_lowercase());
        let (code, warnings, _) = post_configmap(&cluster, directive, &body(&name)).await;
        assert_eq!(code, 201);
        for want in [
            r#"299 - "duplicate field \"data\"""#,
            r#"299 - "unknown field \"metadata.bogus\"""#,
            r#"299 - "unknown field \"extra\"""#,
        ] {
            assert!(
                warnings.iter().any(|w| w == want),
                "{want} not in {warnings:?}"
            );
        }
    }
    let (code, warnings, created) = post_configmap(&cluster, "Ignore", &body("ignore")).await;
    assert_eq!((code, warnings.len()), (201, 0), "{warnings:?}");
    assert_eq!(created["data"]["k"], "w");
    let (code, _, status) = post_configmap(&cluster, "Loud", &body("loud")).await;
    assert_eq!(code, 400, "{status}");

    // kubectl sends Strict by default: an unknown pod field is refused, `--validate=warn` warns.
    let k = Kubectl::new(&cluster);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "Always", "typo": 1}]}});
    let pod = k.file("pod.json", &pod.to_string());
    let err = k.fails(&["create", "-f", &pod]).await;
    assert!(
        err.contains("strict decoding error: unknown field \"spec.containers[0].typo\""),
        "{err}"
    );
    let out = k.run(&["create", "--validate=warn", "-f", &pod]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: unknown field \"spec.containers[0].typo\""),
        "{stderr}"
    );
}

/// `spec` of a NodeClaim that passes Karpenter's schema.
fn nodeclaim(name: &str, expire: &str) -> String {
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name},
        "spec": {"expireAfter": expire,
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_rules_of_upstream_and_snapdrain_crds_refuse_what_the_real_server_refuses() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    // Every rule of the real CRDs compiles here, or the CRDs would be refused (`cel/crd.rs`).
    for crd in [
        "karpenter.sh_nodepools.yaml",
        "karpenter.sh_nodeclaims.yaml",
        "karpenter.k8s.aws_ec2nodeclasses.yaml",
        "velero.io_backups.yaml",
        "velero.io_schedules.yaml",
    ] {
        k.ok(&["apply", "-f", &upstream_crd(crd)]).await;
    }
    let own = |f: &str| format!("{}/../../crds/{f}", env!("CARGO_MANIFEST_DIR"));
    k.ok(&["apply", "-f", &own("disruptionplan.yaml")]).await;
    k.ok(&["apply", "-f", &own("disruptionpolicy.yaml")]).await;

    // NodePool: `self.all(x, has(x.schedule) == has(x.duration))` on budgets.
    let scheduled = nodepool(
        "scheduled",
        json!({"consolidateAfter": "30s", "budgets": [{"nodes": "1", "schedule": "@daily"}]}),
    );
    let scheduled = k.file("scheduled.json", &scheduled.to_string());
    let err = k.fails(&["create", "-f", &scheduled]).await;
    assert!(
        err.contains(
            "spec.disruption.budgets: Invalid value: 'schedule' must be set with 'duration'"
        ),
        "{err}"
    );
    // NodePool requirements: a key in karpenter.sh's domain that Karpenter does not allow, with
    // `find()` from the Kubernetes regex library.
    let mut restricted = nodepool("restricted", json!({"consolidateAfter": "30s"}));
    restricted["spec"]["template"]["spec"]["requirements"] =
        json!([{"key": "karpenter.sh/custom", "operator": "Exists"}]);
    let restricted = k.file("restricted.json", &restricted.to_string());
    let err = k.fails(&["create", "-f", &restricted]).await;
    assert!(
        err.contains(
            "spec.template.spec.requirements[0].key: Invalid value: \"karpenter.sh/custom\""
        ),
        "{err}"
    );

    // NodeClaim: `self == oldSelf` on spec, a transition rule: creating passes, changing refuses,
    // metadata changes pass.
    let claim = k.file("claim.json", &nodeclaim("claim", "720h"));
    k.ok(&["create", "-f", &claim]).await;
    let err = k
        .fails(&[
            "patch",
            "nodeclaim",
            "claim",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"expireAfter":"1h"}}"#,
        ])
        .await;
    assert!(
        err.contains("spec: Invalid value: spec is immutable"),
        "{err}"
    );
    k.ok(&["label", "nodeclaim", "claim", "team=db"]).await;

    // snapdrain's own DisruptionPlan: schema enums and its immutable node list.
    let plan = |policy: &str, nodes: &[&str]| {
        json!({"apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodes": nodes, "backup": {"policy": policy}}})
        .to_string()
    };
    let bad_plan = k.file("bad-plan.json", &plan("sometimes", &["node-a"]));
    let err = k.fails(&["create", "-f", &bad_plan]).await;
    assert!(
        err.contains("spec.backup.policy: Unsupported value: \"sometimes\": supported values: \"required\", \"best-effort\", \"skip\""),
        "{err}"
    );
    // `spec.nodes` is `x-kubernetes-list-type: set` (listtype/validation.go).
    let twice = k.file("twice.json", &plan("required", &["node-a", "node-a"]));
    let err = k.fails(&["create", "-f", &twice]).await;
    assert!(
        err.contains("spec.nodes[1]: Duplicate value: \"node-a\""),
        "{err}"
    );
    let good_plan = k.file("plan.json", &plan("required", &["node-a"]));
    k.ok(&["create", "-f", &good_plan]).await;
    let err = k
        .fails(&[
            "patch",
            "disruptionplan",
            "p",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"nodes":["node-b"]}}"#,
        ])
        .await;
    assert!(
        err.contains(
            "spec.nodes: Invalid value: spec.nodes is immutable; create a new DisruptionPlan"
        ),
        "{err}"
    );

    // A rule calling a function the simulator lacks is refused when the CRD is written.
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.snapdrain.io"},
        "spec": {"group": "test.snapdrain.io", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object",
                    "properties": {"version": {"type": "string"}},
                    "x-kubernetes-validations": [{"rule": "isSemver(self.version)"}]}}}}}]}});
    let crd = k.file("widget-crd.json", &crd.to_string());
    let err = k.fails(&["create", "-f", &crd]).await;
    assert!(
        err.contains("x-kubernetes-validations[0].rule")
            && err.contains("does not implement CEL function(s) isSemver"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_can_i_answers_as_rbac_decides_for_a_service_account_token() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    let rbac = json!([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "runner", "namespace": "apps"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "evict", "namespace": "apps"},
            "rules": [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["db-0"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "evict", "namespace": "apps"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "evict"},
            "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": "apps"}]}]);
    for (i, doc) in rbac.as_array().into_iter().flatten().enumerate() {
        let file = k.file(&format!("rbac-{i}.json"), &doc.to_string());
        k.ok(&["apply", "-f", &file]).await;
    }
    let token: Value = raw_client(cluster.ca_pem())
        .post(format!(
            "{}/api/v1/namespaces/apps/serviceaccounts/runner/token",
            cluster.url()
        ))
        .header("content-type", "application/json")
        .body(r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}"#)
        .send()
        .await
        .expect("TokenRequest answered")
        .json()
        .await
        .expect("a TokenRequest");
    let token = token["status"]["token"]
        .as_str()
        .expect("a token")
        .to_string();

    // What `kubectl auth can-i` sends (kubectl `pkg/cmd/auth/cani.go`), here as JSON through kube-rs:
    // kubectl 1.32 sends this one as protobuf, which the simulator does not decode yet.
    let mut config = cluster.kube_config();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.clone().into()),
        ..Default::default()
    };
    let sa = kube::Client::try_from(config).expect("a client with the ServiceAccount token");
    let reviews: kube::Api<SelfSubjectAccessReview> = kube::Api::all(sa.clone());
    let can_i = |verb: &str, resource: &str, sub: Option<&str>, ns: &str, name: Option<&str>| {
        let review: SelfSubjectAccessReview = serde_json::from_value(json!({
            "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "subresource": sub,
                "namespace": ns, "name": name}}}))
        .expect("a review");
        let reviews = reviews.clone();
        async move {
            let answer = reviews
                .create(&Default::default(), &review)
                .await
                .expect("the review is answered");
            answer.status.expect("a status").allowed
        }
    };
    assert!(can_i("create", "pods", Some("eviction"), "apps", None).await);
    assert!(!can_i("create", "pods", Some("eviction"), "default", None).await);
    assert!(!can_i("delete", "pods", None, "apps", None).await);
    assert!(can_i("get", "pods", None, "apps", Some("db-0")).await);
    assert!(!can_i("get", "pods", None, "apps", Some("db-1")).await);
    let metrics: SelfSubjectAccessReview = serde_json::from_value(
        json!({"spec": {"nonResourceAttributes": {"verb": "get", "path": "/metrics"}}}),
    )
    .expect("a review");
    let answer = reviews
        .create(&Default::default(), &metrics)
        .await
        .expect("answered");
    assert!(!answer.status.expect("a status").allowed);
    // Asking neither is a 422 as upstream validation gives it.
    let empty: SelfSubjectAccessReview =
        serde_json::from_value(json!({"spec": {}})).expect("a review");
    let err = reviews
        .create(&Default::default(), &empty)
        .await
        .expect_err("invalid");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("exactly one of")),
        "{err:?}"
    );
    // The kubeconfig's own user is cluster-admin.
    let admin: kube::Api<SelfSubjectAccessReview> =
        kube::Api::all(snapdrain_testkit::client(&cluster));
    let review: SelfSubjectAccessReview = serde_json::from_value(
        json!({"spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}}}),
    )
    .expect("a review");
    let answer = admin
        .create(&Default::default(), &review)
        .await
        .expect("answered");
    assert!(answer.status.expect("a status").allowed);
}
