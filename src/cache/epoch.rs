//! The epoch fence: Redis that comes back with other data than chirp last wrote (restarted from
//! an RDB/AOF snapshot, failed over to a lagging replica, flushed) must not be trusted, or it
//! would resurrect deleted tweets and revoked tokens that no outbox row remembers.
//!
//! Postgres keeps, per key prefix, the epoch chirp last wrote to `{p}:epoch` and the `run_id`s of
//! the Redis servers that held it (`cache_epoch.redis_run_id`, comma-separated: the one server,
//! or every node of a cluster, replicas included). Redis is trusted only while it holds the
//! epoch and every server that answers as a master is one of those: a restart (empty, or from
//! an old snapshot) gives a server a new `run_id`, a flush or an eviction removes the epoch key.
//! A replica promoted by a cluster failover is trusted: it was recorded, and every cache write
//! of a committed change waited for it (`WAIT`, see [`super::conn`]); writes it did not
//! acknowledge kept their outbox rows, which the relay applies to it. The recorded set follows
//! the topology (a replica that joins, the old master back as a replica). On a mismatch one
//! process at a time (a row lock on `cache_epoch`) clears every key under the prefix, writes a
//! new epoch to Redis and records it with the new servers; until then nobody uses Redis. Processes check at every recovery and every second while Redis is in use, so a
//! silent restart is noticed within about a second (and a restart that broke connections at
//! once).

use anyhow::Context;
use sqlx::PgPool;

use crate::cache::{Cache, CacheUnavailable};

/// What Redis says: the epoch it holds, the `run_id`s of the servers that answer as masters,
/// and of every server (sorted, comma-separated, as recorded).
struct Observed {
    redis_epoch: Option<i64>,
    masters: Vec<String>,
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
    let (masters, run_id) = run_ids(cache).await?;
    Ok(Observed {
        redis_epoch,
        masters,
        run_id,
    })
}

/// The `run_id`s of the servers that answer as masters, and of every server (sorted,
/// comma-separated): the one server, or every node of a cluster.
async fn run_ids(cache: &Cache) -> anyhow::Result<(Vec<String>, String)> {
    let mut session = cache
        .session(false)
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable"))?;
    let mut info = redis::cmd("INFO");
    info.arg("server").arg("replication");
    let replies = session.on_every_node(&info).await.context("INFO")?;
    let (mut masters, mut all) = (Vec::new(), Vec::new());
    for reply in replies {
        let text: String = redis::FromRedisValue::from_redis_value(reply)?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|s| s.trim().to_owned())
        };
        let run_id = field("run_id:").context("INFO has no run_id")?;
        if field("role:").as_deref() != Some("slave") {
            masters.push(run_id.clone());
        }
        all.push(run_id);
    }
    all.sort();
    Ok((masters, all.join(",")))
}

async fn recorded(db: &PgPool, prefix: &str) -> sqlx::Result<Option<(i64, String)>> {
    sqlx::query_as("select epoch, redis_run_id from cache_epoch where prefix = $1")
        .bind(prefix)
        .fetch_optional(db)
        .await
}

fn matches(seen: &Observed, recorded: Option<&(i64, String)>) -> bool {
    recorded.is_some_and(|(epoch, run_ids)| {
        let known: std::collections::HashSet<&str> = run_ids.split(',').collect();
        seen.redis_epoch == Some(*epoch)
            && !seen.masters.is_empty()
            && seen.masters.iter().all(|m| known.contains(m.as_str()))
    })
}

/// Whether Redis holds the epoch Postgres recorded, on the same server.
///
/// # Errors
/// Redis or Postgres could not be asked.
pub async fn is_trusted(cache: &Cache, db: &PgPool) -> anyhow::Result<bool> {
    let keys = cache.keys().ok_or(CacheUnavailable)?;
    let seen = observe(cache).await?;
    let rec = recorded(db, keys.prefix()).await?;
    let trusted = matches(&seen, rec.as_ref());
    if let (true, Some((epoch, run_ids))) = (trusted, rec)
        && run_ids != seen.run_id
    {
        // The topology changed without losing data (a failover to a recorded replica, a
        // replica that joined): record the servers that hold the epoch now.
        sqlx::query("update cache_epoch set redis_run_id = $3 where prefix = $1 and epoch = $2")
            .bind(keys.prefix())
            .bind(epoch)
            .bind(&seen.run_id)
            .execute(db)
            .await?;
        tracing::info!(servers = %seen.run_id, "redis topology changed; epoch kept");
    }
    Ok(trusted)
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
