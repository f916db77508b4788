//! How `snapdrain drain` (and `snapdrain status --wait`-like followers) end, and the exit code of each.
//! Codes 1 and 2 keep their usual meaning (an error before or while talking to the cluster, a usage
//! error from the argument parser), so scripts can tell "the plan failed" from "the command failed".

use snapdrain::api::status::PlanPhase;

/// How following a plan ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The plan reached Completed (a dry run too).
    Completed,
    /// The plan reached Failed (its rollback ran; the message says why).
    Failed,
    /// The plan reached Aborted (on request or because it was deleted; its rollback ran).
    Aborted,
    /// `--wait-timeout` passed before the plan finished; it keeps running.
    TimedOut,
    /// Ctrl-C, and the person chose to leave the plan running (or could not be asked).
    Interrupted,
    /// `--detach`: the plan was created and is left to the controller.
    Detached,
}

impl Outcome {
    /// The outcome a terminal phase means; None while the plan is still running.
    pub fn of_phase(phase: PlanPhase) -> Option<Self> {
        match phase {
            PlanPhase::Completed => Some(Self::Completed),
            PlanPhase::Failed => Some(Self::Failed),
            PlanPhase::Aborted => Some(Self::Aborted),
            _ => None,
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Self::Completed | Self::Detached => 0,
            Self::Failed => FAILED,
            Self::Aborted => ABORTED,
            Self::TimedOut => TIMED_OUT,
            // 128 + SIGINT, as shells report a command stopped by Ctrl-C.
            Self::Interrupted => INTERRUPTED,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
            Self::TimedOut => "timed-out",
            Self::Interrupted => "interrupted",
            Self::Detached => "detached",
        }
    }
}

/// An error before or while talking to the cluster (bad kubeconfig, unknown node, API refused).
pub const ERROR: u8 = 1;
pub const FAILED: u8 = 3;
pub const ABORTED: u8 = 4;
pub const TIMED_OUT: u8 = 5;
pub const INTERRUPTED: u8 = 130;

/// The exit codes, as `--help` and the README state them.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0    the plan Completed (or --detach: it was created)
  1    error: bad arguments for the cluster, unknown node, API unreachable or refused
  2    usage error (unknown flag, missing value)
  3    the plan Failed (rolled back: the node is uncordoned and left in service; see its message)
  4    the plan was Aborted (snapdrain abort, Ctrl-C + abort, or deletion; rolled back)
  5    --wait-timeout passed before the plan finished; the plan keeps running
  130  interrupted (Ctrl-C) and the plan left running";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ending_has_its_own_code_and_terminal_phases_map_to_them() {
        let all = [
            Outcome::Completed,
            Outcome::Failed,
            Outcome::Aborted,
            Outcome::TimedOut,
            Outcome::Interrupted,
        ];
        let codes: std::collections::BTreeSet<u8> = all.iter().map(|o| o.exit_code()).collect();
        assert_eq!(codes.len(), all.len(), "codes are distinct: {codes:?}");
        assert!(!codes.contains(&ERROR) && !codes.contains(&2));
        assert_eq!(Outcome::Completed.exit_code(), 0);
        assert_eq!(Outcome::Detached.exit_code(), 0);
        assert_eq!(
            Outcome::of_phase(PlanPhase::Failed).map(Outcome::exit_code),
            Some(3)
        );
        assert_eq!(
            Outcome::of_phase(PlanPhase::Aborted).map(Outcome::exit_code),
            Some(4)
        );
        for running in [
            PlanPhase::Pending,
            PlanPhase::BackingUp,
            PlanPhase::Draining,
        ] {
            assert_eq!(Outcome::of_phase(running), None);
        }
        for o in all {
            assert!(
                EXIT_CODES_HELP.contains(&format!("  {} ", o.exit_code())),
                "{o:?} documented"
            );
        }
    }
}
