//! Karpenter's EC2NodeClass status controllers, as far as the simulator needs them: each class's
//! selectors resolved against the simulated EC2 account, written to its `status` the way
//! karpenter-provider-aws `pkg/controllers/nodeclass/{subnet,securitygroup,instanceprofile,readiness}.go`
//! write it (`status.subnets` with id and zone, `status.securityGroups` with id and name,
//! `status.instanceProfile`, and the root `Ready` condition over `SubnetsReady`, `SecurityGroupsReady`,
//! `AMIsReady`, `InstanceProfileReady`, `ValidationSucceeded`, operatorpkg's `NewReadyConditions`).
//!
//! The scenario's classes select by the discovery tag `karpenter.sh/discovery`, which the simulated
//! account puts on every subnet of the VPC and on the EKS cluster security group (the one that lets
//! nodes reach the control plane), as Karpenter's getting-started guide tags them. A class that
//! already carries resolved subnets is left as it is (a test wrote it).

use serde_json::{Value, json};

use crate::apiserver::resources::ResKey;
use crate::apiserver::store::{Store, WriteOptions};
use crate::ec2::Ec2SimConfig;
use crate::world::objects::now;

fn classes() -> ResKey {
    ResKey::new("karpenter.k8s.aws", "ec2nodeclasses")
}

/// The instance profiles Karpenter created for the classes' roles (IAM), for the EC2 endpoint to know.
pub fn instance_profiles(store: &Store) -> Vec<String> {
    store
        .snapshot(&classes())
        .0
        .iter()
        .filter_map(|c| c["status"]["instanceProfile"].as_str().map(str::to_string))
        .collect()
}

/// The AMIs Karpenter resolved for the classes (`status.amis`), for the EC2 endpoint to know, each with
/// the architecture its `kubernetes.io/arch` requirement names (karpenter-provider-aws
/// `pkg/providers/amifamily/ami.go` writes that requirement from the image's `Architecture`, amd64 for
/// x86_64).
pub fn images(store: &Store) -> Vec<crate::ec2::ImageConfig> {
    store
        .snapshot(&classes())
        .0
        .iter()
        .flat_map(|c| c["status"]["amis"].as_array().cloned().unwrap_or_default())
        .filter_map(|ami| {
            let id = ami["id"].as_str()?.to_string();
            let arch = ami["requirements"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["key"] == "kubernetes.io/arch" && r["operator"] == "In")
                .and_then(|r| r["values"][0].as_str())
                .map_or("x86_64", |a| if a == "arm64" { "arm64" } else { "x86_64" });
            Some(crate::ec2::ImageConfig {
                name: ami["name"].as_str().unwrap_or(&id).to_string(),
                architecture: arch.to_string(),
                creation_date: "2026-11-18T00:00:00.000Z".into(),
                id,
            })
        })
        .collect()
}

/// Resolves every class without resolved subnets against `ec2`.
pub fn resolve_all(store: &Store, ec2: &Ec2SimConfig) -> Result<(), String> {
    let subnets: Vec<Value> = ec2
        .subnets
        .iter()
        .map(|s| json!({"id": s.id, "zone": s.zone}))
        .collect();
    let groups: Vec<Value> = ec2
        .security_groups
        .iter()
        .filter(|g| g.reaches_control_plane)
        .map(|g| json!({"id": g.id, "name": g.name}))
        .collect();
    for class in store.snapshot(&classes()).0 {
        if class["status"]["subnets"].is_array() {
            continue;
        }
        let name = class["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (subnets, groups) = (subnets.clone(), groups.clone());
        store
            .modify(
                &classes(),
                None,
                &name,
                Some("status"),
                WriteOptions {
                    internal: true,
                    ..Default::default()
                },
                move |current| {
                    let mut next = current.clone();
                    let status = &mut next["status"];
                    if !status.is_object() {
                        *status = json!({});
                    }
                    status["subnets"] = Value::Array(subnets);
                    status["securityGroups"] = Value::Array(groups);
                    let at = now();
                    let ready = |t: &str| {
                        json!({"type": t, "status": "True", "reason": t, "message": "", "lastTransitionTime": at})
                    };
                    status["conditions"] = json!([
                        ready("AMIsReady"),
                        ready("SubnetsReady"),
                        ready("SecurityGroupsReady"),
                        ready("InstanceProfileReady"),
                        ready("ValidationSucceeded"),
                        ready("Ready"),
                    ]);
                    Ok(next)
                },
            )
            .map_err(|e| format!("EC2NodeClass {name}: {}", e.message))?;
    }
    Ok(())
}
