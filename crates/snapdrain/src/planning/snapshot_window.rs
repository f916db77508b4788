//! EC2's per-volume snapshot window: "Wait at least 15 seconds between concurrent volume snapshots"
//! (EC2 API reference, "Error codes", `SnapshotCreationPerVolumeRateExceeded`). A volume snapshotted
//! moments ago (by an earlier plan for the node its pod just left, by Velero's CSI snapshot, by anyone)
//! cannot be cut again until the window ends. Retrying with the error backoff (1, 2, 4, 8 s) can miss a
//! short deadline by seconds, so the emergency path reads when each volume's newest snapshot began and
//! cuts the set when the last window ends, and says so at once, against the deadline.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

/// EC2's least time between two snapshots of one volume.
pub const PER_VOLUME_INTERVAL: Duration = Duration::from_secs(15);

/// Added to the window: EC2's clock and ours differ a little, and a cut one instant early is refused
/// again (harmless, but it costs a round trip and a wait).
pub const CLOCK_MARGIN: Duration = Duration::from_secs(1);

/// The newest snapshot of a volume, as DescribeSnapshots answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastSnapshot {
    pub volume_id: String,
    pub snapshot_id: String,
    pub started: Timestamp,
}

/// When a set EC2 refused for its per-volume rate may be cut: the end of the latest window among
/// `last` (each start plus [`PER_VOLUME_INTERVAL`] and [`CLOCK_MARGIN`]), and never sooner than
/// [`CLOCK_MARGIN`] from `now` (no newest snapshot found: EC2 knows of one we cannot see, so look again
/// shortly), rounded up to a whole second. Also answers which snapshot holds the window.
pub fn cut_at(last: &[LastSnapshot], now: Timestamp) -> (Timestamp, Option<&LastSnapshot>) {
    let soonest = later(now, CLOCK_MARGIN);
    let holder = last.iter().max_by_key(|s| s.started);
    let end = holder.map_or(soonest, |s| {
        later(s.started, PER_VOLUME_INTERVAL + CLOCK_MARGIN)
    });
    (whole_second_up(end.max(soonest)), holder)
}

/// `t` rounded up to a whole second: a status time is written at second precision, so the instant
/// recorded is the instant waited for (and a pass that reads it back sees no change).
fn whole_second_up(t: Timestamp) -> Timestamp {
    if t.subsec_nanosecond() == 0 {
        return t;
    }
    Timestamp::from_second(t.as_second().saturating_add(1)).unwrap_or(Timestamp::MAX)
}

/// `t` plus `d`, or the last representable instant (only a corrupt clock gets there).
fn later(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// What the plan says when EC2 makes it wait: which volume, since when, until when, and whether the
/// cut can still come before the deadline.
pub fn delayed_message(
    node: &str,
    holder: Option<&LastSnapshot>,
    at: Timestamp,
    now: Timestamp,
    deadline: Timestamp,
) -> String {
    let wait = at.duration_since(now).as_secs_f64().max(0.0);
    let why = match holder {
        Some(s) => format!(
            "volume {} was last snapshotted at {} ({}), and EC2 takes one snapshot of a volume per {} s",
            s.volume_id,
            s.started,
            s.snapshot_id,
            PER_VOLUME_INTERVAL.as_secs()
        ),
        None => "EC2 refused the cut for its per-volume snapshot rate (SnapshotCreationPerVolumeRateExceeded) but shows no recent snapshot of these volumes".to_string(),
    };
    let fits = if at < deadline {
        format!(
            "{:.0} s before the deadline ({deadline})",
            deadline.duration_since(at).as_secs_f64()
        )
    } else {
        format!(
            "AFTER the deadline ({deadline}): if the node goes at the deadline, what its pods wrote since that snapshot is lost with it"
        )
    };
    format!("node {node}: EC2 snapshots wait {wait:.1} s: {why}; cutting at {at}, {fits}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("a valid second")
    }

    fn last(volume: &str, started: i64) -> LastSnapshot {
        LastSnapshot {
            volume_id: volume.into(),
            snapshot_id: format!("snap-{volume}"),
            started: at(started),
        }
    }

    #[test]
    fn the_cut_waits_for_the_latest_window_among_the_volumes() {
        let found = [last("vol-a", 0), last("vol-b", 4), last("vol-c", -30)];
        let (when, holder) = cut_at(&found, at(5));
        assert_eq!(when, at(4 + 15 + 1));
        assert_eq!(holder.map(|s| s.volume_id.as_str()), Some("vol-b"));
    }

    #[test]
    fn the_instant_is_a_whole_second_so_the_status_keeps_it_exactly() {
        let mut s = last("vol-a", 0);
        s.started = Timestamp::new(1_800_000_000, 250_000_000).expect("a valid instant");
        assert_eq!(cut_at(&[s], at(0)).0, at(17));
    }

    #[test]
    fn a_window_already_past_or_unseen_looks_again_a_margin_from_now() {
        assert_eq!(cut_at(&[last("vol-a", -60)], at(0)).0, at(1));
        let (when, holder) = cut_at(&[], at(0));
        assert_eq!((when, holder), (at(1), None));
    }

    #[test]
    fn the_message_says_whether_the_cut_comes_before_the_deadline() {
        let s = last("vol-a", 0);
        let before = delayed_message("n1", Some(&s), at(16), at(3), at(20));
        for want in [
            "node n1",
            "vol-a",
            "snap-vol-a",
            "13.0 s",
            "15 s",
            "4 s before the deadline",
        ] {
            assert!(before.contains(want), "{want}: {before}");
        }
        let after = delayed_message("n1", Some(&s), at(16), at(3), at(10));
        assert!(after.contains("AFTER the deadline"), "{after}");
        assert!(after.contains("lost with it"), "{after}");
        let unseen = delayed_message("n1", None, at(4), at(3), at(10));
        assert!(
            unseen.contains("SnapshotCreationPerVolumeRateExceeded"),
            "{unseen}"
        );
    }
}
