//! Karpenter's cloud provider in the simulator: launches through the EC2 endpoint with aws-sdk-ec2
//! (RunInstances, Bottlerocket user data carrying the NodeClaim's labels and taints, Karpenter's own
//! instance tags) and terminates through it, as karpenter-provider-aws does with CreateFleet.

use std::sync::Arc;

use aws_sdk_ec2::types::{
    HttpTokensState, IamInstanceProfileSpecification, InstanceMetadataOptionsRequest, InstanceType,
    ResourceType, Tag, TagSpecification,
};
use base64::Engine;

use super::{Cloud, CloudFuture, LaunchRequest, Launched};
use crate::ec2::bottlerocket::{ClusterJoin, karpenter_user_data};
use crate::ec2::{CLUSTER_SECURITY_GROUP, NODE_INSTANCE_PROFILE, SubnetConfig};

pub struct SimEc2Cloud {
    client: aws_sdk_ec2::Client,
    subnets: Vec<SubnetConfig>,
    /// Cluster settings every Karpenter node's user data carries (cluster name, API server, CA).
    cluster: ClusterJoin,
    image_id: String,
}

impl SimEc2Cloud {
    pub fn new(
        client: aws_sdk_ec2::Client,
        subnets: Vec<SubnetConfig>,
        cluster: ClusterJoin,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            subnets,
            cluster,
            image_id: "ami-0bottlerocket00001".into(),
        })
    }
}

impl Cloud for SimEc2Cloud {
    fn launch(&self, req: LaunchRequest) -> CloudFuture<'_, Launched> {
        Box::pin(async move {
            let user_data = karpenter_user_data(&self.cluster, &req.labels, &req.taints);
            // Spread over zones the way Karpenter's fleet requests do: by NodeClaim name.
            let subnet = match self.subnets.len() {
                0 => None,
                n => Some(&self.subnets[req.nodeclaim.bytes().map(usize::from).sum::<usize>() % n]),
            };
            let tags: Vec<Tag> = req
                .tags
                .iter()
                .map(|(k, v)| Tag::builder().key(k).value(v).build())
                .collect();
            // The AMI the NodeClaim's EC2NodeClass maps to it (karpenter-provider-aws
            // pkg/providers/amifamily/ami.go `MapToInstanceTypes`), else the cloud's default.
            let image_id = req
                .image_id
                .clone()
                .unwrap_or_else(|| self.image_id.clone());
            let out = self
                .client
                .run_instances()
                .image_id(&image_id)
                .instance_type(InstanceType::from(req.instance_type.as_str()))
                .min_count(1)
                .max_count(1)
                .set_subnet_id(subnet.map(|s| s.id.clone()))
                // Karpenter's launch templates always carry the node role's instance profile, the
                // EC2NodeClass's security groups and IMDSv2 metadata options
                // (karpenter-provider-aws pkg/providers/launchtemplate/types.go).
                .iam_instance_profile(
                    IamInstanceProfileSpecification::builder()
                        .name(NODE_INSTANCE_PROFILE)
                        .build(),
                )
                .security_group_ids(CLUSTER_SECURITY_GROUP)
                .metadata_options(
                    InstanceMetadataOptionsRequest::builder()
                        .http_tokens(HttpTokensState::Required)
                        .http_put_response_hop_limit(1)
                        .build(),
                )
                .user_data(base64::engine::general_purpose::STANDARD.encode(user_data))
                .client_token(format!("karpenter-{}", req.nodeclaim))
                .tag_specifications(
                    TagSpecification::builder()
                        .resource_type(ResourceType::Instance)
                        .set_tags(Some(tags))
                        .build(),
                )
                .send()
                .await
                .map_err(|e| {
                    format!(
                        "RunInstances: {}",
                        aws_sdk_ec2::error::DisplayErrorContext(&e)
                    )
                })?;
            let instance = out
                .instances()
                .first()
                .ok_or("RunInstances returned no instance")?;
            Ok(Launched {
                id: instance.instance_id().unwrap_or_default().to_string(),
                zone: instance
                    .placement()
                    .and_then(|p| p.availability_zone())
                    .unwrap_or_default()
                    .to_string(),
                image_id,
            })
        })
    }

    fn exists(&self, id: &str) -> CloudFuture<'_, bool> {
        let id = id.to_string();
        Box::pin(async move {
            let out = self
                .client
                .describe_instances()
                .instance_ids(&id)
                .filters(
                    aws_sdk_ec2::types::Filter::builder()
                        .name("instance-state-name")
                        .set_values(Some(
                            ["pending", "running", "stopping", "stopped", "shutting-down"]
                                .map(String::from)
                                .to_vec(),
                        ))
                        .build(),
                )
                .send()
                .await;
            match out {
                Ok(o) => Ok(o.reservations().iter().any(|r| !r.instances().is_empty())),
                Err(e)
                    if aws_sdk_ec2::error::ProvideErrorMetadata::code(&e)
                        == Some("InvalidInstanceID.NotFound") =>
                {
                    Ok(false)
                }
                Err(e) => Err(format!(
                    "DescribeInstances {id}: {}",
                    aws_sdk_ec2::error::DisplayErrorContext(&e)
                )),
            }
        })
    }

    fn terminate(&self, id: &str) -> CloudFuture<'_, ()> {
        let id = id.to_string();
        Box::pin(async move {
            match self
                .client
                .terminate_instances()
                .instance_ids(&id)
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e)
                    if aws_sdk_ec2::error::ProvideErrorMetadata::code(&e)
                        == Some("InvalidInstanceID.NotFound") =>
                {
                    Ok(())
                }
                Err(e) => Err(format!(
                    "TerminateInstances {id}: {}",
                    aws_sdk_ec2::error::DisplayErrorContext(&e)
                )),
            }
        })
    }
}
