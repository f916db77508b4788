//! The ValidatingAdmissionPolicies of the kustomize base (the chart renders the same: kustomize.rs) limit
//! what snapdrain's ServiceAccount may change where RBAC cannot: applied with `kubectl apply -k`, then
//! requests sent with the ServiceAccount's token. The simulated API server evaluates the policies'
//! CEL as kube-apiserver's `plugin/policy/validating` does (sim `admission/policy.rs`); a refusal is
//! its `ValidatingAdmissionPolicy '<p>' with binding '<b>' denied request: <message>`. What snapdrain
//! itself does under them is shown by least_privilege.rs, which runs every flow with the same base.

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use snapdrain_testkit::harness::Harness;
use snapdrain_testkit::kubectl::Kubectl;

use std::path::PathBuf;

/// The base applied, and a client holding only the ServiceAccount's token.
async fn as_the_service_account(h: &Harness) -> Client {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/kustomize/base");
    Kubectl::new(&h.cluster)
        .ok(&["apply", "-k", &base.display().to_string()])
        .await;
    as_service_account(h, "snapdrain").await
}

/// A client holding only the token of ServiceAccount `name` in namespace `snapdrain`.
async fn as_service_account(h: &Harness, name: &str) -> Client {
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": []}})).expect("request");
    let token = Api::<ServiceAccount>::namespaced(h.client.clone(), "snapdrain")
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("a token")
        .token;
    let mut config = h.kube_config();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Client::try_from(config).expect("client")
}

/// The API server's refusal text, or "" when the request went through.
fn refusal<T>(result: Result<T, kube::Error>) -> String {
    match result {
        Ok(_) => String::new(),
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{s:?}");
            s.message
        }
        Err(e) => panic!("not an API refusal: {e}"),
    }
}

fn merge(body: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_account_may_change_only_holds_cordons_and_the_ca_bundle() {
    let h = Harness::start().await;
    let sa = as_the_service_account(&h).await;
    let pp = PatchParams::default();

    // Pods: the hold annotations pass; a label, another annotation or the image are refused.
    let pod = Api::<Pod>::all(h.client.clone())
        .list(&ListParams::default().labels("app=postgres"))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .next()
        .expect("the quickstart runs postgres");
    let pods: Api<Pod> = Api::namespaced(sa.clone(), &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let holds = json!({"metadata": {"annotations": {
        "karpenter.sh/do-not-disrupt": "true",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
        "snapdrain.io/held": "test"}}});
    assert_eq!(refusal(pods.patch(&name, &pp, &merge(holds)).await), "");
    let cases = [
        (
            json!({"metadata": {"labels": {"app": "other"}}}),
            "not its labels",
        ),
        (
            json!({"metadata": {"annotations": {"example.com/x": "1"}}}),
            "annotations of a pod",
        ),
        (
            json!({"spec": {"activeDeadlineSeconds": 5}}),
            "not its spec",
        ),
    ];
    for (body, why) in cases {
        let text = refusal(pods.patch(&name, &pp, &merge(body.clone())).await);
        assert!(
            text.contains("ValidatingAdmissionPolicy 'snapdrain-pod-holds'") && text.contains(why),
            "{body}: {text:?}"
        );
    }
    // The policy binds snapdrain's ServiceAccount only.
    let admin: Api<Pod> = Api::namespaced(h.client.clone(), &pod.namespace().unwrap_or_default());
    admin
        .patch(
            &name,
            &pp,
            &merge(json!({"metadata": {"labels": {"extra": "1"}}})),
        )
        .await
        .expect("another user is not bound by the policy");

    // Nodes: cordon with snapdrain's taint passes; a label or a foreign taint is refused.
    let node = h.node_with_statefulset_pods().await;
    let nodes: Api<Node> = Api::all(sa.clone());
    let current = nodes.get(&node).await.expect("get node");
    let mut taints = current
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: "snapdrain.io/draining".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    let cordon = json!({"spec": {"unschedulable": true, "taints": taints}});
    assert_eq!(refusal(nodes.patch(&node, &pp, &merge(cordon)).await), "");
    // The node-level hold (Karpenter's drift under a terminationGracePeriod honours only that one).
    let hold = json!({"metadata": {"annotations": {
        "karpenter.sh/do-not-disrupt": "true",
        "snapdrain.io/held": "do-not-disrupt"}}});
    assert_eq!(refusal(nodes.patch(&node, &pp, &merge(hold)).await), "");
    let mut foreign = taints.clone();
    foreign.push(k8s_openapi::api::core::v1::Taint {
        key: "example.com/evil".into(),
        effect: "NoExecute".into(),
        ..Default::default()
    });
    for (body, why) in [
        (
            json!({"metadata": {"labels": {"pool": "x"}}}),
            "not change its labels",
        ),
        (
            json!({"metadata": {"annotations": {"example.com/x": "1"}}}),
            "annotations of a node",
        ),
        (
            json!({"spec": {"taints": foreign}}),
            "snapdrain.io/draining:NoSchedule",
        ),
    ] {
        let text = refusal(nodes.patch(&node, &pp, &merge(body.clone())).await);
        assert!(
            text.contains("ValidatingAdmissionPolicy 'snapdrain-node-cordon'")
                && text.contains(why),
            "{body}: {text:?}"
        );
    }

    // Its webhook configuration: the caBundle passes; widening the rules is refused.
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(sa.clone());
    let ca = json!([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Zm9v"}]);
    let ca = Patch::Json::<()>(serde_json::from_value(ca).expect("a JSON patch"));
    assert_eq!(refusal(vwcs.patch("snapdrain", &pp, &ca).await), "");
    let rules =
        json!([{"op": "replace", "path": "/webhooks/0/rules/0/resources", "value": ["secrets"]}]);
    let rules = Patch::Json::<()>(serde_json::from_value(rules).expect("a JSON patch"));
    let text = refusal(vwcs.patch("snapdrain", &pp, &rules).await);
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-webhook-cabundle'")
            && text.contains("only the caBundle"),
        "{text:?}"
    );
}

/// A plan's status is written by snapdrain's ServiceAccount only (review M-2): the gate opens for a
/// protected pod on a running plan's recorded verified backup, and termination acts on the recorded
/// nodes, so a user granted `disruptionplans/status` must not be able to forge either. The admin
/// client here has every RBAC right and is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_snapdrains_service_account_writes_a_plans_status() {
    use snapdrain::api::DisruptionPlan;
    let h = Harness::start().await;
    let sa = as_the_service_account(&h).await;
    let node = h.node_with_statefulset_pods().await;
    // No controller runs: the plan stays as created.
    h.create_plan("forged", json!({"nodes": [node], "dryRun": true}))
        .await;
    let admin: Api<DisruptionPlan> = Api::all(h.client.clone());
    let forged = json!({"status": {"phase": "Draining", "backups": [
        {"namespace": "db", "pvcs": ["data-pg-0"], "verified": true}]}});
    let text = refusal(
        admin
            .patch_status("forged", &PatchParams::default(), &merge(forged.clone()))
            .await,
    );
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-plan-status'")
            && text.contains("only snapdrain's controller writes"),
        "{text:?}"
    );
    let sa_plans: Api<DisruptionPlan> = Api::all(sa);
    let own = json!({"status": {"message": "written by the controller"}});
    assert_eq!(
        refusal(
            sa_plans
                .patch_status("forged", &PatchParams::default(), &merge(own))
                .await
        ),
        ""
    );
}

/// The roles the base ships for people: `snapdrain-plan-viewer` reads plans and the policy and nothing
/// more; `snapdrain-plan-editor` creates plans (manual or api ones: a plan passed off as Karpenter's is
/// refused by the `snapdrain-plan-sources` policy) but cannot change the DisruptionPolicy that bounds
/// what they launch; `snapdrain-policy-admin` can. Each bound with a ClusterRoleBinding, as the README
/// tells (the simulated authorizer evaluates RBAC as kube-apiserver's `rbac` plugin does).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plan_authors_get_what_their_role_grants_and_no_more() {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    use snapdrain::api::{DisruptionPlan, DisruptionPolicy};

    let h = Harness::start().await;
    let snapdrain = as_the_service_account(&h).await;
    let pp = PostParams::default();
    for (user, role) in [
        ("viewer", "snapdrain-plan-viewer"),
        ("editor", "snapdrain-plan-editor"),
        ("platform", "snapdrain-policy-admin"),
    ] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": user, "namespace": "snapdrain"}}))
                .expect("a ServiceAccount");
        Api::<ServiceAccount>::namespaced(h.client.clone(), "snapdrain")
            .create(&pp, &sa)
            .await
            .expect("create the ServiceAccount");
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": user, "namespace": "snapdrain"}]
        }))
        .expect("a binding");
        Api::<ClusterRoleBinding>::all(h.client.clone())
            .create(&pp, &binding)
            .await
            .expect("bind the role");
    }
    let plan = |name: &str, source: &str| -> DisruptionPlan {
        serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name}, "spec": {"nodes": ["no-such-node"], "source": source}
        }))
        .expect("a plan")
    };
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"}, "spec": {"replacement": {"allowFreeForm": true}}
    }))
    .expect("a policy");

    let viewer = as_service_account(&h, "viewer").await;
    Api::<DisruptionPlan>::all(viewer.clone())
        .list(&ListParams::default())
        .await
        .expect("the viewer lists plans");
    let text = refusal(
        Api::<DisruptionPlan>::all(viewer)
            .create(&pp, &plan("by-viewer", "manual"))
            .await,
    );
    assert!(text.contains("cannot create resource"), "{text:?}");

    let editor = as_service_account(&h, "editor").await;
    let plans = Api::<DisruptionPlan>::all(editor.clone());
    assert_eq!(
        refusal(plans.create(&pp, &plan("by-editor", "manual")).await),
        ""
    );
    let text = refusal(plans.create(&pp, &plan("posing", "karpenter")).await);
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-plan-sources'")
            && text.contains("only snapdrain makes plans with spec.source karpenter"),
        "{text:?}"
    );
    // Stopping a plan snapdrain made from a signal is still the editor's to do.
    Api::<DisruptionPlan>::all(snapdrain)
        .create(&pp, &plan("from-karpenter", "karpenter"))
        .await
        .expect("snapdrain makes plans from signals");
    let abort = json!({"metadata": {"annotations": {"snapdrain.io/abort": "true"}}});
    assert_eq!(
        refusal(
            plans
                .patch("from-karpenter", &PatchParams::default(), &merge(abort))
                .await
        ),
        ""
    );
    let text = refusal(
        Api::<DisruptionPolicy>::all(editor)
            .create(&pp, &policy)
            .await,
    );
    assert!(text.contains("cannot create resource"), "{text:?}");

    let platform = as_service_account(&h, "platform").await;
    assert_eq!(
        refusal(
            Api::<DisruptionPolicy>::all(platform)
                .create(&pp, &policy)
                .await
        ),
        ""
    );
}

/// What snapdrain's ServiceAccount may ask of Velero (review H-3), whose server acts as cluster-admin:
/// the Backup, volume policy and DeleteBackupRequest snapdrain's own builders make are admitted; a
/// Backup of every namespace, of named resources or cluster-scoped ones, with hooks of its own or
/// without the plan's labels, the deletion of a Backup it did not make, a DeleteBackupRequest for a
/// Velero Schedule's Backup and a ConfigMap that is not a volume policy are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_account_asks_velero_only_for_its_own_backups() {
    use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind};
    use snapdrain::api::DisruptionPlanSpec;
    use snapdrain::api::volume::{VolumeClass, VolumeMethod, VolumeRecord};
    use snapdrain::planning::backups::{
        BackupNeed, PlannedVolume, build_delete_request, build_velero_backup, build_volume_policy,
    };
    use snapdrain::planning::naming::PlanRef;

    let h = Harness::start().await;
    let sa = as_the_service_account(&h).await;
    let velero = |client: &Client, kind: &str| -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("velero.io", "v1", kind);
        Api::namespaced_with(client.clone(), "velero", &ApiResource::from_gvk(&gvk))
    };
    let object =
        |v: serde_json::Value| -> DynamicObject { serde_json::from_value(v).expect("an object") };
    let pp = PostParams::default();

    // What snapdrain makes: a Backup of one namespace with a volume policy (here a skip policy for EBS
    // volumes an emergency snapshot holds), then the DeleteBackupRequest of an abandoned attempt.
    let spec: DisruptionPlanSpec =
        serde_json::from_value(json!({"nodes": ["n1"]})).expect("a plan spec");
    let plan = PlanRef {
        name: "drain-n1",
        uid: "0b5c1a6e-0000-4000-8000-000000000001",
    };
    let need = BackupNeed {
        namespace: "db".into(),
        stateful_sets: vec!["pg".into()],
        pvcs: vec!["data-pg-0".into()],
        pods: vec!["pg-0".into()],
        volumes: vec![PlannedVolume {
            record: VolumeRecord {
                pvc: "data-pg-0".into(),
                pv: None,
                class: VolumeClass::NodeLocal,
                source: Some("local".into()),
                reason: "a local PV".into(),
                method: VolumeMethod::FileSystem,
                snapshot_class: None,
                release_at: Default::default(),
                snapshot: None,
                size_bytes: None,
                expected_seconds: None,
            },
            auto_method: VolumeMethod::FileSystem,
        }],
        or_label_selectors: Vec::new(),
        reuse: None,
        skip_drivers: vec!["ebs.csi.aws.com".into()],
        hooks: Vec::new(),
    };
    let policy = build_volume_policy(&need, &spec, &plan, 1).expect("a skip policy");
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(sa.clone(), "velero");
    let made = serde_json::from_value(policy.clone()).expect("a ConfigMap");
    assert_eq!(refusal(configmaps.create(&pp, &made).await), "");
    let backup = build_velero_backup(&need, &spec, &plan, 1);
    let backups = velero(&sa, "Backup");
    let created = backups
        .create(&pp, &object(backup.clone()))
        .await
        .expect("snapdrain's own Backup is admitted");
    // Its own Backup, labelled by it, it may delete, directly or through Velero (the request is
    // admitted before Velero looks for the Backup).
    assert_eq!(
        refusal(
            backups
                .delete(&created.name_any(), &DeleteParams::default())
                .await
        ),
        ""
    );
    let request = build_delete_request(
        &created.name_any(),
        created.metadata.uid.as_deref(),
        "velero",
    );
    assert_eq!(
        refusal(
            velero(&sa, "DeleteBackupRequest")
                .create(&pp, &object(request))
                .await
        ),
        ""
    );

    // Backups that read more than one workload's namespace, or run commands, are refused.
    let refused_backups = [
        (
            json!({"includedNamespaces": ["*"]}),
            "exactly one namespace",
        ),
        (
            json!({"includedNamespaces": ["db", "kube-system"]}),
            "exactly one namespace",
        ),
        (
            json!({"includedNamespaces": ["kube-system"]}),
            "snapdrain.io/namespace label names",
        ),
        (
            json!({"includedResources": ["secrets"]}),
            "does not name resources",
        ),
        (
            json!({"includeClusterResources": true}),
            "cluster-scoped resources",
        ),
        (
            json!({"hooks": {"resources": [{"name": "x", "pre": [{"exec": {"command": ["sh", "-c", "id"]}}]}]}}),
            "runs no hooks of its own",
        ),
    ];
    for (i, (change, why)) in refused_backups.into_iter().enumerate() {
        let mut b = backup.clone();
        b["metadata"]["name"] = json!(format!("hostile-{i}"));
        for (k, v) in change.as_object().expect("an object") {
            b["spec"][k] = v.clone();
        }
        let text = refusal(backups.create(&pp, &object(b)).await);
        assert!(
            text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-backups'")
                && text.contains(why),
            "{change}: {text:?}"
        );
    }
    let mut unlabelled = backup.clone();
    unlabelled["metadata"]["name"] = json!("unlabelled");
    unlabelled["metadata"]["labels"] = json!({});
    let text = refusal(backups.create(&pp, &object(unlabelled)).await);
    assert!(text.contains("carry its snapdrain.io/plan"), "{text:?}");

    // A Backup someone else made (here the DR schedule's) is not snapdrain's to delete, directly or
    // through Velero.
    let admin_backups = velero(&h.client, "Backup");
    let theirs = admin_backups
        .create(
            &pp,
            &object(json!({
                "apiVersion": "velero.io/v1", "kind": "Backup",
                "metadata": {"name": "daily-20261204010000", "namespace": "velero",
                             "labels": {"velero.io/schedule-name": "daily"}},
                "spec": {"includedNamespaces": ["db"]}})),
        )
        .await
        .expect("the admin's Backup");
    let text = refusal(
        backups
            .delete(&theirs.name_any(), &DeleteParams::default())
            .await,
    );
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-backups'")
            && text.contains("deletes only the Backups it made"),
        "{text:?}"
    );
    let request =
        build_delete_request(&theirs.name_any(), theirs.metadata.uid.as_deref(), "velero");
    let text = refusal(
        velero(&sa, "DeleteBackupRequest")
            .create(&pp, &object(request))
            .await,
    );
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-deletions'")
            && text.contains("only its own Backups"),
        "{text:?}"
    );

    // A ConfigMap in Velero's namespace that is not a volume policy (Velero reads plugin configuration
    // from ConfigMaps labelled velero.io/plugin-config) is refused.
    let mut plugin = policy.clone();
    plugin["metadata"]["name"] = json!("restore-config");
    plugin["metadata"]["labels"]["velero.io/plugin-config"] = json!("");
    let plugin = serde_json::from_value(plugin).expect("a ConfigMap");
    let text = refusal(configmaps.create(&pp, &plugin).await);
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-volume-policies'")
            && text.contains("no other tool's labels"),
        "{text:?}"
    );
    let mut other = policy;
    other["metadata"]["name"] = json!("other-data");
    other["data"] = json!({"anything": "x"});
    let other = serde_json::from_value(other).expect("a ConfigMap");
    let text = refusal(configmaps.create(&pp, &other).await);
    assert!(
        text.contains("one data key, volume-policy.yaml"),
        "{text:?}"
    );
}

/// The warm-backup Schedules (policy `spec.warmBackups`) are bounded as snapdrain's Backups are, since
/// each run is a Backup Velero makes as cluster-admin: the Schedule snapdrain's own builder makes is
/// admitted, brought back and deleted; a template of every namespace, of another namespace than its
/// label's, of named or cluster-scoped resources, with a resource policy, hooks or labels of its own, a
/// Schedule without snapdrain's labels or with a plan's, and a change to or the deletion of a Schedule it
/// did not make are refused. A DeleteBackupRequest for a warm Schedule's Backup is refused too (its name,
/// `<schedule>-<14 digits>`, never has the shape of snapdrain's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_account_keeps_only_its_own_warm_backup_schedules() {
    use kube::api::DeleteParams;
    use snapdrain::api::velero_schedule::Schedule;
    use snapdrain::planning::backups::build_delete_request;
    use snapdrain::planning::warm;

    let h = Harness::start().await;
    let sa = as_the_service_account(&h).await;
    let pp = PostParams::default();
    let policy: snapdrain::api::DisruptionPolicySpec =
        serde_json::from_value(json!({"warmBackups": {"schedule": "@every 6h"}}))
            .expect("a policy");
    let selector =
        serde_json::from_value(json!({"matchLabels": {"app": "pg"}})).expect("a selector");
    let ours = warm::desired(
        &policy,
        &std::collections::BTreeMap::from([("db".to_owned(), vec![selector])]),
    )
    .pop()
    .expect("one Schedule");
    let schedules: Api<Schedule> = Api::namespaced(sa.clone(), "velero");
    let created = schedules
        .create(&pp, &ours)
        .await
        .expect("snapdrain's own Schedule is admitted");
    // Velero's schedule controller writes the Schedule's status after it is created, so the update is
    // made on the latest copy, again on a 409, as the warm keeper does (guarded by resourceVersion). Read
    // as the admin: the service account may list Schedules, not get one.
    let admin: Api<Schedule> = Api::namespaced(h.client.clone(), "velero");
    let mut attempts = 0;
    let changed = loop {
        attempts += 1;
        let mut latest = admin
            .get(&created.name_any())
            .await
            .expect("the Schedule reads back");
        latest.spec["schedule"] = json!("@every 12h");
        match schedules.replace(&created.name_any(), &pp, &latest).await {
            Ok(s) => break s,
            Err(kube::Error::Api(e)) if e.code == 409 && attempts < 10 => continue,
            Err(e) => panic!("snapdrain brings its own Schedule back to the policy: {e}"),
        }
    };

    let refused = [
        (
            json!({"includedNamespaces": ["*"]}),
            "exactly one namespace",
        ),
        (
            json!({"includedNamespaces": ["db", "kube-system"]}),
            "exactly one namespace",
        ),
        (
            json!({"includedNamespaces": ["kube-system"]}),
            "snapdrain.io/namespace label names",
        ),
        (
            json!({"includedResources": ["secrets"]}),
            "does not name resources",
        ),
        (
            json!({"includeClusterResources": true}),
            "cluster-scoped resources",
        ),
        (
            json!({"resourcePolicy": {"kind": "configmap", "name": "x"}}),
            "resource policy",
        ),
        (
            json!({"hooks": {"resources": [{"name": "x", "pre": [{"exec": {"command": ["sh", "-c", "id"]}}]}]}}),
            "runs no hooks of its own",
        ),
        (
            json!({"metadata": {"labels": {"snapdrain.io/plan": "p"}}}),
            "no Backup labels of its own",
        ),
    ];
    for (i, (change, why)) in refused.into_iter().enumerate() {
        let mut s = ours.clone();
        s.metadata.name = Some(format!("hostile-{i}"));
        for (k, v) in change.as_object().expect("an object") {
            s.spec["template"][k] = v.clone();
        }
        let text = refusal(schedules.create(&pp, &s).await);
        assert!(
            text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-schedules'")
                && text.contains(why),
            "{change}: {text:?}"
        );
        // The same through an update of snapdrain's own Schedule.
        let mut u = changed.clone();
        for (k, v) in change.as_object().expect("an object") {
            u.spec["template"][k] = v.clone();
        }
        let text = refusal(schedules.replace(&created.name_any(), &pp, &u).await);
        assert!(text.contains(why), "update {change}: {text:?}");
    }
    for (labels, why) in [
        (
            json!({"snapdrain.io/namespace": "db"}),
            "snapdrain.io/warm-backup",
        ),
        (
            json!({"snapdrain.io/warm-backup": "true", "snapdrain.io/namespace": "db", "snapdrain.io/plan": "p"}),
            "no plan's label",
        ),
    ] {
        let mut s = ours.clone();
        s.metadata.name = Some("unlabelled".into());
        s.metadata.labels = serde_json::from_value(labels.clone()).expect("labels");
        let text = refusal(schedules.create(&pp, &s).await);
        assert!(text.contains(why), "{labels}: {text:?}");
    }

    // A Schedule someone else made (the DR schedule) is not snapdrain's to change or delete.
    let admin: Api<Schedule> = Api::namespaced(h.client.clone(), "velero");
    let theirs = admin
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "velero.io/v1", "kind": "Schedule",
                "metadata": {"name": "daily", "namespace": "velero"},
                "spec": {"schedule": "@daily", "template": {"includedNamespaces": ["*"]}}}))
            .expect("a Schedule"),
        )
        .await
        .expect("the admin's Schedule");
    let mut taken = theirs.clone();
    taken.metadata.labels = ours.metadata.labels.clone();
    taken.spec["template"]["includedNamespaces"] = json!(["db"]);
    let text = refusal(schedules.replace("daily", &pp, &taken).await);
    assert!(
        text.contains("changes and deletes only the Schedules it made"),
        "{text:?}"
    );
    let text = refusal(schedules.delete("daily", &DeleteParams::default()).await);
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-schedules'")
            && text.contains("changes and deletes only the Schedules it made"),
        "{text:?}"
    );

    // A Backup the warm Schedule made is Velero's: snapdrain may not ask for its deletion.
    let run = format!("{}-20261204010000", created.name_any());
    let text = refusal(
        Api::<kube::api::DynamicObject>::namespaced_with(
            sa.clone(),
            "velero",
            &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                "velero.io",
                "v1",
                "DeleteBackupRequest",
            )),
        )
        .create(
            &pp,
            &serde_json::from_value(build_delete_request(&run, None, "velero")).expect("a request"),
        )
        .await,
    );
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-deletions'"),
        "{text:?}"
    );

    // Its own it deletes.
    assert_eq!(
        refusal(
            schedules
                .delete(&created.name_any(), &DeleteParams::default())
                .await
        ),
        ""
    );
}

/// The ServiceAccount may create Secrets in its namespace (RBAC cannot name one not yet made), but
/// only its eviction gate's TLS Secret (review L-4): a service-account token Secret, which would give
/// it another ServiceAccount's token, or any other Secret is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_account_creates_only_the_gates_tls_secret() {
    use k8s_openapi::api::core::v1::Secret;
    let h = Harness::start().await;
    let sa = as_the_service_account(&h).await;
    let secrets: Api<Secret> = Api::namespaced(sa, "snapdrain");
    let secret = |name: &str, kind: &str, annotations: serde_json::Value| -> Secret {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "snapdrain", "annotations": annotations},
            "type": kind,
            "data": if kind == "kubernetes.io/tls" {
                json!({"tls.crt": "", "tls.key": ""})
            } else {
                json!({})
            }
        }))
        .expect("a Secret")
    };
    let pp = PostParams::default();
    for s in [
        secret(
            "snapdrain-token",
            "kubernetes.io/service-account-token",
            json!({"kubernetes.io/service-account.name": "default"}),
        ),
        secret("other", "kubernetes.io/tls", json!({})),
        secret("snapdrain-webhook-tls", "Opaque", json!({})),
    ] {
        let text = refusal(secrets.create(&pp, &s).await);
        assert!(
            text.contains("ValidatingAdmissionPolicy 'snapdrain-webhook-secret'")
                && text.contains("only its eviction gate's TLS Secret"),
            "{:?}: {text:?}",
            s.metadata.name
        );
    }
    // What the gate's keeper creates (least_privilege.rs runs the keeper itself under the same policy).
    let own = serde_json::from_value(json!({
        "metadata": {"name": "snapdrain-webhook-tls", "namespace": "snapdrain"},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "", "tls.key": ""}
    }))
    .expect("a Secret");
    assert_eq!(refusal(secrets.create(&pp, &own).await), "");
}

/// The one widening of the Backup rules (`snapdrain-velero-backup-hooks`, a policy whose parameter is
/// the DisruptionPolicy `default`): snapdrain's Backup may carry Velero `spec.hooks` only when each is
/// exactly an entry of the policy's `spec.backupHooks` for the Backup's namespace. What snapdrain's own
/// builders make from the policy is admitted; a changed command, another namespace's hook, hooks the
/// policy does not (or no longer) hold, hooks without the label that sends them to the check, and a
/// missing DisruptionPolicy are refused; and snapdrain cannot write hooks into a policy it creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_account_carries_only_the_policys_backup_hooks_for_the_namespace() {
    use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind};
    use snapdrain::api::{DisruptionPlanSpec, DisruptionPolicy, DisruptionPolicySpec};
    use snapdrain::planning::backup_hooks::hooks_for_namespace;
    use snapdrain::planning::backups::{BackupNeed, build_velero_backup};
    use snapdrain::planning::naming::PlanRef;

    let h = Harness::start().await;
    let sa = as_the_service_account(&h).await;
    let hooks_policy = json!({"backupHooks": [
        {"name": "pg-freeze", "namespaces": ["db"], "podSelector": {"matchLabels": {"app": "postgres"}},
         "pre": [{"exec": {"container": "postgres", "command": ["/sbin/fsfreeze", "--freeze", "/var/lib/postgresql"],
                           "onError": "Fail", "timeout": "30s"}}],
         "post": [{"exec": {"container": "postgres", "command": ["/sbin/fsfreeze", "--unfreeze", "/var/lib/postgresql"]}}]},
        {"name": "shop-sync", "namespaces": ["shop"], "pre": [{"exec": {"command": ["/bin/sync"]}}]}
    ]});
    h.set_policy(hooks_policy.clone()).await;
    let policy: DisruptionPolicySpec = serde_json::from_value(hooks_policy).expect("a policy spec");
    let backups = {
        let gvk = GroupVersionKind::gvk("velero.io", "v1", "Backup");
        Api::<DynamicObject>::namespaced_with(sa.clone(), "velero", &ApiResource::from_gvk(&gvk))
    };
    let spec: DisruptionPlanSpec =
        serde_json::from_value(json!({"nodes": ["n1"]})).expect("a plan spec");
    let plan = PlanRef {
        name: "drain-n1",
        uid: "0b5c1a6e-0000-4000-8000-000000000002",
    };
    // snapdrain's own Backup of namespace `ns` at `attempt`, carrying `hooks`.
    let backup = |ns: &str, attempt: u32, hooks| -> serde_json::Value {
        let need = BackupNeed {
            namespace: ns.into(),
            stateful_sets: vec!["pg".into()],
            pvcs: vec!["data-pg-0".into()],
            pods: vec!["pg-0".into()],
            volumes: Vec::new(),
            or_label_selectors: Vec::new(),
            reuse: None,
            skip_drivers: Vec::new(),
            hooks,
        };
        build_velero_backup(&need, &spec, &plan, attempt)
    };
    let create = |body: serde_json::Value| {
        let backups = backups.clone();
        async move {
            let object: DynamicObject = serde_json::from_value(body).expect("an object");
            refusal(backups.create(&PostParams::default(), &object).await)
        }
    };
    let db_hooks = hooks_for_namespace(&policy.backup_hooks, "db");
    assert_eq!(db_hooks.len(), 1, "{db_hooks:?}");
    let admitted = backup("db", 1, db_hooks.clone());
    // Written by hand, not by the builder: what reaches Velero.
    assert_eq!(
        admitted["spec"]["hooks"]["resources"][0]["pre"][0]["exec"]["command"],
        json!(["/sbin/fsfreeze", "--freeze", "/var/lib/postgresql"])
    );
    assert_eq!(create(admitted.clone()).await, "");

    let exact = "must be exactly the DisruptionPolicy default's spec.backupHooks entries";
    let by_name = "carries only hooks the DisruptionPolicy default lists for its namespace";
    let mut changed = backup("db", 2, db_hooks.clone());
    changed["spec"]["hooks"]["resources"][0]["pre"][0]["exec"]["command"] =
        json!(["/bin/sh", "-c", "cat /etc/shadow"]);
    let mut widened = backup("db", 3, db_hooks.clone());
    widened["spec"]["hooks"]["resources"][0]["includedNamespaces"] = json!(["db", "kube-system"]);
    let mut unselected = backup("db", 4, db_hooks.clone());
    unselected["spec"]["hooks"]["resources"][0]
        .as_object_mut()
        .expect("an entry")
        .remove("labelSelector");
    // shop's hook, put on a Backup of db.
    let mut elsewhere = backup("db", 5, db_hooks.clone());
    elsewhere["spec"]["hooks"]["resources"] =
        serde_json::to_value(hooks_for_namespace(&policy.backup_hooks, "shop")).expect("json");
    elsewhere["spec"]["hooks"]["resources"][0]["includedNamespaces"] = json!(["db"]);
    // db's hook on a Backup of shop.
    let mut other_namespace = db_hooks.clone();
    other_namespace[0].included_namespaces = vec!["shop".into()];
    let cases = [
        (changed, "snapdrain-velero-backup-hooks", exact),
        (widened, "snapdrain-velero-backup-hooks", exact),
        (unselected, "snapdrain-velero-backup-hooks", exact),
        (elsewhere, "snapdrain-velero-backup-hooks", by_name),
        (
            backup("shop", 6, other_namespace),
            "snapdrain-velero-backup-hooks",
            by_name,
        ),
    ];
    for (body, policy_name, why) in cases {
        let text = create(body.clone()).await;
        assert!(
            text.contains(&format!("ValidatingAdmissionPolicy '{policy_name}'"))
                && text.contains(why),
            "{}: {text:?}",
            body["spec"]["hooks"]
        );
    }
    // Hooks without the label that sends them to the DisruptionPolicy check.
    let mut unlabelled = backup("db", 7, db_hooks.clone());
    unlabelled["metadata"]["labels"]
        .as_object_mut()
        .expect("labels")
        .remove("snapdrain.io/policy-hooks");
    let text = create(unlabelled).await;
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-backups'")
            && text.contains("unless labelled snapdrain.io/policy-hooks=true"),
        "{text:?}"
    );

    // The admin takes the hooks out: the same Backup is refused; one without hooks still passes.
    h.set_policy(json!({})).await;
    let text = create(backup("db", 8, db_hooks.clone())).await;
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-velero-backup-hooks'")
            && text.contains(by_name),
        "{text:?}"
    );
    assert_eq!(create(backup("db", 9, Vec::new())).await, "");

    // No DisruptionPolicy at all: a Backup with hooks is refused (parameterNotFoundAction: Deny; a
    // configuration error, which kube-apiserver answers 422 Invalid, not 403), one without hooks never
    // reaches that check.
    Api::<DisruptionPolicy>::all(h.client.clone())
        .delete("default", &DeleteParams::default())
        .await
        .expect("delete the policy");
    let object: DynamicObject =
        serde_json::from_value(backup("db", 10, db_hooks.clone())).expect("an object");
    match backups.create(&PostParams::default(), &object).await {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422
                && s.message.contains("ValidatingAdmissionPolicy 'snapdrain-velero-backup-hooks'")
                && s.message.contains("failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"),
            "{s:?}"
        ),
        other => panic!("a Backup with hooks and no DisruptionPolicy: {other:?}"),
    }
    assert_eq!(create(backup("db", 11, Vec::new())).await, "");

    // snapdrain may create the missing policy (RBAC create), but only with the defaults.
    let mine = DisruptionPolicy::new(
        "default",
        serde_json::from_value(json!({"backupHooks": [{"name": "x", "namespaces": ["db"],
            "pre": [{"exec": {"command": ["/bin/sh", "-c", "id"]}}]}]}))
        .expect("a policy spec"),
    );
    let text = refusal(
        Api::<DisruptionPolicy>::all(sa.clone())
            .create(&PostParams::default(), &mine)
            .await,
    );
    assert!(
        text.contains("ValidatingAdmissionPolicy 'snapdrain-own-policy'")
            && text.contains("never with spec.backupHooks"),
        "{text:?}"
    );
    let defaults = DisruptionPolicy::new("default", DisruptionPolicySpec::defaults());
    assert_eq!(
        refusal(
            Api::<DisruptionPolicy>::all(sa)
                .create(&PostParams::default(), &defaults)
                .await
        ),
        ""
    );
}
