//! The simulator's world: instances, launch templates, idempotency tokens and injected faults.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::{AttachedVolume, InstanceInfo, InstanceSnapshot, InstanceState};

pub(super) fn random_id(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..17]
    )
}

pub(super) struct Instance {
    pub(super) info: InstanceInfo,
    pub(super) state: InstanceState,
    pub(super) state_reason: Option<(String, String)>,
    pub(super) reservation_id: String,
    pub(super) client_token: Option<String>,
    /// Decoded (not yet validated) user data; validated at boot like the host would.
    pub(super) raw_user_data: Option<Vec<u8>>,
}

impl Instance {
    pub(super) fn snapshot(&self) -> InstanceSnapshot {
        InstanceSnapshot {
            info: self.info.clone(),
            state: self.state,
            state_reason: self.state_reason.clone(),
            client_token: self.client_token.clone(),
        }
    }
}

/// Launch parameters stored in one version of a launch template.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct TemplateData {
    pub(super) image_id: Option<String>,
    pub(super) instance_type: Option<String>,
    pub(super) subnet_id: Option<String>,
    /// Base64, as given.
    pub(super) user_data: Option<String>,
    pub(super) instance_tags: BTreeMap<String, String>,
    pub(super) spot: bool,
    pub(super) launch: LaunchSecurity,
    /// `InstanceRequirements`: (VCpuCount.Min, MemoryMiB.Min), the two attributes EC2 requires; the
    /// version then names no InstanceType.
    pub(super) instance_requirements: Option<(u32, u32)>,
}

/// What an instance gets to authenticate and talk to the cluster: instance profile (ARN), security
/// groups and IMDS options. `None`/empty: not given (the template or EC2's defaults apply).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct LaunchSecurity {
    pub(super) instance_profile: Option<String>,
    pub(super) security_group_ids: Vec<String>,
    pub(super) http_tokens: Option<String>,
    pub(super) hop_limit: Option<u32>,
}

impl LaunchSecurity {
    /// Request parameters over template values.
    pub(super) fn over(self, template: &LaunchSecurity) -> LaunchSecurity {
        LaunchSecurity {
            instance_profile: self
                .instance_profile
                .or_else(|| template.instance_profile.clone()),
            security_group_ids: if self.security_group_ids.is_empty() {
                template.security_group_ids.clone()
            } else {
                self.security_group_ids
            },
            http_tokens: self.http_tokens.or_else(|| template.http_tokens.clone()),
            hop_limit: self.hop_limit.or(template.hop_limit),
        }
    }
}

pub(super) struct LaunchTemplate {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) created: jiff::Timestamp,
    /// Version n is `versions[n - 1]`: CreateLaunchTemplate makes version 1, each
    /// CreateLaunchTemplateVersion the next number (EC2 API reference, CreateLaunchTemplateVersion:
    /// "Launch template versions are numbered in the order in which they are created").
    pub(super) versions: Vec<TemplateVersion>,
    /// The version `$Default` names: version 1 until ModifyLaunchTemplate (not simulated) moves it.
    pub(super) default_version: u32,
    pub(super) tags: BTreeMap<String, String>,
}

pub(super) struct TemplateVersion {
    pub(super) created: jiff::Timestamp,
    pub(super) description: Option<String>,
    pub(super) data: TemplateData,
}

impl LaunchTemplate {
    pub(super) fn latest_version(&self) -> u32 {
        u32::try_from(self.versions.len()).unwrap_or(u32::MAX)
    }

    /// The version number `version` names: `$Default`, `$Latest` or a number that exists (EC2 API
    /// reference, LaunchTemplateSpecification `Version`). `None`: no such version.
    pub(super) fn resolve(&self, version: &str) -> Option<u32> {
        let n = match version {
            "$Default" => self.default_version,
            "$Latest" => self.latest_version(),
            n => n.parse().ok()?,
        };
        (1..=self.latest_version()).contains(&n).then_some(n)
    }

    /// Version `n`'s launch parameters.
    pub(super) fn data(&self, n: u32) -> Option<&TemplateData> {
        self.versions
            .get(usize::try_from(n).ok()?.checked_sub(1)?)
            .map(|v| &v.data)
    }
}

/// One CreateFleet override that could not be fulfilled.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FleetError {
    pub(super) template_id: String,
    pub(super) template_version: String,
    pub(super) instance_type: String,
    pub(super) subnet_id: String,
    pub(super) zone: String,
    pub(super) image_id: Option<String>,
    pub(super) code: String,
    pub(super) message: String,
}

/// Instances launched from one CreateFleet override.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FleetLaunch {
    pub(super) template_id: String,
    pub(super) template_version: String,
    pub(super) instance_type: String,
    pub(super) subnet_id: String,
    pub(super) zone: String,
    pub(super) image_id: Option<String>,
    pub(super) spot: bool,
    pub(super) instance_ids: Vec<String>,
}

/// What a ClientToken already produced, so a retry returns the same thing.
pub(super) enum TokenRecord {
    Run {
        fingerprint: String,
        reservation_id: String,
    },
    Fleet {
        fingerprint: String,
        fleet_id: String,
        errors: Vec<FleetError>,
        launches: Vec<FleetLaunch>,
    },
}

impl TokenRecord {
    pub(super) fn fingerprint(&self) -> &str {
        match self {
            TokenRecord::Run { fingerprint, .. } | TokenRecord::Fleet { fingerprint, .. } => {
                fingerprint
            }
        }
    }
}

pub(super) struct Fault {
    pub(super) instance_type: String,
    pub(super) zone: Option<String>,
    pub(super) code: String,
}

/// An Auto Scaling group: it keeps `desired` instances in service, launching a copy of a member that
/// goes away (Amazon EC2 Auto Scaling user guide, "Health checks for instances in an Auto Scaling group":
/// an instance terminated outside the group is marked unhealthy and replaced).
pub(super) struct AutoScalingGroup {
    pub(super) desired: u32,
    /// Members, terminated ones removed.
    pub(super) members: Vec<String>,
}

/// An EBS snapshot: its state follows from `started` and `duration` when read.
#[derive(Debug, Clone)]
pub(super) struct Snapshot {
    pub(super) id: String,
    pub(super) volume_id: String,
    pub(super) volume_size_gib: u64,
    pub(super) start_time: jiff::Timestamp,
    pub(super) started: Instant,
    pub(super) duration: Duration,
    /// Ends in `error` instead of `completed`.
    pub(super) fails: bool,
    pub(super) tags: BTreeMap<String, String>,
    pub(super) description: String,
    pub(super) action: &'static str,
}

/// Root volume size of a simulated instance (GiB); Karpenter's default block device for Bottlerocket is
/// smaller, the size matters only to the snapshot's copy time.
const ROOT_VOLUME_GIB: u64 = 8;

#[derive(Default)]
pub(super) struct World {
    /// Every EBS snapshot, oldest first.
    pub(super) snapshots: Vec<Snapshot>,
    /// Each instance's root volume (`/dev/xvda`), made when the instance is.
    pub(super) boot_volumes: HashMap<String, AttachedVolume>,
    /// Volumes attached in-process (tests), by instance.
    pub(super) attached: HashMap<String, Vec<AttachedVolume>>,
    /// Volumes whose snapshots end in `error`.
    pub(super) failing_volumes: HashSet<String>,
    pub(super) groups: BTreeMap<String, AutoScalingGroup>,
    /// Every CreateFleet request, as EC2 received it (for tests).
    pub(super) fleet_requests: Vec<super::FleetRequest>,
    pub(super) instances: HashMap<String, Instance>,
    order: Vec<String>,
    pub(super) templates: BTreeMap<String, LaunchTemplate>,
    /// Keyed by action and token: tokens are scoped per operation.
    pub(super) tokens: HashMap<(String, String), TokenRecord>,
    pub(super) faults: Vec<Fault>,
    /// AMIs by id.
    pub(super) images: BTreeMap<String, super::ImageConfig>,
    next_host: u32,
}

impl World {
    pub(super) fn insert(&mut self, inst: Instance) {
        self.boot_volumes.insert(
            inst.info.id.clone(),
            AttachedVolume {
                volume_id: random_id("vol-"),
                size_gib: ROOT_VOLUME_GIB,
                device: "/dev/xvda".into(),
                boot: true,
                tags: BTreeMap::new(),
            },
        );
        self.order.push(inst.info.id.clone());
        self.instances.insert(inst.info.id.clone(), inst);
    }

    pub(super) fn ordered(&self) -> impl Iterator<Item = &Instance> {
        self.order.iter().filter_map(|id| self.instances.get(id))
    }

    /// The injected error for this type and zone, if any.
    pub(super) fn fault_for(&self, instance_type: &str, zone: &str) -> Option<&str> {
        self.faults
            .iter()
            .find(|f| {
                f.instance_type == instance_type && f.zone.as_deref().is_none_or(|z| z == zone)
            })
            .map(|f| f.code.as_str())
    }

    /// Next private address in the subnet with index `subnet_index` that no instance holds (EC2 never
    /// gives one address to two running interfaces; a scenario's own instances, inserted with the
    /// addresses their Node names carry, sit in the same space, and at scale-5k a plain counter met
    /// them: the replacement's Node name was taken and it never registered).
    pub(super) fn allocate_ip(&mut self, subnet_index: usize) -> String {
        let taken: HashSet<&str> = self
            .instances
            .values()
            .filter(|i| i.state != InstanceState::Terminated)
            .map(|i| i.info.private_ip.as_str())
            .collect();
        let mut candidate = String::new();
        // Every address of the space once at most; past that the space is full and the last one
        // tried is reused (a test world never gets there).
        for _ in 0..256 * 250 {
            let n = self.next_host;
            self.next_host = self.next_host.wrapping_add(1);
            // 10.0.<16*subnet + n/250>.<n%250 + 4>: AWS reserves .0-.3 of each subnet.
            let third = (subnet_index as u32 * 16 + n / 250) % 256;
            candidate = format!("10.0.{third}.{}", n % 250 + 4);
            if !taken.contains(candidate.as_str()) {
                break;
            }
        }
        candidate
    }

    pub(super) fn template_by_name(&self, name: &str) -> Option<&LaunchTemplate> {
        self.templates.values().find(|t| t.name == name)
    }
}

pub(super) fn private_dns_name(ip: &str, region: &str) -> String {
    format!("ip-{}.{region}.compute.internal", ip.replace('.', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names() {
        let id = random_id("i-");
        assert_eq!(id.len(), 19);
        assert!(id[2..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            private_dns_name("10.0.1.5", "us-west-2"),
            "ip-10-0-1-5.us-west-2.compute.internal"
        );
    }

    /// A scenario's instances sit in the addresses the counter hands out: a new instance gets the next
    /// free one, and a terminated instance's address is free again.
    #[test]
    fn a_new_instance_never_gets_an_address_an_instance_holds() {
        let mut w = World::default();
        for (id, ip, state) in [
            ("i-a", "10.0.0.4", InstanceState::Running),
            ("i-b", "10.0.0.5", InstanceState::Pending),
            ("i-c", "10.0.0.7", InstanceState::Terminated),
        ] {
            w.insert(Instance {
                info: InstanceInfo {
                    id: id.into(),
                    private_ip: ip.into(),
                    ..InstanceInfo::default()
                },
                state,
                state_reason: None,
                reservation_id: "r-1".into(),
                client_token: None,
                raw_user_data: None,
            });
        }
        let got: Vec<String> = (0..3).map(|_| w.allocate_ip(0)).collect();
        assert_eq!(got, ["10.0.0.6", "10.0.0.7", "10.0.0.8"]);
    }

    #[test]
    fn faults_match_type_and_optional_zone() {
        let mut w = World::default();
        w.faults.push(Fault {
            instance_type: "m5.large".into(),
            zone: Some("us-west-2a".into()),
            code: "InsufficientInstanceCapacity".into(),
        });
        assert!(w.fault_for("m5.large", "us-west-2a").is_some());
        assert!(w.fault_for("m5.large", "us-west-2b").is_none());
        assert!(w.fault_for("c5.large", "us-west-2a").is_none());
    }
}
