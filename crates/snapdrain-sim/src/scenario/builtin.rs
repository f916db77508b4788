//! The built-in scenarios, by name. The small ones are YAML (the same format as scenario files, so they
//! double as examples); `scale-5k` is generated.

use super::ScenarioError;
use super::format::*;
use super::load::parse;

pub const NAMES: &[&str] = &["quickstart", "batch-burst", "drift-rollout", "scale-5k"];

/// The built-in scenario `name`, if there is one.
pub fn get(name: &str) -> Option<Result<Scenario, ScenarioError>> {
    let label = format!("built-in {name}");
    match name {
        "quickstart" => Some(parse(QUICKSTART, &label)),
        "batch-burst" => Some(parse(BATCH_BURST, &label)),
        "drift-rollout" => Some(parse(DRIFT_ROLLOUT, &label)),
        "scale-5k" => Some(Ok(scale_5k())),
        _ => None,
    }
}

pub const QUICKSTART: &str = r#"
name: quickstart
description: Six Karpenter-managed Bottlerocket nodes in three zones, Postgres and Redis StatefulSets with volumes, a web Deployment, Velero with node-agent.
timings: {podStart: 300, podStop: 200, volumeDetach: 200}
nodePools:
  - name: default
    consolidateAfter: 1m
ec2NodeClasses:
  - name: default
nodes:
  - count: 6
    instanceType: m6i.xlarge
    zones: [us-east-1a, us-east-1b, us-east-1c]
    karpenter: {nodePool: default}
namespaces: [shop]
statefulSets:
  - name: postgres
    namespace: shop
    replicas: 3
    pod: {image: "postgres:17", cpu: 250m, memory: 512Mi, annotations: {backup.velero.io/backup-volumes: data}}
    volumeClaimTemplates: [{name: data, size: 20Gi}]
    pdb: {maxUnavailable: 1}
  - name: redis
    namespace: shop
    replicas: 2
    pod: {image: "redis:7.4", cpu: 100m, memory: 256Mi, annotations: {backup.velero.io/backup-volumes: data}}
    volumeClaimTemplates: [{name: data, size: 5Gi}]
deployments:
  - name: web
    namespace: shop
    replicas: 4
    pod: {image: "nginx:1.27", cpu: 100m, memory: 128Mi}
velero:
  bucket: velero
  prefix: cluster-a
"#;

pub const BATCH_BURST: &str = r#"
name: batch-burst
description: A 400-pod batch Job bursts onto the Karpenter `batch` pool while three StatefulSets with volumes run on the `default` pool; once the Job is done its capacity is left for Karpenter to consolidate.
timings: {podStart: 200, podStop: 100, volumeDetach: 100}
nodePools:
  - name: default
  - name: batch
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 10s
    capacityTypes: [spot, on-demand]
nodes:
  - count: 6
    instanceType: m6i.2xlarge
    zones: [us-east-1a, us-east-1b, us-east-1c]
    karpenter: {nodePool: default}
  - count: 4
    instanceType: c6i.4xlarge
    zones: [us-east-1a, us-east-1b]
    taints: [{key: workload, value: batch, effect: NoSchedule}]
    karpenter: {nodePool: batch, capacityType: spot}
namespaces: [data, batch]
statefulSets:
  - name: postgres
    namespace: data
    replicas: 3
    pod: {image: "postgres:17", cpu: 500m, memory: 1Gi, annotations: {backup.velero.io/backup-volumes: data}}
    volumeClaimTemplates: [{name: data, size: 50Gi}]
    pdb: {maxUnavailable: 1}
  - name: kafka
    namespace: data
    replicas: 3
    podManagementPolicy: Parallel
    pod: {image: "apache/kafka:3.9.0", cpu: 500m, memory: 1Gi, annotations: {backup.velero.io/backup-volumes: logs}}
    volumeClaimTemplates: [{name: logs, size: 100Gi}]
    pdb: {minAvailable: 2}
  - name: zookeeper
    namespace: data
    replicas: 3
    pod: {image: "zookeeper:3.9", cpu: 250m, memory: 512Mi}
    volumeClaimTemplates: [{name: data, size: 10Gi}]
jobs:
  - name: etl
    namespace: batch
    completions: 400
    parallelism: 400
    runForMs: 15000
    pod:
      image: "python:3.13-slim"
      cpu: 500m
      memory: 512Mi
      nodeSelector: {karpenter.sh/nodepool: batch}
      tolerations: [{key: workload, operator: Equal, value: batch, effect: NoSchedule}]
velero:
  bucket: velero
"#;

pub const DRIFT_ROLLOUT: &str = r#"
name: drift-rollout
description: A new Bottlerocket AMI is released; five seconds in, the 20 nodes of the default pool are marked Drifted (AMIDrift) and Karpenter starts replacing them.
timings: {podStart: 200, podStop: 100, volumeDetach: 100}
nodePools:
  - name: default
    budgets: [{nodes: "20%"}]
nodes:
  - count: 20
    instanceType: m6i.xlarge
    zones: [us-east-1a, us-east-1b, us-east-1c]
    osVersion: 1.41.0
    karpenter: {nodePool: default}
namespaces: [apps]
statefulSets:
  - name: postgres
    namespace: apps
    replicas: 3
    pod: {image: "postgres:17", cpu: 250m, memory: 512Mi, annotations: {backup.velero.io/backup-volumes: data}}
    volumeClaimTemplates: [{name: data, size: 20Gi}]
    pdb: {maxUnavailable: 1}
  - name: mongodb
    namespace: apps
    replicas: 3
    pod: {image: "mongo:8.0", cpu: 250m, memory: 512Mi, annotations: {backup.velero.io/backup-volumes: data}}
    volumeClaimTemplates: [{name: data, size: 20Gi}]
  - name: elasticsearch
    namespace: apps
    replicas: 3
    podManagementPolicy: Parallel
    pod: {image: "elasticsearch:8.17.0", cpu: 500m, memory: 1Gi}
    volumeClaimTemplates: [{name: data, size: 30Gi}]
deployments:
  - name: api
    namespace: apps
    replicas: 10
    pod: {image: "nginx:1.27", cpu: 100m, memory: 128Mi}
    pdb: {maxUnavailable: 2}
velero:
  bucket: velero
timeline:
  - at: 5000
    action:
      markDrifted: {count: 20, reason: AMIDrift}
"#;

/// 5,000 nodes, 150,000 pods, 3,000 StatefulSets (9,000 volumes), materialized so it loads in seconds.
pub fn scale_5k() -> Scenario {
    let small = |image: &str| PodShape {
        image: image.into(),
        cpu: "10m".into(),
        memory: "16Mi".into(),
        ..Default::default()
    };
    let namespaces: Vec<String> = (0..30).map(|i| format!("tenant-{i:02}")).collect();
    let stateful_sets = (0..3000)
        .map(|i| StatefulSetSpec {
            name: format!("db-{i:04}"),
            namespace: namespaces[i % namespaces.len()].clone(),
            replicas: 3,
            pod: PodShape {
                annotations: [(
                    "backup.velero.io/backup-volumes".to_string(),
                    "data".to_string(),
                )]
                .into(),
                ..small("postgres:17")
            },
            volume_claim_templates: vec![ClaimTemplate {
                name: "data".into(),
                size: "10Gi".into(),
                storage_class: None,
            }],
            pod_management_policy: Some("Parallel".into()),
            service_name: None,
            pdb: None,
        })
        .collect();
    // 150,000 pods: 2 DaemonSets x 5,000 + 9,000 StatefulSet pods + 1 Velero pod + 130,999 others.
    let deployments = (0..1310)
        .map(|i| DeploymentSpec {
            name: format!("svc-{i:04}"),
            namespace: namespaces[i % namespaces.len()].clone(),
            replicas: if i == 0 { 99 } else { 100 },
            pod: small("nginx:1.27"),
            pdb: None,
        })
        .collect();
    Scenario {
        name: Some("scale-5k".into()),
        description: Some(
            "5,000 Karpenter nodes, 150,000 running pods, 3,000 StatefulSets with volumes".into(),
        ),
        timings: None,
        materialize: true,
        nodes: vec![NodeGroup {
            count: Some(5000),
            instance_type: "m6i.4xlarge".into(),
            zones: vec![
                "us-east-1a".into(),
                "us-east-1b".into(),
                "us-east-1c".into(),
            ],
            os_version: default_os_version(),
            karpenter: Some(KarpenterNode {
                node_pool: "default".into(),
                node_class: None,
                capacity_type: "on-demand".into(),
            }),
            ..Default::default()
        }],
        namespaces,
        stateful_sets,
        deployments,
        daemon_sets: vec![DaemonSetSpec {
            name: "kube-proxy".into(),
            namespace: "kube-system".into(),
            pod: small("public.ecr.aws/eks/kube-proxy:v1.35.0"),
            tolerate_all: true,
        }],
        velero: Some(VeleroSpec::default()),
        ..Default::default()
    }
}
