//! deploy/iam/snapdrain-policy.json allows exactly what snapdrain calls on AWS. The calls are found in
//! the product's code (`crates/snapdrain/src`): every `.<operation>()` whose name is an operation module
//! of the AWS SDK crate in use (`aws-sdk-*/src/operation/<operation>/`, read from the cargo registry),
//! so a new SDK call without its IAM action, or an action nothing calls any more, fails here.
//!
//! Operation to IAM action: the operation's name, except where the AWS service authorization reference
//! says otherwise (S3: HeadObject is authorized as s3:GetObject, HeadBucket as s3:ListBucket). Launches
//! that set an instance profile need iam:PassRole on its role; launches that set tag specifications
//! need ec2:CreateTags (authorized with `ec2:CreateAction`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The product's code without its `#[cfg(test)]` modules (unit tests call fakes, not AWS).
fn product_code() -> String {
    let mut all = Vec::new();
    files(&root().join("crates/snapdrain/src"), &mut all);
    all.sort();
    all.iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "tests.rs"))
        .map(|p| {
            let text = std::fs::read_to_string(p).expect("source file");
            match text.find("#[cfg(test)]") {
                Some(i) => text[..i].to_string(),
                None => text,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `version` of `crate_name` in Cargo.lock.
fn locked_version(crate_name: &str) -> String {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).expect("Cargo.lock");
    let needle = format!("name = \"{crate_name}\"\nversion = \"");
    let at = lock
        .find(&needle)
        .unwrap_or_else(|| panic!("{crate_name} is not in Cargo.lock"));
    let rest = &lock[at + needle.len()..];
    rest[..rest.find('"').expect("a quoted version")].to_string()
}

/// The operation names (snake_case) of an AWS SDK crate, from its sources in the cargo registry.
fn sdk_operations(crate_name: &str) -> BTreeSet<String> {
    let version = locked_version(crate_name);
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("CARGO_HOME or HOME is set");
    let registry = home.join("registry/src");
    let dir = std::fs::read_dir(&registry)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            e.path()
                .join(format!("{crate_name}-{version}/src/operation"))
        })
        .find(|p| p.is_dir())
        .unwrap_or_else(|| {
            panic!(
                "the sources of {crate_name} {version} are not under {}: run `cargo fetch`",
                registry.display()
            )
        });
    std::fs::read_dir(dir)
        .expect("operation/")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect()
}

fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// IAM actions the code needs, with the calls that need them.
fn needed_actions(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (krate, prefix) in [
        ("aws-sdk-ec2", "ec2"),
        ("aws-sdk-autoscaling", "autoscaling"),
        ("aws-sdk-s3", "s3"),
    ] {
        for op in sdk_operations(krate) {
            if !code.contains(&format!(".{op}()")) {
                continue;
            }
            let action = match (prefix, op.as_str()) {
                ("s3", "head_object") => "s3:GetObject".to_string(),
                ("s3", "head_bucket" | "list_objects_v2" | "list_objects") => {
                    "s3:ListBucket".to_string()
                }
                _ => format!("{prefix}:{}", camel(&op)),
            };
            out.insert(action);
        }
    }
    if code.contains(".set_iam_instance_profile(") {
        out.insert("iam:PassRole".into());
    }
    if code.contains(".set_tag_specifications(") {
        out.insert("ec2:CreateTags".into());
    }
    out
}

fn policy() -> Value {
    let p = root().join("deploy/iam/snapdrain-policy.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("the IAM policy"))
        .expect("the IAM policy is JSON")
}

fn statements(policy: &Value) -> Vec<Value> {
    policy["Statement"].as_array().cloned().unwrap_or_default()
}

fn actions_of(s: &Value) -> Vec<String> {
    match &s["Action"] {
        Value::String(a) => vec![a.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => vec![],
    }
}

#[test]
fn the_iam_policy_allows_every_aws_call_and_nothing_else() {
    let needed = needed_actions(&product_code());
    // The scan finds the calls: if these disappear the scan itself broke.
    for known in ["ec2:TerminateInstances", "s3:GetObject", "ec2:CreateFleet"] {
        assert!(needed.contains(known), "{known} not found in {needed:?}");
    }
    let p = policy();
    assert_eq!(p["Version"], "2012-10-17");
    let granted: BTreeSet<String> = statements(&p)
        .iter()
        .filter(|s| s["Effect"] == "Allow")
        .flat_map(actions_of)
        .collect();
    assert!(
        granted.iter().all(|a| !a.contains('*')),
        "no wildcard actions: {granted:?}"
    );
    let missing: Vec<_> = needed.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&needed).collect();
    assert!(
        missing.is_empty() && unused.is_empty(),
        "deploy/iam/snapdrain-policy.json lacks {missing:?} (called by crates/snapdrain/src) and grants {unused:?} (called nowhere)"
    );
}

#[test]
fn pass_role_tags_and_bucket_access_are_narrowed() {
    let p = policy();
    let with = |action: &str| -> Value {
        statements(&p)
            .into_iter()
            .find(|s| actions_of(s).iter().any(|a| a == action))
            .unwrap_or_else(|| panic!("no statement grants {action}"))
    };
    let pass = with("iam:PassRole");
    assert_eq!(actions_of(&pass), vec!["iam:PassRole"]);
    assert_eq!(pass["Resource"], "${NODE_ROLE_ARN}");
    assert_eq!(
        pass["Condition"]["StringEquals"]["iam:PassedToService"],
        "ec2.amazonaws.com"
    );
    let tags = with("ec2:CreateTags");
    assert_eq!(
        tags["Condition"]["StringEquals"]["ec2:CreateAction"],
        serde_json::json!(["RunInstances", "CreateFleet", "CreateLaunchTemplate"])
    );
    assert_eq!(with("s3:GetObject")["Resource"], "arn:aws:s3:::${BUCKET}/*");
    assert_eq!(with("s3:ListBucket")["Resource"], "arn:aws:s3:::${BUCKET}");
    // Review H-4: bucket reads over TLS only.
    for action in ["s3:GetObject", "s3:ListBucket"] {
        assert_eq!(
            with(action)["Condition"]["Bool"]["aws:SecureTransport"],
            "true",
            "{action}"
        );
    }
    // Snapshot tags: only the keys an emergency snapshot carries (EC2 API reference, CreateSnapshots
    // TagSpecifications; the plan's uid and name and the cluster tag).
    let snapshot_tags = statements(&p)
        .into_iter()
        .find(|s| {
            s["Resource"] == "arn:aws:ec2:${REGION}::snapshot/*"
                && actions_of(s) == ["ec2:CreateTags"]
        })
        .expect("a CreateTags statement for snapshots");
    assert_eq!(
        snapshot_tags["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"],
        serde_json::json!([
            "snapdrain.io/plan-uid",
            "snapdrain.io/plan",
            "kubernetes.io/cluster/${CLUSTER_NAME}"
        ])
    );
    // And every tag the product puts on a snapshot is one of them (a new tag would be refused by IAM).
    let allowed = &snapshot_tags["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"];
    for key in
        snapdrain::planning::ebs_snapshots::snapshot_tags("p", "u", Some("${CLUSTER_NAME}")).keys()
    {
        assert!(
            allowed
                .as_array()
                .is_some_and(|a| a.iter().any(|k| k == key.as_str())),
            "snapshot tag {key} is not allowed by aws:TagKeys"
        );
    }
    let terminate = with("ec2:TerminateInstances");
    assert!(
        terminate["Condition"]["StringEquals"]
            .get("aws:ResourceTag/kubernetes.io/cluster/${CLUSTER_NAME}")
            .is_some(),
        "{terminate}"
    );
    // Every placeholder is documented.
    let text = std::fs::read_to_string(root().join("deploy/iam/snapdrain-policy.json"))
        .expect("the policy");
    let doc = std::fs::read_to_string(root().join("deploy/iam/README.md")).expect("its README");
    let re = regex::Regex::new(r"\$\{[A-Z_]+\}").expect("re");
    for m in re.find_iter(&text) {
        assert!(
            doc.contains(m.as_str()),
            "{} is not documented in deploy/iam/README.md",
            m.as_str()
        );
    }
}

/// Every action that changes something is confined to this cluster's resources (review H-4): by a tag
/// condition, by the cluster's VPC, or, for RunInstances/CreateFleet, to the resources a launch reads
/// (images, snapshots) or creates along with the tag-conditioned instance (its volumes, network
/// interfaces, the instant fleet record). IAM evaluates each resource of a RunInstances request against
/// the statements separately (EC2 service authorization reference, RunInstances), as Karpenter's
/// controller policy splits them (karpenter-provider-aws `cloudformation.yaml`).
#[test]
fn every_changing_action_is_conditioned_on_this_cluster() {
    let p = policy();
    let changing = [
        "ec2:TerminateInstances",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "ec2:RunInstances",
        "ec2:CreateFleet",
        "ec2:CreateLaunchTemplate",
        "ec2:DeleteLaunchTemplate",
        "ec2:CreateTags",
        "ec2:CreateSnapshots",
        "iam:PassRole",
    ];
    let cluster_tag = |c: &Value, key: &str| {
        c["StringEquals"][format!("{key}/kubernetes.io/cluster/${{CLUSTER_NAME}}")] == "owned"
    };
    let mut seen = BTreeSet::new();
    for s in statements(&p) {
        let actions = actions_of(&s);
        if !actions.iter().any(|a| changing.contains(&a.as_str())) {
            continue;
        }
        seen.extend(actions.clone());
        let resources: Vec<String> = match &s["Resource"] {
            Value::String(r) => vec![r.clone()],
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            other => panic!("{}: Resource {other}", s["Sid"]),
        };
        assert!(
            !resources.iter().any(|r| r == "*"),
            "{}: Resource *",
            s["Sid"]
        );
        let c = &s["Condition"];
        let confined = cluster_tag(c, "aws:ResourceTag")
            || cluster_tag(c, "aws:RequestTag")
            || cluster_tag(c, "autoscaling:ResourceTag")
            || c["StringEquals"]["autoscaling:ResourceTag/eks:cluster-name"] == "${CLUSTER_NAME}"
            || c["StringEquals"]["ec2:Vpc"] == "arn:aws:ec2:${REGION}:${ACCOUNT_ID}:vpc/${VPC_ID}"
            || c["StringEquals"]["ec2:CreateAction"].is_array()
            || c["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com";
        let launch_inputs = actions
            .iter()
            .all(|a| a == "ec2:RunInstances" || a == "ec2:CreateFleet")
            && resources.iter().all(|r| {
                [
                    "::image/*",
                    "::snapshot/*",
                    ":volume/*",
                    ":network-interface/*",
                    ":fleet/*",
                ]
                .iter()
                .any(|kind| r.ends_with(kind))
            });
        // CreateSnapshots reads the instance's volumes: only those the EBS CSI driver made, which it tags
        // `ebs.csi.aws.com/cluster=true` (its example IAM policy conditions CreateVolume on that tag).
        let csi_volumes = actions.iter().all(|a| a == "ec2:CreateSnapshots")
            && resources.iter().all(|r| r.ends_with(":volume/*"))
            && c["StringEquals"]["aws:ResourceTag/ebs.csi.aws.com/cluster"] == "true";
        assert!(
            confined || launch_inputs || csi_volumes,
            "{} is not confined to the cluster: {s}",
            s["Sid"]
        );
        // An instance or launch template is never reachable without the cluster tag.
        for r in &resources {
            if r.ends_with(":instance/*") || r.ends_with(":launch-template/*") {
                assert!(
                    cluster_tag(c, "aws:ResourceTag")
                        || cluster_tag(c, "aws:RequestTag")
                        || c["StringEquals"]["ec2:CreateAction"].is_array(),
                    "{}: {r} without the cluster tag",
                    s["Sid"]
                );
            }
        }
    }
    for a in changing {
        assert!(seen.contains(a), "{a} is granted nowhere");
    }
    // The templates snapdrain creates carry the tag the policy asks for, set at creation.
    let code = product_code();
    let at = code
        .find(".create_launch_template()")
        .expect("the code creates launch templates");
    let call = &code[at..at + code[at..].find(".send()").expect("the call is sent")];
    assert!(
        call.contains("set_tag_specifications(") && code.contains("ResourceType::LaunchTemplate"),
        "CreateLaunchTemplate is sent without its tags: {call}"
    );
    let doc = std::fs::read_to_string(root().join("deploy/iam/README.md")).expect("its README");
    assert!(!doc.contains("drop the condition"), "{doc}");
}
