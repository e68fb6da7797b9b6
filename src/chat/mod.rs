//! Chat channels: the poll-based chat of J. Carlson's Redis chat design (send to a channel,
//! check the messages since your last check), on Postgres as the truth.
//!
//! - **Ordering.** A message's id is its channel's next sequence number, taken under the
//!   channel row's lock inside the send's transaction. The row stays locked until that
//!   transaction ends, so the sends of one channel commit one after the other in id order: a
//!   poller that has seen id 12 can never later find an id 11 committed after its poll, and a
//!   rolled-back send leaves no gap (its number rolls back with it).
//! - **Group commit.** Concurrent sends of one process share a transaction ([`SendQueue`]): a
//!   batch locks its channels in id order, numbers its messages and writes them with two
//!   set-based statements, so a busy process pays one commit per batch, not per message.
//! - **Read markers.** A poll without `since_id` returns what came after the caller's marker
//!   and moves it; `read/` moves it explicitly; both only ever move it forward. Your own
//!   messages are never unread for you.
//! - **Idempotent sends.** A retry with the same `client_id` finds the first message and
//!   answers it again: the lookup runs under the channel's lock, so a concurrent retry (in any
//!   process) waits for the first send's commit and then finds it; a unique index backs it.
//! - **Backlog cache.** Redis keeps each active channel's newest messages (`{p}:{ch5}:msgs`,
//!   score = id), filled on a poll's miss with the generation-guarded fill of the timelines
//!   and appended to by each send batch after its commit. Appends need no outbox row: a poll
//!   is answered from Redis only if the cached messages are exactly the ids after its position,
//!   without a hole (an append can reach Redis after a later one), up to the channel's
//!   `last_message_id` read from Postgres with the caller's marker; a backlog that ends short
//!   (an append lost to a crash or a Redis error, or still in flight) is completed from
//!   Postgres and repaired; anything else is read from Postgres. A periodic cleanup, one
//!   process at a time, trims backlogs to `CHIRP_CHAT_BACKLOG` and drops those of channels
//!   idle for `CHIRP_CHAT_IDLE_SECS`. Read markers live in Postgres only.
//! - **Long-polls.** `wait=S` returns as soon as a message arrives in any process: a send
//!   publishes the channel id on Redis after its commit, one subscriber per process wakes the
//!   local waiters ([`Hub`]); while that subscription is down, waiters poll Postgres every
//!   [`POLL_WHILE_DOWN`].
mod backlog;
mod cleanup;
mod poll;
mod sends;

use backlog::{cached_after, encode};
pub use cleanup::{CLEANUP_EVERY, cleanup, cleanup_loop};
use poll::after_in_db;
pub use poll::{Hub, Since, poll};
pub use sends::{MAX_SEND_BATCH, SEND_BATCHES_IN_FLIGHT, SendQueue, send};

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;

use crate::cache::Cache;
use crate::cache::pubsub::Subscriber;
use crate::error::{ApiError, ApiResult};
use crate::pagination::{Page, PageRequest};
use crate::time::{self, Timestamp};
use crate::users::{self, User};

/// Most characters of a message, after trimming.
pub const MAX_CONTENT_CHARS: usize = 2000;
/// Most characters of a channel name.
pub const MAX_NAME_CHARS: usize = 50;
/// Most characters of a `client_id`.
pub const MAX_CLIENT_ID_CHARS: usize = 64;
/// Most seconds a poll may wait.
pub const MAX_WAIT_SECS: u64 = 30;
/// Most members a channel is created with.
pub const MAX_MEMBERS: usize = 1000;
/// How often a waiter looks in Postgres while the Redis subscription is down.
pub const POLL_WHILE_DOWN: Duration = Duration::from_millis(100);
/// The pub/sub topic of new messages (the payload: the ids of the channels one send batch
/// wrote, comma-separated).
const TOPIC: &str = "chat";

/// The public `Channel` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Channel {
    pub id: i64,
    pub name: String,
    pub members: Vec<User>,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    pub last_message_id: i64,
    /// Messages after the caller's read marker, not counting the caller's own.
    pub unread_count: i64,
    /// The last message's `created_at`, or the channel's own: the listing's cursor (page with
    /// `created_at__lt=<last_activity_at>`).
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub last_activity_at: Timestamp,
}

/// The public `Message` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Message {
    pub id: i64,
    pub channel_id: i64,
    pub user: User,
    pub content: String,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
}

#[derive(Debug, Clone, sqlx::FromRow)]
struct MessageRow {
    channel_id: i64,
    id: i64,
    user_id: i64,
    content: String,
    created_at: Timestamp,
}

#[derive(Debug, sqlx::FromRow)]
struct ChannelRow {
    id: i64,
    name: String,
    created_at: Timestamp,
    last_message_id: i64,
    last_activity_at: Timestamp,
}

/// What chat needs besides Postgres: the cache (backlogs, pub/sub), the hub, the shutdown
/// signal and the cleanup's settings.
#[derive(Clone)]
pub struct ChatState {
    pub db: PgPool,
    pub cache: Cache,
    pub hub: Arc<Hub>,
    /// The process's pub/sub subscription (started by the first long-poll).
    pub subscriber: Arc<Subscriber>,
    /// This process's group commit of sends.
    pub sends: Arc<SendQueue>,
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// Messages a backlog keeps (`CHIRP_CHAT_BACKLOG`).
    pub backlog: usize,
    /// How long a channel stays in Redis without a message (`CHIRP_CHAT_IDLE_SECS`).
    pub idle: Duration,
}

async fn is_member(db: &PgPool, channel: i64, user: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "select exists (select 1 from chat_members where channel_id = $1 and user_id = $2)",
    )
    .bind(channel)
    .bind(user)
    .fetch_one(db)
    .await
}

/// 404 unless `user` is a member of `channel` (a channel's existence is not revealed).
async fn require_member(db: &PgPool, channel: i64, user: i64) -> ApiResult<()> {
    if is_member(db, channel, user).await? {
        Ok(())
    } else {
        Err(ApiError::NotFound)
    }
}

/// Creates a channel of `me` and `members` (a direct channel has one other member).
///
/// # Errors
/// 400 on `member_ids` if one of them is not a user or there are too many; 400 on `name` if
/// it is too long.
pub async fn create(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    members: &[i64],
    name: &str,
) -> ApiResult<Channel> {
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::field(
            "name",
            format!("Ensure this field has no more than {MAX_NAME_CHARS} characters."),
        ));
    }
    let mut all: Vec<i64> = members.iter().copied().chain([me]).collect();
    all.sort_unstable();
    all.dedup();
    if all.len() > MAX_MEMBERS {
        return Err(ApiError::field(
            "member_ids",
            format!("At most {MAX_MEMBERS} members."),
        ));
    }
    let found: i64 = sqlx::query_scalar("select count(*) from users where id = any($1)")
        .bind(&all)
        .fetch_one(db)
        .await?;
    if found != all.len() as i64 {
        return Err(ApiError::field(
            "member_ids",
            "Every member must be a user.",
        ));
    }
    let mut tx = db.begin().await?;
    let now = time::next_timestamp();
    let id: i64 = sqlx::query_scalar(
        "insert into chat_channels (name, created_at, last_activity_at) values ($1, $2, $2)
         returning id",
    )
    .bind(name)
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("insert into chat_members (channel_id, user_id) select $1, unnest($2::bigint[])")
        .bind(id)
        .bind(&all)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    channel(db, cache, id, me).await
}

/// Channel `id` as `me` sees it.
///
/// # Errors
/// 404 unless `me` is a member.
pub async fn channel(db: &PgPool, cache: &Cache, id: i64, me: i64) -> ApiResult<Channel> {
    let row: Option<ChannelRow> = sqlx::query_as(
        "select c.id, c.name, c.created_at, c.last_message_id, c.last_activity_at
         from chat_channels c join chat_members m on m.channel_id = c.id and m.user_id = $2
         where c.id = $1",
    )
    .bind(id)
    .bind(me)
    .fetch_optional(db)
    .await?;
    let row = row.ok_or(ApiError::NotFound)?;
    objects(db, cache, vec![row], me)
        .await?
        .pop()
        .ok_or(ApiError::NotFound)
}

async fn objects(
    db: &PgPool,
    cache: &Cache,
    rows: Vec<ChannelRow>,
    me: i64,
) -> sqlx::Result<Vec<Channel>> {
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let members: Vec<(i64, i64)> = sqlx::query_as(
        "select channel_id, user_id from chat_members where channel_id = any($1)
         order by channel_id, joined_at, user_id",
    )
    .bind(&ids)
    .fetch_all(db)
    .await?;
    let unread: Vec<(i64, i64)> = sqlx::query_as(
        "select m.channel_id,
                (select count(*) from chat_messages x
                 where x.channel_id = m.channel_id and x.id > m.last_read_id and x.user_id <> m.user_id)
         from chat_members m where m.user_id = $1 and m.channel_id = any($2)",
    )
    .bind(me)
    .bind(&ids)
    .fetch_all(db)
    .await?;
    let user_ids: Vec<i64> = members.iter().map(|m| m.1).collect();
    let people = users::load_many(db, cache, &user_ids).await?;
    Ok(rows
        .into_iter()
        .map(|r| Channel {
            members: members
                .iter()
                .filter(|m| m.0 == r.id)
                .filter_map(|m| people.get(&m.1).cloned().map(User::from))
                .collect(),
            unread_count: unread.iter().find(|u| u.0 == r.id).map_or(0, |u| u.1),
            id: r.id,
            name: r.name,
            created_at: r.created_at,
            last_message_id: r.last_message_id,
            last_activity_at: r.last_activity_at,
        })
        .collect())
}

/// A page of `me`'s channels, most recently active first (cursor: last activity).
pub async fn channels(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    req: &PageRequest,
) -> sqlx::Result<Page<Channel>> {
    let rows: Vec<ChannelRow> = sqlx::query_as(
        "select c.id, c.name, c.created_at, c.last_message_id, c.last_activity_at
         from chat_members m join chat_channels c on c.id = m.channel_id
         where m.user_id = $1
           and c.last_activity_at < coalesce($2, 'infinity')
           and c.last_activity_at > coalesce($3, '-infinity')
         order by c.last_activity_at desc, c.id desc limit $4",
    )
    .bind(me)
    .bind(req.lt)
    .bind(req.gt)
    .bind(req.want() as i64)
    .fetch_all(db)
    .await?;
    let page = Page::from_items(rows, req);
    Ok(Page {
        has_next_page: page.has_next_page,
        results: objects(db, cache, page.results, me).await?,
    })
}

/// `me` (a member) adds `user` to `channel`; adding a member again changes nothing.
///
/// # Errors
/// 404 unless `me` is a member; 400 on `user_id` if there is no such user.
pub async fn add_member(db: &PgPool, me: i64, channel: i64, user: i64) -> ApiResult<bool> {
    require_member(db, channel, me).await?;
    if !users::exists(db, user).await? {
        return Err(ApiError::field("user_id", "User does not exist."));
    }
    // A new member has read nothing before they joined: the marker starts at the last message.
    let added = sqlx::query(
        "insert into chat_members (channel_id, user_id, last_read_id)
         select $1, $2, last_message_id from chat_channels where id = $1
         on conflict do nothing",
    )
    .bind(channel)
    .bind(user)
    .execute(db)
    .await?
    .rows_affected();
    Ok(added > 0)
}

/// `me` leaves `channel`.
///
/// # Errors
/// 404 unless `me` is a member.
pub async fn leave(db: &PgPool, me: i64, channel: i64) -> ApiResult<()> {
    let left = sqlx::query("delete from chat_members where channel_id = $1 and user_id = $2")
        .bind(channel)
        .bind(me)
        .execute(db)
        .await?
        .rows_affected();
    if left == 0 {
        return Err(ApiError::NotFound);
    }
    Ok(())
}

fn message(row: MessageRow, author: &User) -> Message {
    Message {
        id: row.id,
        channel_id: row.channel_id,
        user: author.clone(),
        content: row.content,
        created_at: row.created_at,
    }
}

async fn messages(db: &PgPool, cache: &Cache, rows: Vec<MessageRow>) -> sqlx::Result<Vec<Message>> {
    let authors: Vec<i64> = rows.iter().map(|r| r.user_id).collect();
    let people = users::load_many(db, cache, &authors).await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let author: User = people.get(&r.user_id)?.clone().into();
            Some(message(r, &author))
        })
        .collect())
}

/// The `limit` messages of `channel` before `before`, oldest first (history), and whether older
/// ones exist.
///
/// # Errors
/// 404 unless `me` is a member.
pub async fn history(
    chat: &ChatState,
    me: i64,
    channel: i64,
    before: i64,
    limit: usize,
) -> ApiResult<(Vec<Message>, bool)> {
    require_member(&chat.db, channel, me).await?;
    let mut rows: Vec<MessageRow> = sqlx::query_as(
        "select channel_id, id, user_id, content, created_at from chat_messages
         where channel_id = $1 and id < $2 order by id desc limit $3",
    )
    .bind(channel)
    .bind(before)
    .bind(limit as i64 + 1)
    .fetch_all(&chat.db)
    .await?;
    let has_more = rows.len() > limit;
    rows.truncate(limit);
    rows.reverse();
    Ok((messages(&chat.db, &chat.cache, rows).await?, has_more))
}

/// Moves `me`'s read marker of `channel` forward to `last_read_id` (never back, never past the
/// last message); returns the unread count after it.
///
/// # Errors
/// 404 unless `me` is a member.
pub async fn mark_read(db: &PgPool, me: i64, channel: i64, last_read_id: i64) -> ApiResult<i64> {
    let unread: Option<i64> = sqlx::query_scalar(
        "with moved as (
             update chat_members m
             set last_read_id = greatest(m.last_read_id, least($3, c.last_message_id))
             from chat_channels c
             where m.channel_id = $1 and m.user_id = $2 and c.id = m.channel_id
             returning m.last_read_id)
         select (select count(*) from chat_messages
                 where channel_id = $1 and id > moved.last_read_id and user_id <> $2)
         from moved",
    )
    .bind(channel)
    .bind(me)
    .bind(last_read_id)
    .fetch_optional(db)
    .await?;
    unread.ok_or(ApiError::NotFound)
}
