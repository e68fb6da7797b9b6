//! The shared rate limiter: GCRA ([`scripts::GCRA`]) (the generic cell rate algorithm, as in `redis-cell` and
//! Stripe's limiters) in one Lua call, so every chirp process that shares the Redis counts
//! together. One hash per (subject, class) holds each rate's theoretical arrival time (TAT, µs
//! on the Redis clock); the feature is [`crate::http::limits`].

use crate::cache::{Cache, CacheUnavailable, scripts};

/// One rate: at most `count` requests per `period_us` µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub period_us: u64,
}

impl Rate {
    /// The emission interval, µs.
    pub fn interval_us(self) -> u64 {
        self.period_us / u64::from(self.count.max(1))
    }
}

/// What the limiter decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The rate nearest to exhaustion (index into the rates asked).
    pub rate: usize,
    /// Requests that rate still allows now.
    pub remaining: u64,
    /// µs until that rate is fully replenished.
    pub reset_us: u64,
    /// µs until a denied request would be allowed (0 if allowed).
    pub retry_after_us: u64,
}

impl Cache {
    /// Counts one request of the subject whose limiter hash is `{p}:{subject}:rl:{class}`
    /// against `rates`, in one round trip. `subject` is the hash tag's content (`u42`,
    /// `i127.0.0.1`).
    pub async fn gcra(
        &self,
        subject: &str,
        class: &str,
        rates: &[Rate],
    ) -> Result<Decision, CacheUnavailable> {
        let inner = self.live()?;
        let mut inv = scripts::GCRA.key(inner.keys.rate_limit(subject, class));
        inv.arg(rates.len());
        for (i, r) in rates.iter().enumerate() {
            inv.arg(i).arg(r.interval_us()).arg(r.period_us);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv);
        let ((allowed, rate, remaining, reset_us, retry_after_us),): ((i64, i64, i64, i64, i64),) =
            self.run(&pipe).await?;
        Ok(Decision {
            allowed: allowed == 1,
            rate: usize::try_from(rate).unwrap_or(0),
            remaining: u64::try_from(remaining).unwrap_or(0),
            reset_us: u64::try_from(reset_us).unwrap_or(0),
            retry_after_us: u64::try_from(retry_after_us).unwrap_or(0),
        })
    }
}

/// The same GCRA in process memory, for when Redis is down (each process then counts alone).
/// Holds one TAT per (subject, class, rate); entries past their period are dropped as it grows.
#[derive(Debug, Default)]
pub struct LocalGcra {
    tats: std::sync::Mutex<std::collections::HashMap<String, (u64, u64)>>,
}

/// Most entries the in-process limiter keeps before it drops the expired ones.
const LOCAL_PRUNE_AT: usize = 100_000;

impl LocalGcra {
    /// [`Cache::gcra`] in process, at `now_us`.
    pub fn check(&self, subject: &str, class: &str, rates: &[Rate], now_us: u64) -> Decision {
        let mut tats = match self.tats.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        if tats.len() > LOCAL_PRUNE_AT {
            tats.retain(|_, (tat, period)| *tat + *period > now_us);
        }
        let keys: Vec<String> = (0..rates.len())
            .map(|i| format!("{subject}:{class}:{i}"))
            .collect();
        let mut decision = Decision {
            allowed: true,
            rate: 0,
            remaining: u64::MAX,
            reset_us: 0,
            retry_after_us: 0,
        };
        let mut new = Vec::with_capacity(rates.len());
        for (i, (rate, key)) in rates.iter().zip(&keys).enumerate() {
            let tat = tats.get(key).map_or(now_us, |t| t.0.max(now_us));
            let next = tat + rate.interval_us();
            let (remaining, reset) = if next - now_us > rate.period_us {
                decision.allowed = false;
                decision.retry_after_us =
                    decision.retry_after_us.max(next - rate.period_us - now_us);
                (0, tat - now_us)
            } else {
                new.push((key.clone(), next, rate.period_us));
                (
                    (rate.period_us - (next - now_us)) / rate.interval_us().max(1),
                    next - now_us,
                )
            };
            if remaining < decision.remaining {
                (decision.rate, decision.remaining, decision.reset_us) = (i, remaining, reset);
            }
        }
        if decision.allowed {
            for (key, next, period) in new {
                tats.insert(key, (next, period));
            }
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_gcra_allows_a_burst_of_count_then_one_per_interval() {
        let limiter = LocalGcra::default();
        let rates = [Rate {
            count: 5,
            period_us: 60_000_000,
        }];
        let t0 = 1_000_000_000;
        for i in 0..5 {
            let d = limiter.check("u1", "tweet", &rates, t0);
            assert!(d.allowed, "request {i}");
            assert_eq!(d.remaining, 4 - i);
        }
        let denied = limiter.check("u1", "tweet", &rates, t0);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_us, 12_000_000, "one emission interval");
        assert!(
            limiter
                .check("u1", "tweet", &rates, t0 + 12_000_000)
                .allowed
        );
        assert!(
            limiter.check("u2", "tweet", &rates, t0).allowed,
            "per subject"
        );
    }
}
