//! The small clusters the controller measurements run on: one Karpenter node (instant world timings,
//! pods already Running), sized as DESIGN names them.

/// One node with 3 StatefulSet pods (with volumes, backed up by Velero's node-agent) and 30 others: 28
/// Deployment pods, the Velero server and the node-agent DaemonSet pod. Zero grace periods.
pub const OVERHEAD: &str = r#"
name: bench-overhead
description: One node, 3 StatefulSet pods with volumes and 30 other pods, for orchestration overhead.
materialize: true
nodePools:
  - name: default
    consolidationPolicy: WhenEmpty
    consolidateAfter: 1h
nodes:
  - count: 1
    instanceType: m6i.4xlarge
    zones: [us-east-1a]
    karpenter: {nodePool: default}
namespaces: [shop]
statefulSets:
  - name: db
    namespace: shop
    replicas: 3
    podManagementPolicy: Parallel
    pod: {image: "postgres:17", cpu: 100m, memory: 128Mi, terminationGracePeriodSeconds: 0, annotations: {backup.velero.io/backup-volumes: data}}
    volumeClaimTemplates: [{name: data, size: 1Gi}]
deployments:
  - name: web
    namespace: shop
    replicas: 28
    pod: {image: "nginx:1.27", cpu: 10m, memory: 16Mi, terminationGracePeriodSeconds: 0}
velero:
  bucket: velero
"#;

/// One node with 110 pods: 108 Deployment pods, the Velero server and the node-agent DaemonSet pod. No
/// StatefulSets, so snapdrain has nothing to back up and the comparison with kubectl is about draining.
/// Pods keep the default 30 s grace period; the simulated kubelet stops them at once (podStop 0).
pub const DRAIN_110: &str = r#"
name: bench-drain-110
description: One node with 110 pods, for drain speed.
materialize: true
nodePools:
  - name: default
    consolidationPolicy: WhenEmpty
    consolidateAfter: 1h
nodes:
  - count: 1
    instanceType: m6i.4xlarge
    zones: [us-east-1a]
    karpenter: {nodePool: default}
namespaces: [shop]
deployments:
  - name: web
    namespace: shop
    replicas: 108
    pod: {image: "nginx:1.27", cpu: 10m, memory: 16Mi}
velero:
  bucket: velero
"#;

/// Three nodes with one 20 GiB StatefulSet replica each (3 CPUs a replica on 4-CPU nodes keeps them
/// apart) and a few stateless pods, at the world's default timings: the plan's time is compared with
/// what moving that node's own bytes and stopping its pods must take.
pub const LIMIT: &str = r#"
name: bench-limit
description: Three nodes, one 20 GiB StatefulSet replica on each, for a plan against its physical limit.
materialize: true
nodePools:
  - name: default
    consolidationPolicy: WhenEmpty
    consolidateAfter: 1h
nodes:
  - count: 3
    instanceType: m6i.xlarge
    zones: [us-east-1a, us-east-1b, us-east-1c]
    karpenter: {nodePool: default}
namespaces: [shop]
statefulSets:
  - name: db
    namespace: shop
    replicas: 3
    podManagementPolicy: Parallel
    pod: {image: "postgres:17", cpu: "3", memory: 4Gi, annotations: {backup.velero.io/backup-volumes: data}}
    volumeClaimTemplates: [{name: data, size: 20Gi}]
deployments:
  - name: web
    namespace: shop
    replicas: 6
    pod: {image: "nginx:1.27", cpu: 10m, memory: 16Mi}
velero:
  bucket: velero
"#;

/// Twenty Karpenter nodes with one StatefulSet replica each (3 CPUs a replica on 4-CPU nodes keeps them
/// apart), consolidation off: each node's NodeClaim is a signal to time, one after another.
pub const SIGNALS: &str = r#"
name: bench-signals
description: Twenty nodes, one protected StatefulSet replica on each, for signal to backup latency.
materialize: true
nodePools:
  - name: default
    consolidationPolicy: WhenEmpty
    consolidateAfter: 1h
nodes:
  - count: 20
    instanceType: m6i.xlarge
    zones: [us-east-1a, us-east-1b, us-east-1c]
    karpenter: {nodePool: default}
namespaces: [shop]
statefulSets:
  - name: db
    namespace: shop
    replicas: 20
    podManagementPolicy: Parallel
    pod: {image: "postgres:17", cpu: "3", memory: 4Gi, annotations: {backup.velero.io/backup-volumes: data}}
    volumeClaimTemplates: [{name: data, size: 1Gi}]
velero:
  bucket: velero
"#;
