//! When to try again: the server's `retry-after`, else exponential backoff with jitter.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use crate::config::RetryPolicy;

/// The wait a server asked for: `retry-after-ms` (milliseconds, OpenAI's), else
/// `retry-after` (seconds, or an HTTP date).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(d) = get("retry-after-ms").and_then(parse_retry_after_ms) {
        return Some(d);
    }
    get("retry-after").and_then(|v| parse_retry_after(v, SystemTime::now()))
}

/// `retry-after-ms`: a number of milliseconds (fractions allowed).
pub(crate) fn parse_retry_after_ms(v: &str) -> Option<Duration> {
    let ms: f64 = v.trim().parse().ok()?;
    (ms.is_finite() && ms >= 0.0).then(|| Duration::from_secs_f64(ms / 1000.0))
}

/// `retry-after`: seconds (integer, or a fraction as some servers send), or an HTTP date
/// (a date in the past means now).
pub(crate) fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait before the attempt after `failed_attempt` (1-based): the server's wish if it
/// gave one, else `base_delay * 2^(n-1)`; either capped by `max_delay`. Backoff is shortened
/// by up to a quarter at random so many clients hit by one outage do not return in step.
pub(crate) fn delay(
    policy: &RetryPolicy,
    failed_attempt: u32,
    server: Option<Duration>,
) -> Duration {
    if let Some(d) = server {
        return d.min(policy.max_delay);
    }
    let exp = failed_attempt.saturating_sub(1).min(20);
    let backoff = policy
        .base_delay
        .saturating_mul(1u32 << exp)
        .min(policy.max_delay);
    backoff.mul_f64(1.0 - 0.25 * jitter())
}

/// A number in [0, 1) that differs between calls; std's randomly keyed hasher is random
/// enough for spreading retries and needs no extra dependency.
fn jitter() -> f64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("1.5", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        // A date already past: go now.
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
        assert_eq!(
            parse_retry_after_ms("250"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_retry_after_ms("x"), None);
    }

    #[test]
    fn retry_after_ms_header_wins() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("20"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(20)));
        h.insert("retry-after-ms", HeaderValue::from_static("120"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(120)));
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let p = RetryPolicy {
            max_retries: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for (n, full) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (30, 1000),
        ] {
            let d = delay(&p, n, None).as_millis() as u64;
            assert!(d <= full && d >= full * 3 / 4, "attempt {n}: {d} vs {full}");
        }
        // The server's wish is honoured but capped.
        assert_eq!(delay(&p, 1, Some(Duration::ZERO)), Duration::ZERO);
        assert_eq!(
            delay(&p, 1, Some(Duration::from_secs(60))),
            Duration::from_secs(1)
        );
    }
}
