//! The backlog cache: each active channel's newest messages in Redis, read by polls and
//! filled on a miss.

use crate::cache::backlog::backlog_key;
use crate::cache::{Guard, Update};
use crate::time::{self};

use super::{ChatState, MessageRow, after_in_db};

/// A message as a backlog member: `"{id}|{user_id}|{created_at µs}|{content}"`.
pub(super) fn encode(row: &MessageRow) -> Vec<u8> {
    format!(
        "{}|{}|{}|{}",
        row.id,
        row.user_id,
        time::to_micros(row.created_at),
        row.content
    )
    .into_bytes()
}

fn decode(channel_id: i64, member: &[u8]) -> Option<MessageRow> {
    let mut parts = std::str::from_utf8(member).ok()?.splitn(4, '|');
    Some(MessageRow {
        channel_id,
        id: parts.next()?.parse().ok()?,
        user_id: parts.next()?.parse().ok()?,
        created_at: time::from_micros(parts.next()?.parse().ok()?),
        content: parts.next()?.to_owned(),
    })
}

/// Up to `limit + 1` messages after `after` from the cached backlog, if it can answer: it
/// covers `after + 1`, holds a run of ids without a hole from there, and that run reaches
/// `last` (the channel's last id, read from Postgres before) or fills the page. Appends reach
/// Redis after their commit and without an outbox row, so a backlog may end short of `last`:
/// such a poll reads Postgres and puts the missing tail back into the backlog (read repair).
/// `None`: read Postgres (on a miss, this loads the backlog for the next poll first).
pub(super) async fn cached_after(
    chat: &ChatState,
    channel: i64,
    after: i64,
    last: i64,
    limit: usize,
) -> sqlx::Result<Option<Vec<MessageRow>>> {
    let cache = &chat.cache;
    if !cache.available() {
        return Ok(None);
    }
    let key = backlog_key(channel);
    let upper = after.saturating_add(limit as i64 + 2);
    match cache
        .range(
            key,
            Some(upper),
            Some(after),
            limit + 1,
            false,
            Default::default(),
        )
        .await
        .map(crate::cache::Range::hit)
    {
        Ok(Some(window)) => {
            let covers = window.complete || window.floor.is_some_and(|f| f <= after + 1);
            let mut rows: Vec<MessageRow> = window
                .items
                .iter()
                .filter_map(|member| decode(channel, member))
                .collect();
            rows.reverse();
            let contiguous = rows
                .iter()
                .enumerate()
                .all(|(i, r)| r.id == after + 1 + i as i64);
            if !(covers && contiguous) {
                return Ok(None);
            }
            let reached = rows.last().map_or(after, |r| r.id);
            if rows.len() > limit || reached >= last {
                return Ok(Some(rows));
            }
            // A lost or late append: the tail from Postgres, and back into the backlog.
            let missing = after_in_db(&chat.db, channel, reached, limit).await?;
            if !missing.is_empty() {
                let entries = missing.iter().map(|r| (r.id, encode(r))).collect();
                let repair = Update::Merge {
                    list: key,
                    guard: Guard::None,
                    after: None,
                    entries,
                };
                cache.apply_best_effort(&[repair]).await;
            }
            rows.extend(missing);
            rows.truncate(limit + 1);
            Ok(Some(rows))
        }
        Ok(None) => {
            load_backlog(chat, channel).await?;
            Ok(None)
        }
        Err(_) => Ok(None),
    }
}

/// Fills a missing backlog with the channel's newest messages (one loader per channel in this
/// process; refused if a send landed meanwhile).
async fn load_backlog(chat: &ChatState, channel: i64) -> sqlx::Result<()> {
    let key = backlog_key(channel);
    let Some(flight) = chat.cache.flight(key) else {
        return Ok(());
    };
    let _loading = flight.acquire().await;
    let Ok(generation) = chat.cache.begin_load(key).await else {
        return Ok(());
    };
    let rows: Vec<MessageRow> = sqlx::query_as(
        "select channel_id, id, user_id, content, created_at from chat_messages
         where channel_id = $1 order by id desc limit $2",
    )
    .bind(channel)
    .bind(chat.backlog as i64 + 1)
    .fetch_all(&chat.db)
    .await?;
    let complete = rows.len() <= chat.backlog;
    let entries: Vec<_> = rows
        .iter()
        .take(chat.backlog)
        .map(|r| (r.id, encode(r)))
        .collect();
    let _ = chat.cache.fill(key, &generation, complete, &entries).await;
    Ok(())
}
