//! `snapdrain sim serve`: run the simulated cluster until interrupted.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig, manifests};

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Start the simulated cluster (its API server on HTTPS with a CA of its own), write a kubeconfig
    /// that trusts that CA and the CA itself beside it (`NAME.ca.crt` for `NAME.kubeconfig`), print one
    /// JSON line with the endpoints, and run until SIGINT/SIGTERM.
    Serve {
        /// Address to listen on (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: SocketAddr,
        /// Where to write the kubeconfig (default: ./snapdrain-sim.kubeconfig).
        #[arg(long, default_value = "snapdrain-sim.kubeconfig")]
        kubeconfig: PathBuf,
        /// A scenario: a built-in name (quickstart, batch-burst, drift-rollout, scale-5k) or a scenario
        /// file. A file that is a plain list of manifests is loaded as objects, without the world.
        #[arg(long, value_name = "NAME|FILE")]
        scenario: Option<String>,
        /// Run the world controllers (kubelet, scheduler, workload controllers) even without a scenario.
        #[arg(long)]
        world: bool,
        /// Also write an AWS shared config file with a `snapdrain-sim` profile (region, keys and the S3
        /// and EC2 endpoints), for `AWS_CONFIG_FILE=FILE AWS_PROFILE=snapdrain-sim aws s3 ls` or boto3.
        #[arg(long, value_name = "FILE")]
        aws_config: Option<PathBuf>,
        /// Fault rules to apply from the start: a JSON list as `PUT /sim/faults` takes, e.g.
        /// `[{"verb":"create","resource":"pods/eviction","errorRate":0.2,"errorCode":429}]`.
        #[arg(long, value_name = "FILE")]
        faults: Option<std::path::PathBuf>,
    },
}

pub async fn run(cmd: SimCommand) -> anyhow::Result<()> {
    match cmd {
        SimCommand::Serve {
            addr,
            kubeconfig,
            scenario,
            world,
            aws_config,
            faults,
        } => {
            let rules = match &faults {
                None => Vec::new(),
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read fault rules {}", path.display()))?;
                    let rules: Vec<snapdrain_sim::apiserver::faults::FaultRule> = serde_json::from_str(&text)
                        .with_context(|| format!("{} is not a JSON list of fault rules (verb, resource, errorRate, errorCode, latencyMs, times)", path.display()))?;
                    for r in &rules {
                        r.validate()
                            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    }
                    rules
                }
            };
            let (objects, scenario) = match scenario {
                Some(file) if is_manifest_list(&file) => {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("cannot read scenario file {file}"))?;
                    (manifests::parse_objects(&text, &file)?, None)
                }
                other => (Vec::new(), other.map(ScenarioSource::Named)),
            };
            let cluster = SimCluster::start(SimConfig {
                addr,
                objects,
                scenario,
                world,
                ..Default::default()
            })
            .await?;
            cluster.faults.set(rules);
            let path = cluster.write_kubeconfig(&kubeconfig)?;
            let abs = std::fs::canonicalize(&path).unwrap_or(path);
            let ca_file = kubeconfig.with_extension("ca.crt");
            std::fs::write(&ca_file, cluster.ca_pem()).with_context(|| {
                format!("cannot write the API server's CA to {}", ca_file.display())
            })?;
            let ca_abs = std::fs::canonicalize(&ca_file).unwrap_or(ca_file);
            let endpoints = Endpoints::of(&cluster);
            let mut line = json!({
                "apiserver": cluster.url(),
                "kubeconfig": abs,
                "ca": ca_abs,
                "audit": format!("{}/sim/audit", cluster.url()),
                "faults": format!("{}/sim/faults", cluster.url()),
                "s3": endpoints.s3.as_ref().map(|s| json!({
                    "endpoint": s.endpoint, "region": s.region, "buckets": s.buckets,
                    "accessKeyId": s.access_key, "secretAccessKey": s.secret_key,
                    "pathStyle": true,
                })),
                "ec2": endpoints.ec2.as_ref().map(|e| json!({
                    "endpoint": e.endpoint, "region": e.region,
                    "accessKeyId": EC2_KEY, "secretAccessKey": EC2_KEY,
                })),
            });
            if let Some(file) = &aws_config {
                std::fs::write(file, endpoints.aws_config()).with_context(|| {
                    format!("cannot write the AWS config file {}", file.display())
                })?;
                line["awsConfig"] = json!(std::fs::canonicalize(file).unwrap_or(file.clone()));
                line["awsProfile"] = json!(AWS_PROFILE);
            }
            println!("{line}");
            super::signal::shutdown_signal().await;
            Ok(())
        }
    }
}

/// Whether `path` is a file of plain manifests (a list, or documents with apiVersion and kind) rather
/// than a scenario.
fn is_manifest_list(path: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(docs) = serde_saphyr::from_multiple::<serde_json::Value>(&text) else {
        return false;
    };
    docs.iter()
        .find(|d| !d.is_null())
        .is_some_and(|d| d.is_array() || (d.get("apiVersion").is_some() && d.get("kind").is_some()))
}

/// The profile `--aws-config` writes.
const AWS_PROFILE: &str = "snapdrain-sim";
/// The simulated EC2 accepts any SigV4 keys; these are the ones it is documented with.
const EC2_KEY: &str = "sim";

struct S3Endpoint {
    endpoint: String,
    region: String,
    buckets: Vec<String>,
    access_key: String,
    secret_key: String,
}

struct Ec2Endpoint {
    endpoint: String,
    region: String,
}

/// The AWS endpoints a simulated cluster serves, as `sim serve` prints them.
struct Endpoints {
    s3: Option<S3Endpoint>,
    ec2: Option<Ec2Endpoint>,
}

impl Endpoints {
    fn of(cluster: &SimCluster) -> Self {
        Self {
            s3: cluster.s3.as_ref().map(|s| S3Endpoint {
                endpoint: s.endpoint(),
                region: s.region().to_string(),
                buckets: s.buckets().to_vec(),
                access_key: s.access_key().to_string(),
                secret_key: s.secret_key().to_string(),
            }),
            ec2: cluster.ec2.as_ref().map(|e| Ec2Endpoint {
                endpoint: e.endpoint(),
                region: e.config().region.clone(),
            }),
        }
    }

    /// An AWS shared config file: one profile with the keys and a `services` section giving each
    /// service its endpoint (the SDKs' and CLI v2's `endpoint_url` setting). S3 keys go in the profile;
    /// EC2 accepts any keys, so the S3 ones serve both. Path-style addressing, since the endpoint is an
    /// IP address.
    fn aws_config(&self) -> String {
        let region = self
            .s3
            .as_ref()
            .map(|s| s.region.as_str())
            .or(self.ec2.as_ref().map(|e| e.region.as_str()))
            .unwrap_or("us-east-1");
        let (key, secret) = self.s3.as_ref().map_or((EC2_KEY, EC2_KEY), |s| {
            (s.access_key.as_str(), s.secret_key.as_str())
        });
        let mut out = format!(
            "[profile {AWS_PROFILE}]\nregion = {region}\naws_access_key_id = {key}\naws_secret_access_key = {secret}\nservices = {AWS_PROFILE}\n"
        );
        if self.s3.is_some() {
            out.push_str("s3 =\n  addressing_style = path\n");
        }
        out.push_str(&format!("\n[services {AWS_PROFILE}]\n"));
        if let Some(s) = &self.s3 {
            out.push_str(&format!("s3 =\n  endpoint_url = {}\n", s.endpoint));
        }
        if let Some(e) = &self.ec2 {
            out.push_str(&format!("ec2 =\n  endpoint_url = {}\n", e.endpoint));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aws_config_names_each_service_endpoint_under_one_profile() {
        let e = Endpoints {
            s3: Some(S3Endpoint {
                endpoint: "http://127.0.0.1:9000".into(),
                region: "minio".into(),
                buckets: vec!["velero".into()],
                access_key: "AK".into(),
                secret_key: "SK".into(),
            }),
            ec2: Some(Ec2Endpoint {
                endpoint: "http://127.0.0.1:9001".into(),
                region: "us-east-1".into(),
            }),
        };
        let text = e.aws_config();
        assert!(
            text.starts_with("[profile snapdrain-sim]\nregion = minio\n"),
            "{text}"
        );
        assert!(text.contains("aws_access_key_id = AK\n"), "{text}");
        assert!(text.contains("[services snapdrain-sim]\ns3 =\n  endpoint_url = http://127.0.0.1:9000\nec2 =\n  endpoint_url = http://127.0.0.1:9001\n"), "{text}");
    }
}
