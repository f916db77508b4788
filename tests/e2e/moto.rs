//! snapdrain's EC2 reads against moto (PyPI `moto[server]`, which .ci/run installs): a second
//! implementation of the EC2 API beside the simulator, so a response shape both the simulator and
//! snapdrain got wrong the same way is caught. moto's DescribeInstanceAttribute answers `userData` with
//! the base64 RunInstances was given, and an empty `<userData/>` for an instance launched without
//! (moto/ec2/responses/instances.py, `describe_instance_attribute`).

use std::process::Stdio;
use std::time::Duration;

use snapdrain::cloud::bottlerocket::{cluster_settings, encode_base64};
use snapdrain::cloud::ec2::Ec2Cloud;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A moto server on a free port of 127.0.0.1, stopped when dropped.
struct Moto {
    _child: tokio::process::Child,
    endpoint: String,
}

/// Starts moto in server mode (ThreadedMotoServer, port 0) and reads its address from its stdout.
async fn start_moto() -> Moto {
    const SCRIPT: &str = "import sys\nfrom moto.server import ThreadedMotoServer\ns = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\ns.start()\nh, p = s.get_host_and_port()\nprint(f'MOTO http://{h}:{p}', flush=True)\nsys.stdin.read()\n";
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    let endpoint = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(url) = line.strip_prefix("MOTO ") {
                return Some(url.to_string());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("moto starts: install it with `pip install 'moto[server]'` (.ci/run does)");
    Moto {
        _child: child,
        endpoint,
    }
}

/// Shaped as Karpenter's Bottlerocket bootstrap writes it (karpenter-provider-aws
/// pkg/providers/amifamily/bootstrap/bottlerocket.go).
const KARPENTER_USER_DATA: &str = "[settings.kubernetes]\napi-server = \"https://ABC.gr7.us-west-2.eks.amazonaws.com\"\ncluster-certificate = \"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==\"\ncluster-name = \"prod\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_gives_back_the_user_data_that_names_a_nodes_cluster() {
    let moto = start_moto().await;
    let cloud = Ec2Cloud::with_endpoint(&moto.endpoint, "us-west-2", Some(("test", "test"))).await;
    let launch = |user_data: Option<String>| {
        cloud
            .client()
            .run_instances()
            .image_id("ami-12c6146b")
            .min_count(1)
            .max_count(1)
            .set_user_data(user_data)
            .send()
    };
    let with = launch(Some(encode_base64(KARPENTER_USER_DATA)))
        .await
        .expect("RunInstances");
    let id = with.instances()[0]
        .instance_id()
        .expect("an id")
        .to_string();
    let raw = cloud
        .user_data(&id)
        .await
        .expect("DescribeInstanceAttribute")
        .expect("the instance has user data");
    assert_eq!(raw, KARPENTER_USER_DATA.as_bytes());
    let cluster = cluster_settings(&raw).expect("Bottlerocket TOML");
    assert_eq!(cluster.cluster_name.as_deref(), Some("prod"));
    assert_eq!(
        cluster.api_server.as_deref(),
        Some("https://ABC.gr7.us-west-2.eks.amazonaws.com")
    );

    let bare = launch(None).await.expect("RunInstances");
    let bare = bare.instances()[0]
        .instance_id()
        .expect("an id")
        .to_string();
    assert_eq!(cloud.user_data(&bare).await.expect("answered"), None);
    assert_eq!(
        cloud
            .user_data("i-0123456789abcdef0")
            .await
            .expect("an unknown instance is no error"),
        None
    );
}
