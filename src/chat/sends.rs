//! Sends with group commit: concurrent sends of one process share a transaction
//! ([`SendQueue`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Semaphore, oneshot};

use crate::cache::backlog::backlog_key;
use crate::cache::{Guard, Scored, Update};
use crate::error::{ApiError, ApiResult};
use crate::time::{self, Timestamp};
use crate::users::User;

use super::{ChatState, Message, MessageRow, TOPIC, encode, message};

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
/// appended to the channel's cached backlog (best effort: see [`super::backlog::cached_after`]) and the
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
