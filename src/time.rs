//! Timestamps: the wire format and the unique-timestamp clock.
//!
//! Every listing is ordered by `created_at`, and clients page with `created_at__lt` set to the last
//! item's timestamp, so timestamps must be unique within a listing or a page boundary could skip or
//! repeat items. chirp makes tweet and friendship timestamps unique across the whole table (a
//! newsfeed row copies its tweet's): [`next_timestamp`] hands out strictly increasing microseconds
//! within a process (like the time part of a Twitter snowflake), and a unique index catches the
//! rare collision between two processes, which the writer retries with a fresh timestamp.

use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// A UTC timestamp with microsecond precision (the precision of Postgres `timestamptz`).
pub type Timestamp = DateTime<Utc>;

static LAST_MICROS: AtomicI64 = AtomicI64::new(0);

/// A timestamp strictly greater than every one this process handed out before, and not earlier
/// than the wall clock (microseconds).
pub fn next_timestamp() -> Timestamp {
    let now = Utc::now().timestamp_micros();
    let prev = LAST_MICROS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or(now);
    from_micros(now.max(prev + 1))
}

/// Microseconds since the Unix epoch; also the score of a cached list entry.
pub fn to_micros(t: Timestamp) -> i64 {
    t.timestamp_micros()
}

/// The inverse of [`to_micros`]; out-of-range values clamp to the representable range.
pub fn from_micros(us: i64) -> Timestamp {
    DateTime::from_timestamp_micros(us).unwrap_or(if us < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}

/// `2026-11-21T09:16:11.005227Z`: RFC 3339, UTC, exactly six fractional digits.
pub fn format(t: &Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Serde `serialize_with` for [`fn@format`].
pub fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(t))
}

/// Serde `serialize_with` for an optional timestamp: [`fn@format`], or `null`.
pub fn serialize_option<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&format(t)),
        None => s.serialize_none(),
    }
}

/// Parses a cursor parameter: any RFC 3339 timestamp, including its space-separated form
/// (`2026-11-21 09:16:11.005227Z`, which RFC 3339 allows in place of `T`). A `+` offset that
/// arrived unescaped in a query string (and so was decoded as a space) is accepted too.
/// Precision beyond microseconds is truncated, as Postgres would.
pub fn parse_cursor(raw: &str) -> Option<Timestamp> {
    let mut fixed = raw.trim().to_owned();
    if fixed.as_bytes().get(10) == Some(&b' ') {
        fixed.replace_range(10..11, "T");
    }
    let fixed = fixed.replace(' ', "+");
    let t = DateTime::parse_from_rfc3339(&fixed)
        .ok()?
        .with_timezone(&Utc);
    Some(from_micros(to_micros(t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_strictly_increasing() {
        let mut last = next_timestamp();
        for _ in 0..10_000 {
            let t = next_timestamp();
            assert!(t > last);
            last = t;
        }
    }

    #[test]
    fn wire_format_has_six_fractional_digits() {
        let t = parse_cursor("2026-11-21T09:16:11.0052Z").unwrap();
        assert_eq!(format(&t), "2026-11-21T09:16:11.005200Z");
        let t = parse_cursor("2026-11-21T10:16:11.005227 01:00").unwrap();
        assert_eq!(format(&t), "2026-11-21T09:16:11.005227Z");
        let t = parse_cursor("2026-11-21 09:16:11.005227Z").unwrap();
        assert_eq!(format(&t), "2026-11-21T09:16:11.005227Z");
        let t = parse_cursor("2026-11-21 10:16:11.005227 01:00").unwrap();
        assert_eq!(format(&t), "2026-11-21T09:16:11.005227Z");
        assert!(parse_cursor("yesterday").is_none());
    }
}
