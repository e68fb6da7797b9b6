//! The periodic cleanup, one process at a time: backlogs trimmed, idle ones dropped.

use std::time::Duration;

use super::ChatState;

/// One cleanup pass (at most one process at a time, by an advisory lock): trims every cached
/// backlog to the newest `backlog` messages and drops those of channels without a message for
/// `idle`. Returns `(trimmed, dropped)`, or `None` if another process holds the lock or Redis
/// is unavailable.
///
/// # Errors
/// Postgres failed.
pub async fn cleanup(chat: &ChatState) -> sqlx::Result<Option<(usize, usize)>> {
    let mut tx = chat.db.begin().await?;
    let locked: bool =
        sqlx::query_scalar("select pg_try_advisory_xact_lock(hashtextextended('chat-cleanup', 0))")
            .fetch_one(&mut *tx)
            .await?;
    if !locked {
        return Ok(None);
    }
    let Ok(cached) = chat.cache.cached_backlogs().await else {
        return Ok(None);
    };
    let idle: Vec<i64> = sqlx::query_scalar(
        "select id from chat_channels
         where id = any($1) and last_activity_at < now() - make_interval(secs => $2)",
    )
    .bind(&cached)
    .bind(chat.idle.as_secs_f64())
    .fetch_all(&mut *tx)
    .await?;
    let active: Vec<i64> = cached
        .iter()
        .copied()
        .filter(|c| !idle.contains(c))
        .collect();
    let done = chat.cache.drop_backlogs(&idle).await.is_ok()
        && chat
            .cache
            .trim_backlogs(&active, chat.backlog)
            .await
            .is_ok();
    tx.commit().await?;
    Ok(done.then_some((active.len(), idle.len())))
}

/// How often the cleanup runs.
pub const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// Runs [`cleanup`] every [`CLEANUP_EVERY`] until `stop` (in `chirp serve` and `chirp worker`).
pub async fn cleanup_loop(chat: ChatState, mut stop: tokio::sync::watch::Receiver<bool>) {
    if !chat.cache.enabled() {
        return;
    }
    let mut tick = tokio::time::interval(CLEANUP_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if let Err(e) = cleanup(&chat).await {
            tracing::warn!(error = %e, "chat cleanup failed");
        }
    }
}
