//! The epoch fence: Redis that comes back with other data than chirp last wrote (restarted from
//! an RDB/AOF snapshot, failed over to a lagging replica, flushed) must not be trusted, or it
//! would resurrect deleted tweets and revoked tokens that no outbox row remembers.
//!
//! Postgres keeps, per key prefix, the epoch chirp last wrote to `{p}:epoch` and the `run_id` of
//! the Redis server it wrote it to (`cache_epoch`). Redis is trusted only while both match: a
//! restart or failover changes the `run_id`, a flush or an eviction removes the epoch key. On a
//! mismatch one process at a time (a row lock on `cache_epoch`) clears every key under the
//! prefix, writes a new epoch to Redis and records it with the new `run_id`; until then nobody
//! uses Redis. Processes check at every recovery and every second while Redis is in use, so a
//! silent restart is noticed within about a second (and a restart that broke connections at
//! once).

use anyhow::Context;
use sqlx::PgPool;

use crate::cache::{Cache, CacheUnavailable};

/// What Redis and Postgres say: `(epoch in Redis, Redis run_id)` and `(epoch, run_id)` recorded.
struct Observed {
    redis_epoch: Option<i64>,
    run_id: String,
}

async fn observe(cache: &Cache) -> anyhow::Result<Observed> {
    let keys = cache.keys().ok_or(CacheUnavailable)?;
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(keys.epoch());
    let (redis_epoch,): (Option<i64>,) = cache
        .run_unchecked(&pipe, 1)
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable"))?;
    let run_id = run_ids(cache).await?;
    Ok(Observed {
        redis_epoch,
        run_id,
    })
}

/// The `run_id` of the Redis server, or of every cluster master (sorted, comma-separated): a
/// restart or a failover of any shard changes it, and the fence then clears the prefix.
async fn run_ids(cache: &Cache) -> anyhow::Result<String> {
    let mut session = cache
        .session(false)
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable"))?;
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let replies = session
        .on_every_master(&info)
        .await
        .context("INFO server")?;
    let mut ids = replies
        .into_iter()
        .map(|reply| {
            let text: String = redis::FromRedisValue::from_redis_value(reply)?;
            text.lines()
                .find_map(|l| l.strip_prefix("run_id:"))
                .map(|s| s.trim().to_owned())
                .context("INFO server has no run_id")
        })
        .collect::<anyhow::Result<Vec<String>>>()?;
    ids.sort();
    Ok(ids.join(","))
}

async fn recorded(db: &PgPool, prefix: &str) -> sqlx::Result<Option<(i64, String)>> {
    sqlx::query_as("select epoch, redis_run_id from cache_epoch where prefix = $1")
        .bind(prefix)
        .fetch_optional(db)
        .await
}

fn matches(seen: &Observed, recorded: Option<&(i64, String)>) -> bool {
    recorded
        .is_some_and(|(epoch, run_id)| seen.redis_epoch == Some(*epoch) && seen.run_id == *run_id)
}

/// Whether Redis holds the epoch Postgres recorded, on the same server.
///
/// # Errors
/// Redis or Postgres could not be asked.
pub async fn is_trusted(cache: &Cache, db: &PgPool) -> anyhow::Result<bool> {
    let keys = cache.keys().ok_or(CacheUnavailable)?;
    let seen = observe(cache).await?;
    let rec = recorded(db, keys.prefix()).await?;
    Ok(matches(&seen, rec.as_ref()))
}

/// Makes Redis trustworthy: if its epoch or server differs from what Postgres recorded, clears
/// every key under the prefix and starts a new epoch. Returns whether it fenced.
///
/// # Errors
/// Redis or Postgres failed; Redis must not be used then.
pub async fn verify(cache: &Cache, db: &PgPool) -> anyhow::Result<bool> {
    if is_trusted(cache, db).await? {
        return Ok(false);
    }
    let keys = cache.keys().ok_or(CacheUnavailable)?;
    let prefix = keys.prefix().to_owned();
    let mut tx = db.begin().await.context("starting the epoch fence")?;
    sqlx::query(
        "insert into cache_epoch (prefix, epoch, redis_run_id) values ($1, 0, '')
         on conflict (prefix) do nothing",
    )
    .bind(&prefix)
    .execute(&mut *tx)
    .await?;
    let locked: (i64, String) =
        sqlx::query_as("select epoch, redis_run_id from cache_epoch where prefix = $1 for update")
            .bind(&prefix)
            .fetch_one(&mut *tx)
            .await?;
    // Another process may have fenced while we waited for the lock.
    let seen = observe(cache).await?;
    if matches(&seen, Some(&locked)) {
        return Ok(false);
    }
    let epoch = locked.0;
    let cleared = cache
        .clear()
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable while clearing"))?;
    let next = epoch + 1;
    let mut pipe = redis::pipe();
    pipe.cmd("SET").arg(keys.epoch()).arg(next).ignore();
    cache
        .run_unchecked_durable::<()>(&pipe, 1)
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable while writing the epoch"))?;
    sqlx::query("update cache_epoch set epoch = $2, redis_run_id = $3 where prefix = $1")
        .bind(&prefix)
        .bind(next)
        .bind(&seen.run_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await.context("recording the new epoch")?;
    if let Some(stats) = cache.stats() {
        stats
            .fences
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if locked.1.is_empty() {
        tracing::info!(
            epoch = next,
            cleared,
            "cache epoch started for this prefix (first use, or after writes around the cache)"
        );
    } else {
        tracing::warn!(
            epoch = next,
            cleared,
            run_id = %seen.run_id,
            "redis did not hold the recorded epoch (restart, failover or flush): cleared the prefix"
        );
    }
    Ok(true)
}

/// Forgets the recorded epoch of `prefix`, so that the next process that uses Redis fences it
/// (clears the prefix) before trusting it. Called whenever chirp writes around the cache: a
/// process running with `CHIRP_CACHE=off`, and `chirp import`.
///
/// # Errors
/// Postgres failed.
pub async fn forget(db: &PgPool, prefix: &str) -> sqlx::Result<()> {
    sqlx::query("delete from cache_epoch where prefix = $1")
        .bind(prefix)
        .execute(db)
        .await
        .map(|_| ())
}
