//! The durable invalidation outbox, and the monitor that brings Redis back into use.
//!
//! When a cache update after a committed write can not reach Redis, the keys it would have
//! touched are inserted into `cache_outbox`. Before this process uses Redis again, and every
//! second while it does (rows may come from other processes), the rows are replayed in order: each
//! list is invalidated (dropped, generation bumped) and each object deleted, so the next read
//! reloads it from Postgres with every write included.

use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;

use crate::cache::{Cache, CacheUnavailable, Keys, scripts};

/// Records keys to invalidate later (`(key, is_list)`). Logs if even Postgres fails: there is
/// nothing more to do then, and the lists age out with their TTL.
pub async fn record(db: &PgPool, keys: &[(String, bool)]) {
    let (names, lists): (Vec<String>, Vec<bool>) = keys.iter().cloned().unzip();
    let result = sqlx::query(
        "insert into cache_outbox (key, is_list) select * from unnest($1::text[], $2::bool[])",
    )
    .bind(&names)
    .bind(&lists)
    .execute(db)
    .await;
    match result {
        Ok(_) => tracing::info!(keys = names.len(), "cache update deferred to the outbox"),
        Err(e) => {
            tracing::error!(error = %e, keys = ?names, "could not record cache invalidations")
        }
    }
}

/// Replays every outbox row; returns how many were applied.
///
/// # Errors
/// Redis or Postgres failed; the rows not yet applied stay in the table.
pub async fn replay(cache: &Cache, db: &PgPool) -> anyhow::Result<usize> {
    let Some(ttl) = cache.ttl() else { return Ok(0) };
    let mut done = 0;
    loop {
        let rows: Vec<(i64, String, bool)> =
            sqlx::query_as("select id, key, is_list from cache_outbox order by id limit 500")
                .fetch_all(db)
                .await?;
        if rows.is_empty() {
            return Ok(done);
        }
        let mut pipe = redis::pipe();
        for (_, key, is_list) in &rows {
            if *is_list {
                let mut inv = scripts::INVALIDATE.key(key);
                inv.key(Keys::gen_of(key)).arg(ttl);
                pipe.invoke_script(&inv).ignore();
            } else {
                pipe.cmd("DEL").arg(key).ignore();
            }
        }
        cache
            .run_unchecked::<()>(&pipe)
            .await
            .map_err(|CacheUnavailable| anyhow::anyhow!("redis unavailable"))?;
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        sqlx::query("delete from cache_outbox where id = any($1)")
            .bind(&ids)
            .execute(db)
            .await?;
        done += rows.len();
    }
}

/// If Redis answers, replays the outbox and marks Redis usable; returns whether it is usable.
pub async fn recover(cache: &Cache, db: &PgPool) -> bool {
    let Some(inner) = &cache.inner else {
        return false;
    };
    if !cache.ping().await {
        return false;
    }
    if let Err(e) = replay(cache, db).await {
        tracing::warn!(error = %e, "outbox replay failed");
        return false;
    }
    let was_up = inner.healthy.swap(true, Ordering::AcqRel);
    if !was_up {
        // Writers that saw Redis down may have recorded rows during the first replay.
        if let Err(e) = replay(cache, db).await {
            inner.healthy.store(false, Ordering::Release);
            tracing::warn!(error = %e, "outbox replay failed");
            return false;
        }
        tracing::info!("redis available; cache in use");
    }
    true
}

/// Runs until `shutdown`: every 500 ms while Redis is down, tries to [`recover`]; every second
/// while it is up, replays outbox rows that other processes recorded.
pub async fn monitor(cache: Cache, db: PgPool, mut shutdown: watch::Receiver<bool>) {
    if !cache.enabled() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        n += 1;
        if !cache.available() {
            recover(&cache, &db).await;
        } else if n.is_multiple_of(2) {
            let pending: Result<bool, _> =
                sqlx::query_scalar("select exists (select 1 from cache_outbox)")
                    .fetch_one(&db)
                    .await;
            if matches!(pending, Ok(true))
                && let Err(e) = replay(&cache, &db).await
            {
                tracing::warn!(error = %e, "outbox replay failed");
            }
        }
    }
}
