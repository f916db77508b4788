//! Wall time that moves with tokio's clock: under `#[tokio::test(start_paused = true)]` a test steps
//! join timeouts, backup backoff, release windows and deadlines with `tokio::time::advance`, in no time.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The one clock the plan driver reads; steps get its reading in their view and never read a clock.
#[derive(Clone, Debug)]
pub struct WallClock {
    origin: Timestamp,
    start: tokio::time::Instant,
}

impl WallClock {
    /// The system's wall time now, moving on with tokio's clock from here.
    pub fn system() -> Self {
        Self::starting_at(Timestamp::now())
    }

    pub fn starting_at(origin: Timestamp) -> Self {
        Self {
            origin,
            start: tokio::time::Instant::now(),
        }
    }

    pub fn now(&self) -> Timestamp {
        let elapsed = SignedDuration::try_from(self.start.elapsed()).unwrap_or(SignedDuration::MAX);
        self.origin.checked_add(elapsed).unwrap_or(Timestamp::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn starts_at_its_origin_and_moves_on() {
        let origin: Timestamp = "2026-12-03T10:00:00Z".parse().expect("a timestamp");
        let clock = WallClock::starting_at(origin);
        let first = clock.now();
        assert!(first >= origin && first < origin + SignedDuration::from_secs(60));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert!(clock.now() > first);
    }
}
