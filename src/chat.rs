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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore, oneshot};

use crate::cache::backlog::backlog_key;
use crate::cache::pubsub::Subscriber;
use crate::cache::{Cache, Guard, Scored, Update};
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
#[derive(Debug, Clone, Serialize)]
pub struct Channel {
    pub id: i64,
    pub name: String,
    pub members: Vec<User>,
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    pub last_message_id: i64,
    /// Messages after the caller's read marker, not counting the caller's own.
    pub unread_count: i64,
    /// The last message's `created_at`, or the channel's own (the listing's cursor).
    #[serde(skip)]
    pub last_activity_at: Timestamp,
}

/// The public `Message` object.
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub id: i64,
    pub channel_id: i64,
    pub user: User,
    pub content: String,
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

/// A message as a backlog member: `"{id}|{user_id}|{created_at µs}|{content}"`.
fn encode(row: &MessageRow) -> Vec<u8> {
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

/// Most sends one transaction commits (a group commit; see [`SendQueue`]).
pub const MAX_SEND_BATCH: usize = 256;
/// Send transactions one process runs at once; further sends queue and join the next batch.
pub const SEND_BATCHES_IN_FLIGHT: usize = 2;

/// One send waiting for its batch.
struct Pending {
    request: SendRequest,
    reply: oneshot::Sender<ApiResult<Message>>,
}

/// A send as a batch stores it.
struct SendRequest {
    channel: i64,
    author: User,
    content: String,
    client_id: Option<String>,
}

/// Group commit of chat sends: the concurrent sends of one process (to any channels) commit
/// together, in one transaction of a few set-based statements, instead of one transaction
/// each. No timer and no background task: a send queues itself, then waits for one of
/// [`SEND_BATCHES_IN_FLIGHT`] slots; whoever gets a slot takes everything queued (up to
/// [`MAX_SEND_BATCH`]) and commits it. An idle process so commits each send alone and at once;
/// a busy one commits together whatever arrived while the previous batches were committing.
/// Each batch locks its channel rows in id order, so the batches of several processes can not
/// deadlock, and a channel's messages still commit in id order (see the module docs).
pub struct SendQueue {
    queue: Mutex<Vec<Pending>>,
    slots: Semaphore,
    /// Send transactions committed, for tests and benchmarks.
    pub batches: AtomicU64,
    /// Messages those transactions stored.
    pub messages: AtomicU64,
}

impl Default for SendQueue {
    fn default() -> Self {
        SendQueue {
            queue: Mutex::new(Vec::new()),
            slots: Semaphore::new(SEND_BATCHES_IN_FLIGHT),
            batches: AtomicU64::new(0),
            messages: AtomicU64::new(0),
        }
    }
}

impl SendQueue {
    fn push(&self, pending: Pending) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.push(pending);
    }

    fn take(&self) -> Vec<Pending> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let n = queue.len().min(MAX_SEND_BATCH);
        queue.drain(..n).collect()
    }
}

/// Sends `content` (trimmed, validated) from `me` to `channel`; with a `client_id` already
/// used by `me` in this channel, answers that first message and stores nothing. Committed
/// with this process's concurrent sends ([`SendQueue`]); after the commit the message is
/// appended to the channel's cached backlog (best effort: see [`cached_after`]) and the
/// channel's long-polls are woken, here and (Redis pub/sub) in every other process.
///
/// Callers must not be cancelled while they wait (HTTP handlers run to completion in their own
/// task): the batch one caller commits also answers others.
///
/// # Errors
/// 404 unless `me` is a member.
pub async fn send(
    chat: &ChatState,
    me: &User,
    channel: i64,
    content: &str,
    client_id: Option<&str>,
) -> ApiResult<Message> {
    let (reply, mut answer) = oneshot::channel();
    let sends = &chat.sends;
    sends.push(Pending {
        request: SendRequest {
            channel,
            author: me.clone(),
            content: content.to_owned(),
            client_id: client_id.map(str::to_owned),
        },
        reply,
    });
    let unanswered = || anyhow::anyhow!("a send batch ended without an answer");
    loop {
        // A send answered by another caller's batch leaves at once: waiting on for a slot would
        // make every caller queue behind the others and each batch hold one send.
        let slot = tokio::select! {
            biased;
            result = &mut answer => return result.map_err(|_| unanswered())?,
            slot = sends.slots.acquire() => {
                slot.map_err(|_| anyhow::anyhow!("the send queue is closed"))?
            }
        };
        let batch = sends.take();
        if batch.is_empty() {
            break; // another caller's batch took this send
        }
        commit_batch(chat, batch).await;
        drop(slot);
    }
    answer.await.map_err(|_| unanswered())?
}

/// Why a batch stored nothing it can answer for.
enum BatchFailed {
    /// Before the commit: nothing was stored, each send may be tried again.
    BeforeCommit(ApiError),
    /// The commit itself failed: the batch may or may not be stored, so nothing is retried
    /// (a client retries with its `client_id`).
    AtCommit(ApiError),
}

impl<E: Into<ApiError>> From<E> for BatchFailed {
    fn from(e: E) -> Self {
        BatchFailed::BeforeCommit(e.into())
    }
}

/// Commits one batch and answers each of its sends. A batch that fails before its commit is
/// retried one send at a time, so one failing send (say, content Postgres refuses) does not
/// fail the others.
async fn commit_batch(chat: &ChatState, batch: Vec<Pending>) {
    let (requests, replies): (Vec<SendRequest>, Vec<_>) =
        batch.into_iter().map(|p| (p.request, p.reply)).unzip();
    // Each 500 is logged once when answered: the cause with the first, a pointer to it with
    // the others.
    let failed = |e: ApiError| -> Vec<ApiResult<Message>> {
        let mut results = vec![Err(e)];
        results.resize_with(requests.len(), || {
            Err(anyhow::anyhow!("the send batch failed at its commit").into())
        });
        results
    };
    let results = match store_batch(chat, &requests).await {
        Ok(results) => results,
        Err(BatchFailed::BeforeCommit(e)) if requests.len() > 1 => {
            tracing::warn!(error = %e, sends = requests.len(), "a send batch failed; sending one by one");
            let mut results = Vec::with_capacity(requests.len());
            for request in requests.chunks(1) {
                results.push(match store_batch(chat, request).await {
                    Ok(mut one) => one.pop().unwrap_or(Err(ApiError::NotFound)),
                    Err(BatchFailed::BeforeCommit(e) | BatchFailed::AtCommit(e)) => Err(e),
                });
            }
            results
        }
        Err(BatchFailed::BeforeCommit(e) | BatchFailed::AtCommit(e)) => failed(e),
    };
    for (reply, result) in replies.into_iter().zip(results) {
        // A caller that went away anyway: its message is stored, nothing else to do.
        let _ = reply.send(result);
    }
}

/// What became of one send of a batch.
enum Outcome {
    NotMember,
    /// Stored as the batch's `rows[i]` (by this send, or by an earlier send of the batch with
    /// the same client id).
    Stored(usize),
    /// A retry of a send committed before this batch: answered with that message.
    Earlier(MessageRow),
}

/// One batch's transaction: lock the channels (in id order), check membership, find earlier
/// sends of the same client ids, number the new messages, insert them with the channels'
/// counters and the senders' read markers, commit; then the backlog appends and the wake-ups.
/// Returns one result per request, in order.
async fn store_batch(
    chat: &ChatState,
    requests: &[SendRequest],
) -> Result<Vec<ApiResult<Message>>, BatchFailed> {
    let db = &chat.db;
    let channels: Vec<i64> = requests.iter().map(|r| r.channel).collect();
    let senders: Vec<i64> = requests.iter().map(|r| r.author.id).collect();
    let client_ids: Vec<Option<&str>> = requests.iter().map(|r| r.client_id.as_deref()).collect();
    let mut tx = db.begin().await?;
    // Held until the commit: a channel's sends commit one after the other, in id order.
    let mut last: HashMap<i64, i64> = sqlx::query_as(
        "select id, last_message_id from chat_channels where id = any($1)
         order by id for no key update",
    )
    .bind(&channels)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    // Per request: is the sender a member, and the earlier send of its client id, if any. No
    // other send to these channels can commit before this transaction does now (it would wait
    // for the channel locks), so the answer is final (this statement's snapshot is taken after
    // the locks were granted).
    let found: Vec<Found> = sqlx::query_as(
        "select m.user_id is not null as member,
                x.channel_id, x.id, x.user_id, x.content, x.created_at
         from unnest($1::bigint[], $2::bigint[], $3::text[]) with ordinality
              as s (channel_id, user_id, client_id, ord)
         left join chat_members m on m.channel_id = s.channel_id and m.user_id = s.user_id
         left join chat_messages x on x.channel_id = s.channel_id and x.user_id = s.user_id
                                  and x.client_id = s.client_id
         order by s.ord",
    )
    .bind(&channels)
    .bind(&senders)
    .bind(&client_ids)
    .fetch_all(&mut *tx)
    .await?;
    // Number the new messages in arrival order. A client id used before answers with its first
    // message: one committed earlier (found above) or one earlier in this batch.
    let mut rows: Vec<MessageRow> = Vec::new();
    let mut stored_client_ids: Vec<Option<&str>> = Vec::new();
    let mut firsts: HashMap<(i64, i64, &str), usize> = HashMap::new();
    let mut outcomes = Vec::with_capacity(requests.len());
    for (r, f) in requests.iter().zip(found) {
        let member = f.member;
        let retry_of = r.client_id.as_deref().map(|c| (r.channel, r.author.id, c));
        let in_batch = retry_of.and_then(|k| firsts.get(&k).copied());
        let outcome = match (f.earlier(), in_batch, last.get_mut(&r.channel)) {
            _ if !member => Outcome::NotMember,
            (Some(first), _, _) => Outcome::Earlier(first),
            (None, Some(i), _) => Outcome::Stored(i),
            (None, None, None) => Outcome::NotMember,
            (None, None, Some(seq)) => {
                *seq += 1;
                rows.push(MessageRow {
                    channel_id: r.channel,
                    id: *seq,
                    user_id: r.author.id,
                    content: r.content.clone(),
                    created_at: time::next_timestamp(),
                });
                stored_client_ids.push(r.client_id.as_deref());
                if let Some(key) = retry_of {
                    firsts.insert(key, rows.len() - 1);
                }
                Outcome::Stored(rows.len() - 1)
            }
        };
        outcomes.push(outcome);
    }
    if !rows.is_empty() {
        insert_rows(&mut tx, &rows, &stored_client_ids).await?;
    }
    let mut appends: HashMap<i64, Vec<Scored>> = HashMap::new();
    for r in &rows {
        appends
            .entry(r.channel_id)
            .or_default()
            .push((r.id, encode(r)));
    }
    let woken: Vec<i64> = appends.keys().copied().collect();
    let updates: Vec<Update> = appends
        .into_iter()
        .map(|(channel, entries)| Update::Merge {
            list: backlog_key(channel),
            guard: Guard::None,
            after: None,
            entries,
        })
        .collect();
    tx.commit()
        .await
        .map_err(|e| BatchFailed::AtCommit(e.into()))?;
    chat.sends.batches.fetch_add(1, Ordering::Relaxed);
    chat.sends
        .messages
        .fetch_add(rows.len() as u64, Ordering::Relaxed);
    // No outbox row: a lost append is found and repaired by the next poll (see cached_after).
    chat.cache.apply_best_effort(&updates).await;
    if !woken.is_empty() {
        for channel in &woken {
            chat.hub.wake(*channel);
        }
        let ids: Vec<String> = woken.iter().map(i64::to_string).collect();
        let _ = chat.cache.publish(TOPIC, &ids.join(",")).await;
    }
    Ok(requests
        .iter()
        .zip(outcomes)
        .map(|(r, outcome)| match outcome {
            Outcome::NotMember => Err(ApiError::NotFound),
            Outcome::Stored(i) => Ok(message(rows[i].clone(), &r.author)),
            Outcome::Earlier(first) => Ok(message(first, &r.author)),
        })
        .collect())
}

/// What a batch finds for one of its requests (see [`store_batch`]).
#[derive(sqlx::FromRow)]
struct Found {
    member: bool,
    channel_id: Option<i64>,
    id: Option<i64>,
    user_id: Option<i64>,
    content: Option<String>,
    created_at: Option<Timestamp>,
}

impl Found {
    /// The earlier message with the request's client id.
    fn earlier(self) -> Option<MessageRow> {
        Some(MessageRow {
            channel_id: self.channel_id?,
            id: self.id?,
            user_id: self.user_id?,
            content: self.content?,
            created_at: self.created_at?,
        })
    }
}

/// Inserts a batch's new messages and moves, per channel, its last id and activity and, per
/// (channel, sender), the sender's read marker (your own messages are never unread for you):
/// one statement.
async fn insert_rows(
    tx: &mut sqlx::PgConnection,
    rows: &[MessageRow],
    client_ids: &[Option<&str>],
) -> sqlx::Result<()> {
    let ints = |f: fn(&MessageRow) -> i64| rows.iter().map(f).collect::<Vec<i64>>();
    sqlx::query(
        "with new as (
             select * from unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::text[],
                                  $5::text[], $6::timestamptz[])
                 as n (channel_id, id, user_id, content, client_id, created_at)),
         inserted as (
             insert into chat_messages (channel_id, id, user_id, content, client_id, created_at)
             select * from new),
         channels as (
             update chat_channels c set last_message_id = s.last_id,
                    last_activity_at = greatest(c.last_activity_at, s.at)
             from (select channel_id, max(id) as last_id, max(created_at) as at
                   from new group by channel_id) s
             where c.id = s.channel_id)
         update chat_members m set last_read_id = greatest(m.last_read_id, s.last_id)
         from (select channel_id, user_id, max(id) as last_id from new
               group by channel_id, user_id) s
         where m.channel_id = s.channel_id and m.user_id = s.user_id",
    )
    .bind(ints(|r| r.channel_id))
    .bind(ints(|r| r.id))
    .bind(ints(|r| r.user_id))
    .bind(rows.iter().map(|r| r.content.as_str()).collect::<Vec<_>>())
    .bind(client_ids)
    .bind(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
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

async fn after_in_db(
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

/// Up to `limit + 1` messages after `after` from the cached backlog, if it can answer: it
/// covers `after + 1`, holds a run of ids without a hole from there, and that run reaches
/// `last` (the channel's last id, read from Postgres before) or fills the page. Appends reach
/// Redis after their commit and without an outbox row, so a backlog may end short of `last`:
/// such a poll reads Postgres and puts the missing tail back into the backlog (read repair).
/// `None`: read Postgres (on a miss, this loads the backlog for the next poll first).
async fn cached_after(
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
