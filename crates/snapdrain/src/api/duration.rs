//! Go duration strings (`90s`, `1h30m`, `1.5h`, `300ms`), parsed with checked arithmetic.
//!
//! Two readers: spec fields (plans and the policy), bounded to [`MAX_SPEC_DURATION`] so that every
//! deadline computed from them stays in range, and the `karpenter.sh/do-not-disrupt` pod annotation,
//! which a tenant writes and which must parse exactly as Karpenter parses it: Go's `time.ParseDuration`
//! (int64 nanoseconds, so at most about 2,562,047h), with anything it refuses treated as if the
//! annotation were absent (kubernetes-sigs/karpenter `pkg/utils/pod/scheduling.go`,
//! `parseDoNotDisrupt` and `IsDoNotDisruptActive`). No input panics: every step is `checked_*`.

use std::time::Duration;

/// The longest duration a plan or policy field may hold: ten years. Longer values are refused with an
/// error instead of overflowing a deadline (`now + timeout`) somewhere later.
pub const MAX_SPEC_DURATION: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Go's limit: `time.Duration` is an int64 count of nanoseconds.
const GO_MAX_NANOS: u128 = i64::MAX as u128;

/// Why a string is not a duration. Each message says what to write instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("an empty string is not a duration; write it like 90s, 15m or 1h30m")]
    Empty,
    #[error("{0:?} is not a duration; write it like 90s, 15m or 1h30m (units ns, us, ms, s, m, h)")]
    Syntax(String),
    #[error("{0:?} has a number without a unit; write it like 90s, 15m or 1h30m")]
    MissingUnit(String),
    #[error("{value:?} has the unknown unit {unit:?}; use ns, us, ms, s, m or h")]
    UnknownUnit { value: String, unit: String },
    #[error("{0:?} is negative; a duration here must be positive")]
    Negative(String),
    #[error("{0:?} is out of range (a Go duration holds at most 2562047h)")]
    Overflow(String),
    #[error(
        "{value:?} is longer than the {max_hours}h (ten years) snapdrain accepts; write a shorter duration"
    )]
    TooLong { value: String, max_hours: u64 },
}

/// Parses a duration exactly as Go's `time.ParseDuration` does, for non-negative values: an optional
/// `+`, then `0` alone or a sequence of decimal numbers (with an optional fraction) each followed by a
/// unit. Values beyond Go's int64 nanoseconds are [`DurationError::Overflow`], as in Go.
pub fn parse_go_duration(value: &str) -> Result<Duration, DurationError> {
    let syntax = || DurationError::Syntax(value.to_owned());
    let rest = match value.as_bytes().first() {
        None => return Err(DurationError::Empty),
        Some(b'-') => {
            // Go accepts "-0"; every other negative value is refused here (a hold cannot be negative).
            return if &value[1..] == "0" {
                Ok(Duration::ZERO)
            } else {
                Err(DurationError::Negative(value.to_owned()))
            };
        }
        Some(b'+') => &value[1..],
        Some(_) => value,
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(syntax());
    }
    let bytes = rest.as_bytes();
    let mut i = 0;
    let mut total: u128 = 0;
    let overflow = || DurationError::Overflow(value.to_owned());
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let whole = &rest[start..i];
        let mut fraction = "";
        if i < bytes.len() && bytes[i] == b'.' {
            i += 1;
            let f = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            fraction = &rest[f..i];
        }
        if whole.is_empty() && fraction.is_empty() {
            return Err(syntax());
        }
        let u = i;
        while i < bytes.len() && !bytes[i].is_ascii_digit() && bytes[i] != b'.' {
            i += 1;
        }
        let unit = &rest[u..i];
        let scale: u128 = match unit {
            "" => return Err(DurationError::MissingUnit(value.to_owned())),
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(DurationError::UnknownUnit {
                    value: value.to_owned(),
                    unit: unit.to_owned(),
                });
            }
        };
        // The whole part: any number of digits, bounded as it accumulates.
        let mut v: u128 = 0;
        for d in whole.bytes() {
            v = v
                .checked_mul(10)
                .and_then(|v| v.checked_add(u128::from(d - b'0')))
                .filter(|v| *v <= GO_MAX_NANOS)
                .ok_or_else(overflow)?;
        }
        let mut nanos = v.checked_mul(scale).ok_or_else(overflow)?;
        // The fraction, exactly: digits past the 20th cannot reach a nanosecond (10^-20 of an hour is
        // 3.6e-8 ns), so they are dropped, as Go drops digits it cannot hold.
        let taken = &fraction[..fraction.len().min(20)];
        let mut f: u128 = 0;
        let mut denominator: u128 = 1;
        for d in taken.bytes() {
            f = f * 10 + u128::from(d - b'0');
            denominator *= 10;
        }
        nanos += f * scale / denominator;
        total = total
            .checked_add(nanos)
            .filter(|t| *t <= GO_MAX_NANOS)
            .ok_or_else(overflow)?;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| overflow())?;
    // The remainder of a division by 1e9 fits in u32.
    let sub = (total % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

/// Parses a duration field of a plan or policy: a Go duration of at most [`MAX_SPEC_DURATION`].
pub fn parse_spec_duration(value: &str) -> Result<Duration, DurationError> {
    let d = parse_go_duration(value)?;
    if d > MAX_SPEC_DURATION {
        return Err(DurationError::TooLong {
            value: value.to_owned(),
            max_hours: MAX_SPEC_DURATION.as_secs() / 3600,
        });
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Duration {
        parse_go_duration(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    // Expected values from Go's time.ParseDuration documentation and its tests (time/time_test.go,
    // parseDurationTests), written out here rather than computed by the parser under test.
    #[test]
    fn parses_what_go_parses() {
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("+0"), Duration::ZERO);
        assert_eq!(ok("-0"), Duration::ZERO);
        assert_eq!(ok("5s"), Duration::from_secs(5));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("1478s"), Duration::from_secs(1478));
        assert_eq!(ok("+5s"), Duration::from_secs(5));
        assert_eq!(ok("5.0s"), Duration::from_secs(5));
        assert_eq!(ok("5.6s"), Duration::from_millis(5600));
        assert_eq!(ok("5.s"), Duration::from_secs(5));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.004s"), Duration::from_millis(1004));
        assert_eq!(ok("100.00100s"), Duration::from_millis(100_001));
        assert_eq!(ok("10ns"), Duration::from_nanos(10));
        assert_eq!(ok("11us"), Duration::from_micros(11));
        assert_eq!(ok("12µs"), Duration::from_micros(12));
        assert_eq!(ok("12μs"), Duration::from_micros(12));
        assert_eq!(ok("13ms"), Duration::from_millis(13));
        assert_eq!(ok("14s"), Duration::from_secs(14));
        assert_eq!(ok("15m"), Duration::from_secs(900));
        assert_eq!(ok("16h"), Duration::from_secs(57_600));
        assert_eq!(ok("3h30m"), Duration::from_secs(12_600));
        assert_eq!(ok("10.5s4m"), Duration::from_millis(250_500));
        assert_eq!(ok("1h2m3s4ms5us6ns"), Duration::new(3723, 4_005_006));
        assert_eq!(ok("39h9m14.425s"), Duration::from_millis(140_954_425));
        assert_eq!(ok("720h0m0s"), Duration::from_secs(2_592_000));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok("0.000000001s"), Duration::from_nanos(1));
        // Below a nanosecond nothing is kept.
        assert_eq!(ok("0.0000000009s"), Duration::ZERO);
        assert_eq!(
            ok("9223372036854775807ns"),
            Duration::new(9_223_372_036, 854_775_807)
        );
        assert_eq!(
            ok("9223372036s854ms775us807ns"),
            Duration::new(9_223_372_036, 854_775_807)
        );
        assert_eq!(ok("2562047h"), Duration::from_secs(2_562_047 * 3600));
    }

    #[test]
    fn refuses_what_go_refuses_with_a_reason() {
        assert_eq!(parse_go_duration(""), Err(DurationError::Empty));
        for s in [
            "3", "-", "s", ".s", "+.s", "1d", "1.2.3s", "1e3s", " 1s", "1s ", "+",
        ] {
            assert!(parse_go_duration(s).is_err(), "{s:?} must be refused");
        }
        assert!(matches!(
            parse_go_duration("3"),
            Err(DurationError::MissingUnit(_))
        ));
        assert!(matches!(
            parse_go_duration("1d"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_go_duration("-5m"),
            Err(DurationError::Negative(_))
        ));
    }

    /// The security review's C-2: these panicked in kube-core's parser (float overflow in
    /// `Duration::mul_f64`). Go refuses them as out of range, and so does this parser.
    #[test]
    fn overflow_is_an_error_never_a_panic() {
        for s in [
            "9999999999999999h",
            "9223372036854775808ns",
            "2562048h",
            "9223372036s854ms775us808ns",
            "99999999999999999999999999999999999999999999h",
            "1h99999999999999999999999999999999999999999999999s",
            "18446744073709551616s",
        ] {
            assert!(
                matches!(parse_go_duration(s), Err(DurationError::Overflow(_))),
                "{s:?}: {:?}",
                parse_go_duration(s)
            );
        }
        let long = "9".repeat(10_000) + "h";
        assert!(parse_go_duration(&long).is_err());
    }

    #[test]
    fn spec_durations_stop_at_ten_years_with_a_message_that_says_so() {
        assert_eq!(parse_spec_duration("87600h"), Ok(MAX_SPEC_DURATION));
        let err = parse_spec_duration("87601h").expect_err("longer than ten years");
        assert!(err.to_string().contains("87600h"), "{err}");
        assert!(matches!(
            parse_spec_duration("9999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }
}
