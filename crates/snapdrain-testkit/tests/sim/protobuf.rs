//! kubectl's generators send built-in kinds as protobuf (`application/vnd.kubernetes.protobuf`, the
//! apimachinery `pkg/runtime/serializer/protobuf/protobuf.go` envelope): `kubectl create namespace|
//! configmap|secret|serviceaccount|deployment|job|role|rolebinding|token` and `kubectl auth can-i`
//! (kubectl `pkg/cmd/create/*.go`, `pkg/cmd/auth/cani.go`). Each object is read back as JSON with the
//! fields the generator filled; a field the simulator does not decode is refused by name.

use serde_json::Value;
use snapdrain_testkit::{Kubectl, start_cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_generators_send_protobuf_and_every_field_arrives() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);

    k.ok(&["create", "namespace", "team-a"]).await;
    let ns = k.json(&["get", "namespace", "team-a"]).await;
    assert_eq!(ns["metadata"]["name"], "team-a", "{ns}");

    k.ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "team-a",
        "--from-literal=a=b",
        "--from-literal=mode=fast",
    ])
    .await;
    let cm = k
        .json(&["get", "configmap", "settings", "-n", "team-a"])
        .await;
    assert_eq!(
        cm["data"],
        serde_json::json!({"a": "b", "mode": "fast"}),
        "{cm}"
    );

    k.ok(&[
        "create",
        "secret",
        "generic",
        "creds",
        "-n",
        "team-a",
        "--from-literal=password=s3cr3t",
        "--type=example.com/basic",
    ])
    .await;
    let secret = k.json(&["get", "secret", "creds", "-n", "team-a"]).await;
    assert_eq!(secret["data"]["password"], "czNjcjN0", "{secret}");
    assert_eq!(secret["type"], "example.com/basic", "{secret}");

    k.ok(&["create", "serviceaccount", "runner", "-n", "team-a"])
        .await;
    let sa = k
        .json(&["get", "serviceaccount", "runner", "-n", "team-a"])
        .await;
    assert_eq!(sa["metadata"]["namespace"], "team-a", "{sa}");

    k.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "team-a",
        "--image=nginx:1.27",
        "--replicas=3",
        "--port=8080",
    ])
    .await;
    let d = k.json(&["get", "deployment", "web", "-n", "team-a"]).await;
    assert_eq!(d["metadata"]["labels"]["app"], "web", "{d}");
    assert_eq!(d["spec"]["replicas"], 3, "{d}");
    assert_eq!(d["spec"]["selector"]["matchLabels"]["app"], "web", "{d}");
    assert_eq!(
        d["spec"]["template"]["metadata"]["labels"]["app"], "web",
        "{d}"
    );
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "nginx:1.27", "{d}");
    assert_eq!(c["ports"][0]["containerPort"], 8080, "{d}");

    k.ok(&[
        "create",
        "job",
        "once",
        "-n",
        "team-a",
        "--image=busybox:1.36",
    ])
    .await;
    let job = k.json(&["get", "job", "once", "-n", "team-a"]).await;
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never", "{job}");
    assert_eq!(pod["containers"][0]["image"], "busybox:1.36", "{job}");
    assert_eq!(pod["containers"][0]["name"], "once", "{job}");

    k.ok(&[
        "create",
        "service",
        "clusterip",
        "web",
        "-n",
        "team-a",
        "--tcp=80:8080",
    ])
    .await;
    let svc = k.json(&["get", "service", "web", "-n", "team-a"]).await;
    assert_eq!(svc["spec"]["type"], "ClusterIP", "{svc}");
    assert_eq!(svc["spec"]["selector"]["app"], "web", "{svc}");
    assert_eq!(svc["spec"]["ports"][0]["port"], 80, "{svc}");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080, "{svc}");

    k.ok(&[
        "create",
        "pdb",
        "web",
        "-n",
        "team-a",
        "--selector=app=web",
        "--max-unavailable=25%",
    ])
    .await;
    let pdb = k.json(&["get", "pdb", "web", "-n", "team-a"]).await;
    assert_eq!(pdb["spec"]["maxUnavailable"], "25%", "{pdb}");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app"], "web",
        "{pdb}"
    );

    // TokenRequest on the serviceaccounts/token subresource: audience and duration arrive.
    let token = k
        .json(&[
            "create",
            "token",
            "runner",
            "-n",
            "team-a",
            "--audience=vault",
            "--duration=10m",
        ])
        .await;
    assert_eq!(
        token["spec"]["audiences"],
        serde_json::json!(["vault"]),
        "{token}"
    );
    assert_eq!(token["spec"]["expirationSeconds"], 600, "{token}");
    assert!(
        token["status"]["token"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{token}"
    );
}

fn answer(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A length-delimited protobuf field (wire type 2): all a SelfSubjectAccessReview of strings needs.
/// Hand-written so the test does not share the simulator's decoder definitions.
fn field(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(tag << 3) | 2];
    let mut len = bytes.len();
    while len >= 0x80 {
        out.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
    out
}

/// What kubectl `pkg/cmd/auth/cani.go` sends for `can-i VERB RESOURCE --subresource=SUB -n NS`: the
/// `k8s\0` envelope (apimachinery `pkg/runtime/serializer/protobuf/protobuf.go`) around a
/// `runtime.Unknown` whose raw bytes are the review (`k8s.io/api/authorization/v1/generated.proto`:
/// spec = 2, resourceAttributes = 1; namespace 1, verb 2, resource 5, subresource 6).
fn review_body(ns: &str, verb: &str, resource: &str, sub: &str) -> Vec<u8> {
    let attrs = [
        field(1, ns.as_bytes()),
        field(2, verb.as_bytes()),
        field(5, resource.as_bytes()),
        field(6, sub.as_bytes()),
    ]
    .concat();
    let review = field(2, &field(1, &attrs));
    let type_meta = [
        field(1, b"authorization.k8s.io/v1"),
        field(2, b"SelfSubjectAccessReview"),
    ]
    .concat();
    [b"k8s\0".to_vec(), field(1, &type_meta), field(2, &review)].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_can_i_over_protobuf_for_an_admin_and_a_narrowly_bound_service_account() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    k.ok(&["create", "namespace", "apps"]).await;
    k.ok(&["create", "serviceaccount", "evictor", "-n", "apps"])
        .await;
    k.ok(&[
        "create",
        "role",
        "evict",
        "-n",
        "apps",
        "--verb=create",
        "--resource=pods/eviction",
    ])
    .await;
    k.ok(&[
        "create",
        "rolebinding",
        "evict",
        "-n",
        "apps",
        "--role=evict",
        "--serviceaccount=apps:evictor",
    ])
    .await;
    let role = k.json(&["get", "role", "evict", "-n", "apps"]).await;
    assert_eq!(
        role["rules"][0]["resources"],
        serde_json::json!(["pods/eviction"]),
        "{role}"
    );
    assert_eq!(
        role["rules"][0]["apiGroups"],
        serde_json::json!([""]),
        "{role}"
    );
    let binding = k.json(&["get", "rolebinding", "evict", "-n", "apps"]).await;
    assert_eq!(binding["roleRef"]["name"], "evict", "{binding}");
    assert_eq!(binding["subjects"][0]["name"], "evictor", "{binding}");

    // kubectl with the kubeconfig's token is the admin.
    let admin = k
        .run(&[
            "auth",
            "can-i",
            "create",
            "pods",
            "--subresource=eviction",
            "-n",
            "apps",
        ])
        .await;
    assert_eq!(answer(&admin), "yes");
    assert_eq!(
        k.ok(&["auth", "can-i", "delete", "nodes"]).await.trim(),
        "yes"
    );

    // The ServiceAccount's own token, from `kubectl create token` (a protobuf TokenRequest), with
    // the protobuf review kubectl would send, over HTTPS as client-go sends it.
    let token = k.ok(&["create", "token", "evictor", "-n", "apps"]).await;
    let http = snapdrain_testkit::trusting(cluster.ca_pem())
        .timeout(snapdrain_testkit::WAIT)
        .build()
        .expect("an HTTPS client");
    let ask = |ns: &'static str, verb: &'static str, resource: &'static str, sub: &'static str| {
        let req = http
            .post(format!(
                "{}/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                cluster.url()
            ))
            .bearer_auth(token.trim())
            .header("content-type", "application/vnd.kubernetes.protobuf")
            .header(
                "accept",
                "application/vnd.kubernetes.protobuf,application/json",
            )
            .body(review_body(ns, verb, resource, sub));
        async move {
            let resp = req.send().await.expect("the review is answered");
            let status = resp.status();
            let body: Value = resp.json().await.expect("a JSON answer");
            assert_eq!(status.as_u16(), 201, "{body}");
            assert_eq!(
                body["spec"]["resourceAttributes"]["namespace"], ns,
                "{body}"
            );
            body["status"]["allowed"] == true
        }
    };
    assert!(ask("apps", "create", "pods", "eviction").await);
    assert!(!ask("default", "create", "pods", "eviction").await);
    assert!(!ask("apps", "delete", "pods", "").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_field_the_simulator_does_not_decode_is_refused_by_name() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    // kubectl `create_clusterrole.go` puts --aggregation-rule in ClusterRole.aggregationRule, which
    // the converter does not map: dropping it would create a different ClusterRole.
    let err = k
        .fails(&[
            "create",
            "clusterrole",
            "monitoring",
            "--aggregation-rule=rbac.example.com/aggregate-to-monitoring=true",
        ])
        .await;
    assert!(
        err.contains("UnsupportedMediaType")
            && err.contains("field aggregationRule of the protobuf ClusterRole body")
            && err.contains("send this object as JSON or YAML"),
        "{err}"
    );
    let out = k.run(&["get", "clusterrole", "monitoring"]).await;
    assert!(
        !out.status.success(),
        "nothing was created: {}",
        answer(&out)
    );
    // A kind the simulator does not decode from protobuf: a 415 that names the accepted ones.
    let err = k
        .fails(&["create", "quota", "small", "--hard=pods=2"])
        .await;
    assert!(
        err.contains("decodes protobuf bodies only for")
            && err.contains("apps/v1/Deployment")
            && err.contains("(got v1/ResourceQuota)")
            && err.contains("JSON and YAML bodies are accepted for every kind"),
        "{err}"
    );
    // The same object as JSON is accepted.
    let yaml = k
        .ok(&[
            "create",
            "clusterrole",
            "monitoring",
            "--dry-run=client",
            "-o",
            "json",
            "--aggregation-rule=rbac.example.com/aggregate-to-monitoring=true",
        ])
        .await;
    let file = k.file("monitoring.json", &yaml);
    k.ok(&["create", "-f", &file]).await;
    let role: Value = k.json(&["get", "clusterrole", "monitoring"]).await;
    assert!(
        role["aggregationRule"]["clusterRoleSelectors"].is_array(),
        "{role}"
    );
}
