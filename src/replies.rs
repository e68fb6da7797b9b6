//! Replies and threads (Twitter v1.1's `in_reply_to_status_id`, Mastodon's statuses and their
//! `context`): a tweet posted with `in_reply_to_tweet_id` answers that tweet, and with it
//! belongs to the thread of that tweet's first tweet (its *root*, `tweets.thread_id`).
//!
//! - **Who sees a reply in their newsfeed**: a reader who follows both the replier and the
//!   replied-to user (Twitter's and Mastodon's rule; the replied-to user counts as following
//!   themselves, and a reply to oneself reaches all one's followers). Decided once, when the
//!   reply's rows are written (fan-out, a follow's backfill, `chirp import`: [`reaching`] and
//!   [`crate::reply_reaches`]), so every newsfeed page, cached or read from Postgres, holds the same
//!   entries. A reply is never pulled ([`crate::hybrid`]): even a large account's replies are
//!   fanned out, to the readers that follow both (a set no larger than the replied-to user's
//!   followers), so the pulled merge at read time needs no rule of its own. Following the
//!   replied-to user later does not bring back a reply (nor does Twitter).
//! - **`replies_count`** counts direct replies, exact like `comments_count`: moved in the
//!   reply's transaction (`counts_version` with it) and written through with `SET_IF_NEWER`.
//! - **Locks**: a reply posted or deleted locks the author's row, then its thread's `threads`
//!   row, then tweet rows (the replied-to one's, the reply's), then a circle's; a tweet delete
//!   takes the same order, so none waits for another in a cycle.
//! - **The context view** ([`context`]): ancestors (oldest first) and descendants (oldest first,
//!   paged) of a tweet, walked in the thread's cached shape ([`crate::cache::threads`],
//!   versioned by `threads.version`, which every reply posted or deleted bumps) and hydrated
//!   from the object caches. A deleted tweet cuts its thread there, as Mastodon's does: its
//!   replies are not its ancestors' descendants, and their ancestors stop below it.
//!
//! docs/decisions/0025-replies-and-threads.md.

use std::collections::HashMap;

use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::cache::threads::{MAX_CACHED_THREAD, ShapeReply, ThreadShape};
use crate::cache::{Cache, Update};
use crate::error::{ApiError, ApiResult};
use crate::model::TweetRecord;
use crate::pagination::PageRequest;
use crate::timeline::{FeedRow, Item, ListEntry};
use crate::tweets::{self, Linked, Tweet, TweetRow};

/// Most ancestors a context view walks up (Mastodon stops at 40; a longer chain is cut at its
/// oldest end).
pub const MAX_ANCESTORS: usize = 100;

/// The tweet a new reply answers, as its post locked it ([`lock_parent`]).
#[derive(Debug, Clone)]
pub struct Parent {
    /// The replied-to tweet, with its counts after this reply.
    pub row: TweetRow,
    /// The thread's first tweet.
    pub root: i64,
    /// The thread's version after this reply.
    pub version: i64,
}

/// For a new reply to tweet `parent` (a retweet: the tweet it retweets) by `author`, in the
/// post's transaction after the author's row lock and before any other tweet or circle row:
/// locks the thread (bumping its version) and the replied-to tweet, and counts the reply on
/// it. `Err` (nothing changed) if there is no such tweet (400, as for a comment) or either of
/// the two authors blocks the other (403).
///
/// # Errors
/// Postgres failed.
pub async fn lock_parent(
    tx: &mut PgConnection,
    author: i64,
    parent: i64,
) -> sqlx::Result<Result<Parent, ApiError>> {
    let no_such = || ApiError::field("in_reply_to_tweet_id", "No such tweet.");
    // Its author and thread never change: read without a lock, then lock in order. A reply
    // to a retweet replies to the tweet it shows (crate::status_of).
    let found: Option<(i64, i64, i64)> = sqlx::query_as(concat!(
        "select id, user_id, coalesce(thread_id, id) from tweets where id = ",
        crate::status_of!("$1")
    ))
    .bind(parent)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((parent, parent_author, root)) = found else {
        return Ok(Err(no_such()));
    };
    if parent_author != author
        && crate::blocks::blocked_either_way(&mut *tx, parent_author, author).await?
    {
        return Ok(Err(ApiError::Forbidden));
    }
    let version = lock_thread(&mut *tx, root).await?;
    let row = tweets::shift_linked(&mut *tx, Linked::Replies, parent, 1).await?;
    // Deleted since it was read: the reply is refused (its transaction rolls back).
    Ok(row
        .map(|row| Parent { row, root, version })
        .ok_or_else(no_such))
}

/// Locks thread `root` for a reply posted or deleted (after the author's row, before any tweet
/// row), creating its row with the first reply, and bumps its version; the new version.
///
/// # Errors
/// Postgres failed.
pub async fn lock_thread(tx: &mut PgConnection, root: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "insert into threads as t (root_id, version) values ($1, 1)
         on conflict (root_id) do update set version = t.version + 1
         returning version",
    )
    .bind(root)
    .fetch_one(tx)
    .await
}

/// The cache updates of reply `reply` deleted (its row is gone; its thread locked at
/// `version` by [`lock_thread`]): the replied-to tweet's count, if it still exists, and the
/// thread's shape.
///
/// # Errors
/// Postgres failed.
pub async fn detach(
    tx: &mut PgConnection,
    reply: &TweetRecord,
    root: i64,
    version: i64,
) -> sqlx::Result<Vec<Update>> {
    let mut updates = Vec::new();
    if let Some(parent) = reply.in_reply_to_tweet_id {
        let row = tweets::shift_linked(&mut *tx, Linked::Replies, parent, -1).await?;
        updates.extend(row.iter().flat_map(TweetRow::counts_updates));
    }
    updates.push(shape_update(tx, root, version).await?);
    Ok(updates)
}

/// The write-through of thread `root`'s shape as this transaction (which bumped it to
/// `version`) sees it.
///
/// # Errors
/// Postgres failed.
pub async fn shape_update(tx: &mut PgConnection, root: i64, version: i64) -> sqlx::Result<Update> {
    let rows = shape_rows(tx, root, Some(MAX_CACHED_THREAD + 1)).await?;
    let replies = (rows.len() <= MAX_CACHED_THREAD).then_some(rows);
    Ok(Update::Thread {
        root,
        shape: ThreadShape { version, replies },
    })
}

/// The tweets of thread `root`, its root first (if not deleted) with parent 0, then its
/// replies oldest first; at most `limit`.
async fn shape_rows(
    conn: &mut PgConnection,
    root: i64,
    limit: Option<usize>,
) -> sqlx::Result<Vec<ShapeReply>> {
    sqlx::query_as(
        "(select id, 0::bigint, (extract(epoch from created_at) * 1000000)::bigint, user_id
          from tweets where id = $1)
         union all
         (select id, in_reply_to_tweet_id,
                 (extract(epoch from created_at) * 1000000)::bigint, user_id
          from tweets where thread_id = $1 order by created_at limit $2)",
    )
    .bind(root)
    .bind(limit.map(|l| l as i64))
    .fetch_all(conn)
    .await
}

/// Thread `root`'s version and all its tweets from Postgres, in one snapshot (a repeatable-read
/// transaction).
async fn load_thread(db: &PgPool, root: i64) -> sqlx::Result<(i64, Vec<ShapeReply>)> {
    let mut tx = db.begin().await?;
    sqlx::query("set transaction isolation level repeatable read read only")
        .execute(&mut *tx)
        .await?;
    let version: Option<i64> = sqlx::query_scalar("select version from threads where root_id = $1")
        .bind(root)
        .fetch_optional(&mut *tx)
        .await?;
    let rows = shape_rows(&mut tx, root, None).await?;
    tx.commit().await?;
    Ok((version.unwrap_or(0), rows))
}

/// Thread `root`'s tweets: from its cached shape, or loaded on a miss (and cached, or marked too
/// big to cache: [`MAX_CACHED_THREAD`]); from Postgres alone if Redis fails, or if the thread is
/// too big to cache.
async fn thread(db: &PgPool, cache: &Cache, root: i64) -> sqlx::Result<Vec<ShapeReply>> {
    let cached = match cache.available() {
        true => cache.get_thread(root).await.ok(),
        false => None,
    };
    if let Some(Some(ThreadShape {
        replies: Some(rows),
        ..
    })) = cached
    {
        return Ok(rows);
    }
    let (version, rows) = load_thread(db, root).await?;
    if let Some(None) = cached {
        let replies = (rows.len() <= MAX_CACHED_THREAD).then(|| rows.clone());
        cache
            .put_thread(root, &ThreadShape { version, replies })
            .await;
    }
    Ok(rows)
}

/// Whether a reply by `author` to `reply_to`'s tweet reaches every follower of `author`
/// (not a reply, or a reply to oneself); else it reaches those [`reaching`] keeps.
pub fn reaches_all(author: i64, reply_to: Option<i64>) -> bool {
    reply_to.is_none_or(|to| to == author)
}

/// Of `readers` (followers of a reply's author), those its newsfeed rows go to: the replied-to
/// user `reply_to` and whoever follows them (see the module docs).
///
/// # Errors
/// Postgres failed.
pub async fn reaching(
    conn: &mut PgConnection,
    reply_to: i64,
    readers: &[i64],
) -> sqlx::Result<std::collections::HashSet<i64>> {
    let mut kept: std::collections::HashSet<i64> = sqlx::query_scalar(
        "select f.from_user_id from friendships f
         where f.to_user_id = $1 and f.from_user_id = any($2)",
    )
    .bind(reply_to)
    .bind(readers)
    .fetch_all(conn)
    .await?
    .into_iter()
    .collect();
    if readers.contains(&reply_to) {
        kept.insert(reply_to);
    }
    Ok(kept)
}

/// The SQL condition of the reply rule for a newsfeed row of tweet `$tweet` (its alias) for
/// reader `$reader` (a column or a parameter), the set-based twin of [`reaching`] and
/// [`reaches_all`] (a macro, so queries stay `&'static str`).
#[macro_export]
macro_rules! reply_reaches {
    ($tweet:literal, $reader:literal) => {
        concat!(
            "(",
            $tweet,
            ".in_reply_to_user_id is null or ",
            $tweet,
            ".in_reply_to_user_id = ",
            $tweet,
            ".user_id or ",
            $tweet,
            ".in_reply_to_user_id = ",
            $reader,
            " or exists (select 1 from friendships rr where rr.from_user_id = ",
            $reader,
            " and rr.to_user_id = ",
            $tweet,
            ".in_reply_to_user_id))"
        )
    };
}

/// `GET /api/tweets/{id}/context/`: the tweets a tweet replies to, and the replies below it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Context {
    /// The chain of tweets it replies to, oldest (the thread's first) first; at most
    /// [`MAX_ANCESTORS`], cut at a deleted one.
    pub ancestors: Vec<Tweet>,
    /// Its replies and theirs, oldest first: a page of `page_size` (20 by default), after
    /// `created_at__gt` and before `created_at__lt` if given.
    pub descendants: Vec<Tweet>,
    /// More descendants follow the page (ask again with `created_at__gt` = its last one's).
    pub has_next_page: bool,
}

/// The context of tweet `id` for `viewer`: its ancestors and a page of its descendants
/// (`req.gt` / `req.lt` bound them, `req.limit` of them oldest first), without the tweets of
/// the accounts in `hidden`, the viewer's hidden set ([`crate::blocks::hidden`]: whom it
/// mutes or blocks and who blocks it).
///
/// # Errors
/// 404 if there is no such tweet or its author blocks the viewer.
#[tracing::instrument(name = "replies::context", skip(db, cache, hidden, req))]
pub async fn context(
    db: &PgPool,
    cache: &Cache,
    id: i64,
    viewer: Option<i64>,
    hidden: &crate::blocks::Hidden,
    req: &PageRequest,
) -> ApiResult<Context> {
    let (record, _, _) = crate::tweets::load(db, cache, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    if viewer != Some(record.user_id) && hidden.blocked_by(record.user_id) {
        return Err(ApiError::NotFound);
    }
    let root = match record.in_reply_to_tweet_id {
        None => id,
        Some(_) => {
            sqlx::query_scalar::<_, Option<i64>>("select thread_id from tweets where id = $1")
                .bind(id)
                .fetch_optional(db)
                .await?
                .flatten()
                .ok_or(ApiError::NotFound)?
        }
    };
    let rows = thread(db, cache, root).await?;
    let visible = |author: i64| !hidden.hides(author) || viewer == Some(author);
    let by_id: HashMap<i64, &ShapeReply> = rows.iter().map(|r| (r.0, r)).collect();
    // Up the chain until the root or a deleted tweet.
    let mut ancestors: Vec<&ShapeReply> = Vec::new();
    let mut up = by_id
        .get(&id)
        .map_or(record.in_reply_to_tweet_id, |r| Some(r.1));
    while let Some(parent) = up.filter(|p| *p != 0) {
        let Some(row) = by_id.get(&parent) else { break };
        if ancestors.len() == MAX_ANCESTORS {
            break;
        }
        ancestors.push(row);
        up = Some(row.1);
    }
    ancestors.reverse();
    // Down the tree: every reply whose chain reaches `id`.
    let mut children: HashMap<i64, Vec<&ShapeReply>> = HashMap::new();
    for row in rows.iter().filter(|r| r.1 != 0) {
        children.entry(row.1).or_default().push(row);
    }
    let mut descendants: Vec<&ShapeReply> = Vec::new();
    let mut stack = vec![id];
    while let Some(node) = stack.pop() {
        for child in children.get(&node).map_or(&[][..], Vec::as_slice) {
            descendants.push(child);
            stack.push(child.0);
        }
    }
    descendants.sort_unstable_by_key(|r| (r.2, r.0));
    let (gt, lt) = (
        req.gt.map(crate::time::to_micros),
        req.lt.map(crate::time::to_micros),
    );
    let mut page: Vec<&ShapeReply> = descendants
        .into_iter()
        .filter(|r| gt.is_none_or(|gt| r.2 > gt) && lt.is_none_or(|lt| r.2 < lt))
        .filter(|r| visible(r.3))
        .take(req.limit + 1)
        .collect();
    let has_next_page = page.len() > req.limit;
    page.truncate(req.limit);
    let ancestors: Vec<&ShapeReply> = ancestors.into_iter().filter(|r| visible(r.3)).collect();
    let above: std::collections::HashSet<i64> = ancestors.iter().map(|r| r.0).collect();
    let tweets = hydrate(db, cache, ancestors.iter().chain(&page), viewer).await?;
    let (ancestors, descendants) = tweets.into_iter().partition(|t| above.contains(&t.id));
    Ok(Context {
        ancestors,
        descendants,
        has_next_page,
    })
}

/// The tweets of `rows`, in order, for `viewer` (deleted ones left out): from the object caches,
/// or Postgres alone if Redis fails.
async fn hydrate<'a>(
    db: &PgPool,
    cache: &Cache,
    rows: impl Iterator<Item = &'a &'a ShapeReply>,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Tweet>> {
    let entries: Vec<ListEntry> = rows
        .map(|&&(id, _, micros, author)| ListEntry {
            id,
            tweet_id: id,
            author_id: author,
            created_at: crate::time::from_micros(micros),
            shift: 0,
        })
        .collect();
    let items: Vec<Item> =
        match crate::timeline::hydrate_entries(db, cache, &entries, viewer).await? {
            Some(items) => items,
            None => {
                let ids: Vec<i64> = entries.iter().map(|e| e.id).collect();
                let rows: Vec<FeedRow> = sqlx::query_as(concat!(
                    "select t.id as entry_id, t.created_at,",
                    crate::feed_row_columns!(),
                    "from tweets t join users u on u.id = t.user_id where t.id = any($1)"
                ))
                .bind(&ids)
                .fetch_all(db)
                .await?;
                let mut items = crate::timeline::with_likes(db, cache, rows, viewer).await?;
                let position: HashMap<i64, usize> =
                    ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
                items.sort_by_key(|i| position.get(&i.tweet.id()).copied().unwrap_or(usize::MAX));
                items
            }
        };
    Ok(items.into_iter().filter_map(Tweet::from_item).collect())
}
