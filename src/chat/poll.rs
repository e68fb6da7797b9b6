//! Polls and long-polls: what came after a caller's position, and the wake-ups of waiters
//! when a message arrives in any process ([`Hub`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;

use crate::cache::pubsub::Subscriber;
use crate::error::{ApiError, ApiResult};

use super::{ChatState, Message, MessageRow, POLL_WHILE_DOWN, TOPIC, cached_after, messages};

/// The waiters of this process, by channel, woken by local sends and by the Redis subscriber.
#[derive(Default)]
pub struct Hub {
    waiters: Mutex<HashMap<i64, Weak<Notify>>>,
}

impl Hub {
    /// A hub whose waiters the process's `subscriber` wakes ([`TOPIC`]: comma-separated
    /// channel ids).
    pub fn new(subscriber: &Subscriber) -> Arc<Self> {
        let hub = Arc::new(Hub::default());
        let weak = Arc::downgrade(&hub);
        // Waiters poll Postgres while the subscription is down: nothing to do when it breaks.
        subscriber.route(
            TOPIC,
            move |msg| {
                if let Some(hub) = weak.upgrade() {
                    for channel in msg.split(',').filter_map(|c| c.parse::<i64>().ok()) {
                        hub.wake(channel);
                    }
                }
            },
            || {},
        );
        hub
    }

    fn waiter(&self, channel: i64) -> Arc<Notify> {
        let mut waiters = match self.waiters.lock() {
            Ok(w) => w,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(n) = waiters.get(&channel).and_then(Weak::upgrade) {
            return n;
        }
        waiters.retain(|_, w| w.strong_count() > 0);
        let n = Arc::new(Notify::new());
        waiters.insert(channel, Arc::downgrade(&n));
        n
    }

    /// Long-polls of this process waiting now (each holds its channel's waker).
    pub fn waiting(&self) -> usize {
        let waiters = match self.waiters.lock() {
            Ok(w) => w,
            Err(poisoned) => poisoned.into_inner(),
        };
        waiters.values().map(Weak::strong_count).sum()
    }

    /// Wakes every local waiter of `channel`.
    pub fn wake(&self, channel: i64) {
        let waiters = match self.waiters.lock() {
            Ok(w) => w,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(n) = waiters.get(&channel).and_then(Weak::upgrade) {
            n.notify_waiters();
        }
    }
}

/// Which messages a poll asks for.
#[derive(Debug, Clone, Copy)]
pub enum Since {
    /// After the caller's read marker, moving it ("since I last checked").
    Marker,
    /// After this id; nothing moves.
    Id(i64),
}

/// Messages of `channel` after `since`, oldest first, at most `limit` (and whether more
/// exist); with none and `wait` > 0, waits until one arrives or `wait` passes.
///
/// # Errors
/// 404 unless `me` is a member.
pub async fn poll(
    chat: &ChatState,
    me: i64,
    channel: i64,
    since: Since,
    limit: usize,
    wait: Duration,
) -> ApiResult<(Vec<Message>, bool)> {
    let db = &chat.db;
    // The caller's marker (also: is the caller a member) and the channel's last id.
    let (marker, mut last): (i64, i64) = sqlx::query_as(
        "select m.last_read_id, c.last_message_id
         from chat_members m join chat_channels c on c.id = m.channel_id
         where m.channel_id = $1 and m.user_id = $2",
    )
    .bind(channel)
    .bind(me)
    .fetch_optional(db)
    .await?
    .ok_or(ApiError::NotFound)?;
    let after = match since {
        Since::Id(id) => id,
        Since::Marker => marker,
    };
    let deadline = tokio::time::Instant::now() + wait;
    let waiter = chat.hub.waiter(channel);
    if !wait.is_zero() {
        chat.subscriber.start(&chat.cache, &chat.stop);
    }
    let rows = loop {
        // Registered before the read, so a send that commits after it still wakes us.
        let woken = waiter.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let rows = match cached_after(chat, channel, after, last, limit).await? {
            Some(rows) => rows,
            None => after_in_db(db, channel, after, limit).await?,
        };
        let now = tokio::time::Instant::now();
        if !rows.is_empty() || now >= deadline || *chat.stop.borrow() {
            break rows;
        }
        let nap = if chat.subscriber.subscribed() {
            deadline - now
        } else {
            POLL_WHILE_DOWN.min(deadline - now)
        };
        let mut stop = chat.stop.clone();
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep(nap) => {}
            _ = stop.changed() => {}
        }
        last = last_message_id(db, channel).await?;
    };
    let has_more = rows.len() > limit;
    let rows: Vec<MessageRow> = rows.into_iter().take(limit).collect();
    if let (Since::Marker, Some(last)) = (since, rows.last()) {
        sqlx::query(
            "update chat_members set last_read_id = greatest(last_read_id, $3)
             where channel_id = $1 and user_id = $2",
        )
        .bind(channel)
        .bind(me)
        .bind(last.id)
        .execute(db)
        .await?;
    }
    Ok((messages(db, &chat.cache, rows).await?, has_more))
}

pub(super) async fn after_in_db(
    db: &PgPool,
    channel: i64,
    after: i64,
    limit: usize,
) -> sqlx::Result<Vec<MessageRow>> {
    sqlx::query_as(
        "select channel_id, id, user_id, content, created_at from chat_messages
         where channel_id = $1 and id > $2 order by id limit $3",
    )
    .bind(channel)
    .bind(after)
    .bind(limit as i64 + 1)
    .fetch_all(db)
    .await
}

async fn last_message_id(db: &PgPool, channel: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar("select last_message_id from chat_channels where id = $1")
        .bind(channel)
        .fetch_one(db)
        .await
}
