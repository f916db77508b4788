//! `kubectl drain` against an eviction gate: a validating webhook on `pods/eviction` that answers 429 (as
//! snapdrain's gate does while a backup is pending) makes the real kubectl retry, and the same drain
//! completes once the webhook allows the eviction.

use std::sync::atomic::Ordering;

use serde_json::json;
use snapdrain_testkit::eviction::{namespace, pod};
use snapdrain_testkit::webhook::{
    BACKUP_MESSAGE, Gate, HOOK, by_service, configure, pki, serve, service,
};
use snapdrain_testkit::{Kubectl, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_refused_by_a_429_webhook_retries_until_it_allows() {
    let (sim, client) = snapdrain_testkit::eviction::cluster().await;
    let k = Kubectl::new(&sim);
    k.ok(&[
        "apply",
        "-f",
        &k.file(
            "node.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\n",
        ),
    ])
    .await;
    namespace(&client, "shop", json!({"snapdrain.io/gate": "on"})).await;
    pod(&client, "shop", "db-0", Some(true)).await;
    let certs = pki(&["gate.snapdrain.svc"]);
    let gate = Gate::default();
    gate.deny.store(true, Ordering::SeqCst);
    let addr = serve(gate.clone(), &certs).await;
    service(&client, addr).await;
    configure(&client, by_service(), "Ignore", &certs.ca_pem).await;

    let drain = k.spawn(&[
        "drain",
        "node-1",
        "--ignore-daemonsets",
        "--force",
        "--delete-emptydir-data",
        "--grace-period=0",
        "--timeout=60s",
    ]);
    // kubectl retries every 5 s after a 429: a second review means it got the 429 and came back.
    eventually("kubectl to retry the refused eviction", || async {
        (gate.reviews().len() >= 2).then_some(())
    })
    .await;
    let nodes = k.ok(&["get", "nodes"]).await;
    assert!(nodes.contains("SchedulingDisabled"), "{nodes}");
    k.ok(&["get", "pod", "db-0", "-n", "shop"]).await;
    gate.deny.store(false, Ordering::SeqCst);
    let (ok, stdout, stderr) = drain.finish().await;
    assert!(
        ok,
        "the drain completes once the gate allows:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "error when evicting pods/\"db-0\" -n \"shop\" (will retry after 5s): admission webhook \"{HOOK}\" denied the request: {BACKUP_MESSAGE}"
        )),
        "{stderr}"
    );
    assert!(stdout.contains("node/node-1 drained"), "{stdout}");
}
