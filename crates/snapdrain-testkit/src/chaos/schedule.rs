//! What a chaos run does, decided from its seed alone (pure): which disruption each plan comes from, and
//! which faults hit while it runs, at which moment.

use serde_json::{Value, json};

use super::rng::Rng;

/// Where a plan comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// An Execute plan with a replacement launched after the drain.
    ExecuteReplace,
    /// An Execute plan, no replacement.
    Execute,
    /// What `snapdrain drain NODE --replace before-drain` creates: source manual, make before break.
    Manual,
    /// Karpenter marks the NodeClaim `Drifted`: a Release plan, Karpenter replaces and drains.
    Drift,
    /// The NodeClaim is deleted (expiry, a person): a forceful Release plan, Karpenter terminates.
    NodeClaimDeleted,
    /// EC2's spot interruption notice for the node's instance: Karpenter, reading its interruption
    /// queue, deletes the NodeClaim at once (a forceful Release plan), and EC2 reclaims the instance at
    /// the notice's deadline whatever was drained.
    SpotInterruption,
    /// Cluster Autoscaler scales the node down (it found it unneeded): its `ToBeDeletedByClusterAutoscaler`
    /// taint is the signal of a Release plan, and its drain's evictions wait at the eviction gate. The
    /// node is one of CA's node groups, not Karpenter's.
    ClusterAutoscaler,
}

pub const MODES: [Mode; 7] = [
    Mode::ExecuteReplace,
    Mode::Execute,
    Mode::Manual,
    Mode::Drift,
    Mode::NodeClaimDeleted,
    Mode::SpotInterruption,
    Mode::ClusterAutoscaler,
];

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExecuteReplace => "execute+replace",
            Self::Execute => "execute",
            Self::Manual => "manual",
            Self::Drift => "drift",
            Self::NodeClaimDeleted => "nodeclaim-deleted",
            Self::SpotInterruption => "spot-interruption",
            Self::ClusterAutoscaler => "cluster-autoscaler",
        }
    }

    /// Whose node the plan must take: the signal comes from Karpenter's NodeClaim or from CA.
    pub fn owner(self) -> Owner {
        match self {
            Self::Drift | Self::NodeClaimDeleted | Self::SpotInterruption => Owner::Karpenter,
            Self::ClusterAutoscaler => Owner::NodeGroup,
            Self::ExecuteReplace | Self::Execute | Self::Manual => Owner::Any,
        }
    }

    /// Whether the node's capacity comes back (a replacement or Karpenter's drift replacement).
    pub fn replaces(self) -> bool {
        matches!(self, Self::ExecuteReplace | Self::Manual | Self::Drift)
    }
}

/// Whose nodes a mode may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    Any,
    /// A node of a Karpenter NodeClaim.
    Karpenter,
    /// A node of a node group Cluster Autoscaler manages.
    NodeGroup,
}

/// One fault, done from outside the controller.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// A rule for the simulator's `/sim/faults` (api, watch, s3, ec2, admission, velero).
    Rule(Value),
    /// The leading replica dies at once (its in-flight work abandoned); a new replica starts.
    KillLeader,
    /// The leader's Lease renewals fail for this long (its field manager's patches get 503).
    LeaseLoss { ms: u64 },
}

impl Fault {
    /// The name a report counts it under.
    pub fn kind(&self) -> String {
        match self {
            Self::Rule(r) => r
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("api")
                .to_string(),
            Self::KillLeader => "kill".into(),
            Self::LeaseLoss { .. } => "lease-loss".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Timed {
    /// After the plan's disruption starts.
    pub at_ms: u64,
    pub fault: Fault,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Episode {
    pub mode: Mode,
    /// In time order, all within the fault window.
    pub faults: Vec<Timed>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub seed: u64,
    pub episodes: Vec<Episode>,
}

/// Resources the API faults aim at: what the controller reads and writes on a plan's way.
const API_TARGETS: &[(&str, &str)] = &[
    ("patch", "disruptionplans.snapdrain.io/status"),
    ("create", "backups.velero.io"),
    ("get", "backupstoragelocations.velero.io"),
    ("get", "secrets"),
    ("patch", "nodes"),
    ("patch", "pods"),
    ("create", "pods/eviction"),
    ("delete", "nodeclaims.karpenter.sh"),
    ("create", "events"),
];

/// The eviction gate's webhook, as its ValidatingWebhookConfiguration names it
/// ([`crate::gate::HOOK`]): the `admission` faults aim at its calls.
const GATE: &str = crate::gate::HOOK;

/// Watches the controller's caches and its plan controller hold.
const WATCHED: &[&str] = &[
    "disruptionplans.snapdrain.io",
    "backups.velero.io",
    "pods",
    "nodes",
    "nodeclaims.karpenter.sh",
];

/// The schedule of `plans` plans for `seed`: the first plans go through every mode once (in an order
/// the seed picks), later ones any mode; each plan meets three to five faults in the first `window_ms`,
/// and maybe a controller kill and a Lease loss.
pub fn schedule(seed: u64, plans: usize, window_ms: u64) -> Schedule {
    let mut rng = Rng::new(seed);
    let mut modes = MODES.to_vec();
    rng.shuffle(&mut modes);
    let window = window_ms.max(100);
    let episodes = (0..plans)
        .map(|i| {
            let mode = modes.get(i).copied().unwrap_or(*rng.pick(&MODES));
            let mut faults: Vec<Timed> = (0..rng.between(3, 5))
                .flat_map(|_| fault(&mut rng, window))
                .collect();
            if rng.chance(0.5) {
                faults.push(Timed {
                    at_ms: rng.below(window),
                    fault: Fault::KillLeader,
                });
            }
            if rng.chance(0.35) {
                faults.push(Timed {
                    at_ms: rng.below(window),
                    fault: Fault::LeaseLoss {
                        ms: rng.between(1000, 4000),
                    },
                });
            }
            faults.sort_by_key(|t| t.at_ms);
            Episode { mode, faults }
        })
        .collect();
    Schedule { seed, episodes }
}

/// One or two timed faults (a 410 needs a dropped watch to resume from). Rules hold until the plan's
/// fault window ends (the run clears them), but for the outage, a window of its own.
fn fault(rng: &mut Rng, window: u64) -> Vec<Timed> {
    let at_ms = rng.below(window);
    let rule = |v: Value| Fault::Rule(v);
    let one = |fault| vec![Timed { at_ms, fault }];
    match rng.below(11) {
        0 => {
            let (verb, resource) = *rng.pick(API_TARGETS);
            let code = *rng.pick(&[500u16, 503, 429, 409]);
            let rate = *rng.pick(&[0.3, 0.6]);
            one(rule(
                json!({"verb": verb, "resource": resource, "errorRate": rate,
                "errorCode": code}),
            ))
        }
        1 => {
            let (verb, resource) = *rng.pick(API_TARGETS);
            one(rule(json!({"verb": verb, "resource": resource,
                "latencyMs": rng.between(100, 800)})))
        }
        2 => {
            let resource = *rng.pick(WATCHED);
            let drop = json!({"kind": "watch", "resource": resource, "watch": "drop",
                "errorRate": 0.5, "times": rng.between(1, 4)});
            let mut out = one(rule(drop));
            if rng.chance(0.5) {
                out.push(Timed {
                    at_ms,
                    fault: rule(
                        json!({"kind": "watch", "resource": resource, "watch": "gone",
                        "errorRate": 1.0, "times": rng.between(1, 3)}),
                    ),
                });
            }
            out
        }
        3 => {
            let code = *rng.pick(&["SlowDown", "InternalError"]);
            let operation = *rng.pick(&[
                None,
                Some("GetObject"),
                Some("HeadObject"),
                Some("PutObject"),
            ]);
            let mut r = json!({"kind": "s3", "code": code, "errorRate": *rng.pick(&[0.3, 0.6])});
            if let Some(op) = operation {
                r["operation"] = json!(op);
            }
            one(rule(r))
        }
        4 => one(rule(
            json!({"kind": "s3", "latencyMs": rng.between(100, 600)}),
        )),
        5 => one(rule(
            json!({"kind": "s3", "code": "ServiceUnavailable", "errorRate": 1.0,
                "durationMs": rng.between(500, 2500)}),
        )),
        6 => {
            if rng.chance(0.5) {
                one(rule(json!({"kind": "ec2", "code": "RequestLimitExceeded",
                    "errorRate": 0.5})))
            } else {
                one(rule(
                    json!({"kind": "ec2", "code": "InsufficientInstanceCapacity",
                    "operation": *rng.pick(&["RunInstances", "CreateFleet"]),
                    "errorRate": 1.0, "times": rng.between(1, 2)}),
                ))
            }
        }
        // The gate slow (under its 5 s timeoutSeconds, or past it: the call then fails) or down, a
        // share of its calls or all of them for a window; under `failurePolicy: Fail` a failed call
        // refuses the eviction.
        7 => {
            let slow = rng.between(100, 1500);
            let ms = if rng.chance(0.3) { 6000 } else { slow };
            one(rule(
                json!({"kind": "admission", "webhook": GATE, "latencyMs": ms}),
            ))
        }
        8 => {
            let mut r = json!({"kind": "admission", "webhook": GATE,
                "errorRate": *rng.pick(&[0.5, 1.0])});
            if rng.chance(0.5) {
                r["durationMs"] = json!(rng.between(500, 2500));
            }
            one(rule(r))
        }
        9 => one(rule(json!({"kind": "velero", "restart": "server"}))),
        _ => one(rule(json!({"kind": "velero", "restart": "node-agent"}))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule() {
        assert_eq!(schedule(7, 6, 3000), schedule(7, 6, 3000));
        assert_ne!(schedule(7, 6, 3000), schedule(8, 6, 3000));
    }

    #[test]
    fn the_first_plans_go_through_every_mode_and_faults_stay_in_the_window() {
        for seed in 0..50 {
            let s = schedule(seed, MODES.len() + 1, 2000);
            let mut first: Vec<Mode> = s.episodes[..MODES.len()].iter().map(|e| e.mode).collect();
            first.sort();
            assert_eq!(first, MODES.to_vec(), "seed {seed}");
            for e in &s.episodes {
                assert!(e.faults.len() >= 3, "seed {seed}: {e:?}");
                assert!(e.faults.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
                assert!(e.faults.iter().all(|t| t.at_ms < 2000));
            }
        }
    }

    #[test]
    fn the_gate_is_slowed_and_downed_by_name() {
        let rules: Vec<Value> = (0..50)
            .flat_map(|seed| schedule(seed, 8, 3000).episodes)
            .flat_map(|e| e.faults)
            .filter_map(|t| match t.fault {
                Fault::Rule(r) if r["kind"] == "admission" => Some(r),
                _ => None,
            })
            .collect();
        assert!(rules.iter().all(|r| r["webhook"] == crate::gate::HOOK));
        assert!(
            rules.iter().any(|r| r.get("latencyMs").is_some()),
            "some slow gate"
        );
        assert!(
            rules.iter().any(|r| r["latencyMs"] == 6000),
            "some past its timeout"
        );
        assert!(
            rules
                .iter()
                .any(|r| r["errorRate"] == 1.0 && r.get("durationMs").is_some()),
            "some gate down for a window"
        );
    }

    #[test]
    fn every_rule_is_one_the_simulator_accepts() {
        for seed in 0..200 {
            for e in schedule(seed, 5, 3000).episodes {
                for t in e.faults {
                    if let Fault::Rule(r) = t.fault {
                        let rule: snapdrain_sim::apiserver::faults::FaultRule =
                            serde_json::from_value(r.clone())
                                .unwrap_or_else(|e| panic!("{r}: {e}"));
                        rule.validate().unwrap_or_else(|e| panic!("{r}: {e}"));
                    }
                }
            }
        }
    }
}
