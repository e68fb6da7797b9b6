//! Retweets (issue 41; docs/decisions/0026-retweets.md).
//!
//! - **A retweet is a tweet** of the retweeter with empty text that names the retweeted tweet
//!   (`tweets.retweeted_tweet_id`, Twitter v1.1's `retweeted_status`, Mastodon's `reblog`): it
//!   is posted by [`crate::tweets::create`] (one per user and tweet; a retweet of a retweet
//!   retweets the original), so it has the compose path's locks, outbox row, fan-out job and
//!   streams. It is never pulled ([`crate::hybrid`]).
//! - **A status appears at most once in a newsfeed.** A newsfeed row names its status
//!   (`newsfeeds.status_id`: the retweeted tweet, or null for the row's own tweet), and a
//!   unique index on `(user_id, status)` holds the rule. Every writer of a reader's newsfeed
//!   (the author's own row, fan-out, a follow's backfill, [`reveal`]) checks under the reader's
//!   head lock whether the newsfeed shows the status already (by a row, or the original pulled
//!   from a followee): if so it writes nothing. The first entry to reach the newsfeed stays, so
//!   a later retweet never moves a status a client holds (a refresh stays exact: the API's
//!   "Refresh and resume are exact"). Mastodon checks only the newest 40 entries of a feed;
//!   the index checks all of them.
//! - **Undo** ([`unretweet`]): the retweet is deleted as any tweet is; each reader whose
//!   newsfeed showed the status by it gets the next candidate (the earliest other retweet by a
//!   followee, or the original if the reader follows its author) as a new entry at the top of
//!   its newsfeed ([`reveal`]): an entry above everything a client holds, so its next refresh
//!   gets it. A retweet's delete locks the original's row before any newsfeed row goes
//!   ([`uncount`]): undos of one tweet's retweets take turns, so a reveal never picks a
//!   retweet whose delete has not committed (it would write a row that delete has missed).
//!   An unfollow's unmerge reveals the same way the statuses it takes away that another
//!   followee still brings ([`crate::fanout::unmerge`], [`lock_for_reveal`]).
//! - **Deleting the original** deletes each retweet first, each through the normal delete (the
//!   retweeter's count, lists, streams), then the original once none is left.
//! - **A like, comment or reply aimed at a retweet** goes to the tweet it retweets (Twitter's
//!   and Mastodon's rule; [`crate::status_of`]): the client shows that tweet's counts.
//! - **`retweets_count`** is exact like `likes_count`: moved in the retweet's (and the undo's)
//!   transaction with `counts_version`, written through with `SET_IF_NEWER`.
//! - **Reading** ([`attach`]): a page's retweets get their retweeted tweet hydrated from the
//!   object caches (pages leave out a retweet whose original is gone: [`is_orphan`]), and
//!   every item its `has_retweeted`, from the viewer's liked set, which also holds the
//!   viewer's retweets as [`retweet_mark`]s (a page asks nothing more of Redis when the set is
//!   held in memory, and nothing at all when no tweet on it was ever retweeted).

use std::collections::HashSet;

use anyhow::Context;
use axum::http::StatusCode;
use sqlx::{PgConnection, PgPool};

use crate::cache::{Cache, Update};
use crate::error::{ApiError, ApiResult};
use crate::hybrid::{self, PullPolicy};
use crate::model::TweetRecord;
use crate::newsfeeds;
use crate::time::Timestamp;
use crate::timeline::{Item, ListEntry, Timeline};
use crate::tweets::{self, Linked, NewTweet, Tweet, TweetRow};

/// SQL for the tweet that tweet `$id` shows: its retweeted tweet if it is a retweet, else
/// itself (a like, comment or reply aimed at a retweet goes to the tweet it shows: Twitter's
/// and Mastodon's rule). A macro, so queries stay `&'static str`.
#[macro_export]
macro_rules! status_of {
    ($id:literal) => {
        concat!(
            "coalesce((select retweeted_tweet_id from tweets where id = ",
            $id,
            "), ",
            $id,
            ")"
        )
    };
}

/// What [`lock_original`] answers when the user retweeted the tweet already (the retweet
/// stands; [`retweet`] answers it with 200).
const ALREADY: &str = "You have already retweeted this tweet.";

/// The member of a user's liked set that says "retweeted tweet `id`" (`-id - 2`: below the
/// set's markers `-1` and `-2`, [`crate::cache::liked`]).
pub fn retweet_mark(id: i64) -> i64 {
    -id - 2
}

/// For a new retweet of tweet `id` by `author`, in the post's transaction after the author's
/// row lock: the original (a retweet's own retweeted tweet), locked, with its
/// `retweets_count` moved up. `Err` (nothing changed): 404 if there is no such tweet, 403 if
/// either author blocks the other, 409 [`ALREADY`] if `author` retweeted it already.
///
/// # Errors
/// Postgres failed.
pub async fn lock_original(
    tx: &mut PgConnection,
    author: i64,
    id: i64,
) -> sqlx::Result<Result<TweetRow, ApiError>> {
    let found: Option<(i64, Option<i64>)> =
        sqlx::query_as("select user_id, retweeted_tweet_id from tweets where id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let (owner, id) = match found {
        None => return Ok(Err(ApiError::NotFound)),
        Some((owner, None)) => (owner, id),
        Some((_, Some(original))) => {
            let owner: Option<i64> = sqlx::query_scalar("select user_id from tweets where id = $1")
                .bind(original)
                .fetch_optional(&mut *tx)
                .await?;
            match owner {
                None => return Ok(Err(ApiError::NotFound)),
                Some(owner) => (owner, original),
            }
        }
    };
    if owner != author && crate::blocks::blocked_either_way(&mut *tx, owner, author).await? {
        return Ok(Err(ApiError::Forbidden));
    }
    // Under the author's row lock: no retweet of the author's can commit meanwhile.
    let already: bool = sqlx::query_scalar(
        "select exists (select 1 from tweets where user_id = $1 and retweeted_tweet_id = $2)",
    )
    .bind(author)
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    if already {
        return Ok(Err(ApiError::Detail(StatusCode::CONFLICT, ALREADY.into())));
    }
    // Deleted since it was read: refused (the transaction rolls back).
    Ok(tweets::shift_linked(&mut *tx, Linked::Retweets, id, 1)
        .await?
        .ok_or(ApiError::NotFound))
}

/// `user` retweets tweet `id`: `(the retweet, true)` if it was made now, `(it, false)` if the
/// user had retweeted the tweet already. The retweet carries its retweeted tweet
/// (`retweeted_tweet`, with `has_retweeted` true).
///
/// # Errors
/// 404 if there is no such tweet, 403 if either author blocks the other; Postgres failed.
#[tracing::instrument(name = "retweets::retweet", skip(db, cache, pull, committed))]
pub async fn retweet(
    db: &PgPool,
    cache: &Cache,
    pull: &PullPolicy,
    user: i64,
    id: i64,
    committed: impl FnOnce(),
) -> ApiResult<(Tweet, bool)> {
    let new = NewTweet {
        retweeted_tweet_id: Some(id),
        ..NewTweet::default()
    };
    let (record, created) = match tweets::create(db, cache, pull, user, &new, committed).await {
        Ok((record, _)) => (record, true),
        Err(ApiError::Detail(StatusCode::CONFLICT, _)) => {
            let existing = existing(db, user, id).await?.ok_or(ApiError::NotFound)?;
            // The retweet that made it may not have reached the cache yet (its process
            // stopped after the commit): this answer promises it, so it shows everywhere now.
            crate::cache::outbox::settle(cache, db).await;
            (existing, false)
        }
        Err(e) => return Err(e),
    };
    let tweet = object(db, cache, record, user).await?;
    Ok((tweet, created))
}

/// `user`'s retweet of tweet `id` (or of its original, if `id` is a retweet), if any.
async fn existing(db: &PgPool, user: i64, id: i64) -> sqlx::Result<Option<TweetRecord>> {
    let row: Option<TweetRow> = sqlx::query_as(concat!(
        "select id, user_id, content, created_at, circle_id, photo_urls, coordinates, place,
                edited_at, edit_version, in_reply_to_tweet_id, in_reply_to_user_id,
                retweeted_tweet_id, mentioned_user_ids, likes_count, comments_count, replies_count, retweets_count,
                counts_version
         from tweets
         where user_id = $1
           and retweeted_tweet_id = ",
        crate::status_of!("$2"),
    ))
    .bind(user)
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| r.record))
}

/// The public object of `viewer`'s retweet `record`, with its retweeted tweet.
async fn object(db: &PgPool, cache: &Cache, record: TweetRecord, viewer: i64) -> ApiResult<Tweet> {
    let loaded = tweets::load(db, cache, record.id).await?;
    let (record, counts, author) = match loaded {
        Some(found) => found,
        None => {
            let author = crate::users::load_many(db, cache, &[record.user_id])
                .await?
                .remove(&record.user_id)
                .ok_or(ApiError::NotFound)?;
            (record, Default::default(), author)
        }
    };
    let tweet = Tweet::new(record, author.into(), &counts, false);
    tweets::complete(db, cache, Some(viewer), tweet).await
}

/// Completes a tweet object built without its retweet fields: `has_retweeted` for `viewer`
/// and, for a retweet, its retweeted tweet (with `has_liked` and `has_retweeted`).
///
/// # Errors
/// 404 if a retweet's retweeted tweet is gone; Postgres failed.
pub async fn complete(
    db: &PgPool,
    cache: &Cache,
    viewer: Option<i64>,
    mut tweet: Tweet,
) -> ApiResult<Tweet> {
    let mut original = None;
    if let Some(id) = tweet.retweeted_tweet_id {
        let Some((record, counts, author)) = tweets::load(db, cache, id).await? else {
            return Err(ApiError::NotFound);
        };
        original = Some(Tweet::new(record, author.into(), &counts, false));
    }
    // One lookup in the viewer's liked set for all of it; a tweet whose exact count is 0 (no
    // likes, no retweets) needs none.
    let mut asked: Vec<i64> = Vec::new();
    if tweet.retweets_count > 0 {
        asked.push(retweet_mark(tweet.id));
    }
    if let Some(o) = &original {
        asked.extend((o.likes_count > 0).then_some(o.id));
        asked.extend((o.retweets_count > 0).then(|| retweet_mark(o.id)));
    }
    if viewer.is_some() && !asked.is_empty() {
        let marked = crate::likes::liked_tweets(db, cache, viewer, &asked).await?;
        tweet.has_retweeted = marked.contains(&retweet_mark(tweet.id));
        if let Some(o) = &mut original {
            o.has_liked = marked.contains(&o.id);
            o.has_retweeted = marked.contains(&retweet_mark(o.id));
        }
    }
    tweet.retweeted_tweet = original.map(Box::new);
    Ok(tweet)
}

/// `user` takes back its retweet of tweet `id`: returns retweets deleted (0 or 1). Readers
/// whose newsfeed showed the tweet by this retweet get the next one ([`reveal`]).
///
/// # Errors
/// 404 if there is no such tweet; Postgres failed.
#[tracing::instrument(name = "retweets::unretweet", skip(db, cache))]
pub async fn unretweet(db: &PgPool, cache: &Cache, user: i64, id: i64) -> ApiResult<u64> {
    let exists: bool = sqlx::query_scalar("select exists (select 1 from tweets where id = $1)")
        .bind(id)
        .fetch_one(db)
        .await?;
    let deleted = match existing(db, user, id).await? {
        None if !exists => return Err(ApiError::NotFound),
        None => 0,
        Some(retweet) => match tweets::delete(db, cache, user, retweet.id).await {
            Ok(_) => 1,
            // Taken back meanwhile (a concurrent unretweet, or the original's delete).
            Err(ApiError::NotFound) => 0,
            Err(e) => return Err(e),
        },
    };
    if deleted == 0 {
        // Asked for again: the undo that made it may not have reached the cache yet.
        crate::cache::outbox::settle(cache, db).await;
    }
    Ok(deleted)
}

/// For a retweet's delete, in its transaction right after the retweet's row lock and before
/// any newsfeed row goes: locks the original's row and moves its `retweets_count` down, and
/// takes the mark out of the retweeter's liked set. Undos of one tweet's retweets so take
/// turns, and a [`reveal`] (under the same lock) never picks a retweet whose delete is under
/// way. Returns the cache updates (none for a tweet that is not a retweet).
///
/// # Errors
/// Postgres failed.
pub async fn uncount(tx: &mut PgConnection, retweet: &TweetRecord) -> sqlx::Result<Vec<Update>> {
    let Some(original) = retweet.retweeted_tweet_id else {
        return Ok(Vec::new());
    };
    let mut updates = match tweets::shift_linked(&mut *tx, Linked::Retweets, original, -1).await? {
        Some(row) => row.counts_updates(),
        None => Vec::new(),
    };
    updates.push(Update::Liked {
        user: retweet.user_id,
        tweet: retweet_mark(original),
        liked: false,
    });
    Ok(updates)
}

/// The authors (`a`, in id order) of the statuses `$1` and of their retweets: whose followers
/// locks [`reveal`] holds.
macro_rules! candidate_authors {
    () => {
        "select distinct user_id as a from tweets
         where id = any($1) or retweeted_tweet_id = any($1) order by 1"
    };
}

/// Gives each of `readers` whose newsfeed no longer shows tweet `status` the next candidate,
/// if it has one: the earliest live retweet of it by the reader or a followee of the reader,
/// or the tweet itself if the reader is or follows its author (and a reply reaches the reader,
/// [`crate::reply_reaches`]; not if the reader pulls the tweet, [`newsfeeds::shows`]), as a new
/// entry above everything the newsfeed held (stamped under the readers' head locks, with the
/// pull clock held and [`hybrid::check`]ed, so no pulled tweet commits below it).
/// Runs in the transaction that took the status away, after its tweet rows; the candidates'
/// followers locks are held shared (as a fan-out batch does), so an unfollow's unmerge waits
/// and the merges are guarded by the lists' removal generations. Returns the cache merges.
///
/// The caller took those locks before any row ([`lock_candidates`]); a retweet that committed
/// between that and the caller's lock on the status's row brings a new author, whose lock is
/// only tried here: held exclusively (an unfollow or a block that may wait for a row the
/// caller holds), `None`, and the caller rolls back and tries again (taking it first then)
/// rather than wait in a possible deadlock.
///
/// # Errors
/// Postgres failed.
pub async fn reveal(
    tx: &mut PgConnection,
    cache: &Cache,
    status: i64,
    readers: &[i64],
) -> anyhow::Result<Option<Vec<Update>>> {
    if readers.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let mut readers = readers.to_vec();
    readers.sort_unstable();
    readers.dedup();
    let locked: bool = sqlx::query_scalar(concat!(
        "select coalesce(bool_and(pg_try_advisory_xact_lock_shared(",
        "hashtextextended('followers:' || a, 0))), true) from (",
        candidate_authors!(),
        ") s"
    ))
    .bind([status].as_slice())
    .fetch_one(&mut *tx)
    .await
    .context("locking the candidates' followers")?;
    if !locked {
        return Ok(None);
    }
    newsfeeds::lock_heads(&mut *tx, &readers).await?;
    hybrid::lock_clock(&mut *tx).await?;
    let next: Vec<(i64, i64, i64, Timestamp, Option<i64>)> = sqlx::query_as(concat!(
        "select distinct on (x.r) x.r, c.id, c.user_id, c.created_at, c.retweeted_tweet_id
         from unnest($1::bigint[]) as x(r)
         join tweets c on (c.id = $2 or c.retweeted_tweet_id = $2) and not c.pulled
         where (c.user_id = x.r or exists (select 1 from friendships f
                                           where f.from_user_id = x.r and f.to_user_id = c.user_id))
           and not exists (select 1 from newsfeeds n
                           where n.user_id = x.r and coalesce(n.status_id, n.tweet_id) = $2)
           and not ",
        crate::pulls_tweet!("$2", "x.r"),
        " and ",
        crate::reply_reaches!("c", "x.r"),
        " order by x.r, c.created_at"
    ))
    .bind(&readers)
    .bind(status)
    .fetch_all(&mut *tx)
    .await
    .context("finding the next retweets")?;
    if next.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let who: Vec<i64> = next.iter().map(|n| n.0).collect();
    let keys: Vec<_> = who.iter().map(|r| Timeline::Newsfeed(*r).key()).collect();
    let guards = cache.removal_generations(&keys).await.ok();
    let now = crate::time::next_timestamp();
    let stamped = newsfeeds::stamp(&mut *tx, &who, now).await?;
    let rows: Vec<(i64, i64, Option<i64>, Timestamp)> = next
        .iter()
        .zip(&stamped)
        .map(|((r, id, _, _, retweeted), (_, at, _))| (*r, *id, *retweeted, *at))
        .collect();
    let row_of: std::collections::HashMap<i64, i64> = newsfeeds::insert_rows(&mut *tx, &rows)
        .await?
        .into_iter()
        .collect();
    // As every writer of entries: wait until the database clock passes them, so a pulled
    // tweet stamped after the commit lies above them (it can not fail: the clock is held).
    if !hybrid::check(&mut *tx, rows.iter().map(|r| r.3)).await? {
        anyhow::bail!("the pull clock moved while it was held");
    }
    let updates = next
        .iter()
        .zip(&stamped)
        .enumerate()
        .filter_map(|(i, ((r, tweet, author, at, _), (_, entry_at, prev)))| {
            let entry = ListEntry::stamped(*row_of.get(r)?, *tweet, *author, *at, *entry_at);
            let guard = guards.as_ref().and_then(|g| g.get(i).cloned());
            Some(Timeline::Newsfeed(*r).guarded_merge(guard, *prev, &[entry]))
        })
        .collect();
    Ok(Some(updates))
}

/// Takes the followers locks [`reveal`] holds for each of `statuses` (shared, of the authors
/// of each status and of its retweets), in one statement and in id order: a caller that
/// reveals several statuses takes them all before it changes any row, so it never holds a row
/// that an unfollow or a block (which hold one of these locks exclusively) waits for.
///
/// # Errors
/// Postgres failed.
pub async fn lock_candidates(tx: &mut PgConnection, statuses: &[i64]) -> sqlx::Result<()> {
    if statuses.is_empty() {
        return Ok(());
    }
    sqlx::query(concat!(
        "select pg_advisory_xact_lock_shared(hashtextextended('followers:' || a, 0)) from (",
        candidate_authors!(),
        ") s"
    ))
    .bind(statuses)
    .execute(tx)
    .await
    .map(|_| ())
}

/// For a caller that reveals `statuses` outside an undo (an unfollow's unmerge): their
/// followers locks ([`lock_candidates`]), then their rows, in id order, with the lock an undo
/// takes on its retweeted tweet first ([`uncount`]): an undo of one of their retweets in
/// flight commits before [`reveal`] looks for candidates, so it never picks a retweet whose
/// delete has taken its rows but not committed (its row would outlive the retweet).
///
/// # Errors
/// Postgres failed.
pub async fn lock_for_reveal(tx: &mut PgConnection, statuses: &[i64]) -> sqlx::Result<()> {
    if statuses.is_empty() {
        return Ok(());
    }
    lock_candidates(&mut *tx, statuses).await?;
    sqlx::query("select id from tweets where id = any($1) order by id for no key update")
        .bind(statuses)
        .execute(tx)
        .await
        .map(|_| ())
}

/// Deletes every retweet of tweet `id` (before the tweet's own delete: [`crate::tweets::delete`]),
/// each through the normal delete, as its retweeter. Returns how many.
///
/// # Errors
/// Postgres failed.
pub async fn delete_all_of(db: &PgPool, cache: &Cache, id: i64) -> ApiResult<usize> {
    let retweets: Vec<(i64, i64)> =
        sqlx::query_as("select id, user_id from tweets where retweeted_tweet_id = $1")
            .bind(id)
            .fetch_all(db)
            .await?;
    for &(retweet, user) in &retweets {
        match Box::pin(tweets::delete_retweet(db, cache, user, retweet)).await {
            Ok(_) | Err(ApiError::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(retweets.len())
}

/// Fills in the retweeted tweet of each retweet in `items` (hydrated from the object caches,
/// Postgres for misses) and `has_retweeted` of every item and retweeted tweet for `viewer`
/// (false for anonymous readers, and without a lookup for tweets whose exact
/// `retweets_count` is 0). A retweet whose original is gone (its delete is deleting
/// the retweets) keeps `retweeted: None`: [`is_orphan`], which pages leave out.
///
/// # Errors
/// Postgres failed.
pub async fn attach(
    db: &PgPool,
    cache: &Cache,
    viewer: Option<i64>,
    mut items: Vec<Item>,
) -> sqlx::Result<Vec<Item>> {
    let originals: Vec<i64> = items
        .iter()
        .filter_map(|i| i.tweet.retweeted_tweet_id())
        .collect();
    if !originals.is_empty() {
        let entries: Vec<ListEntry> = originals
            .iter()
            .map(|id| ListEntry {
                id: *id,
                tweet_id: *id,
                author_id: 0,
                created_at: crate::time::from_micros(0),
                shift: 0,
            })
            .collect();
        let hydrated = match crate::timeline::hydrate_entries(db, cache, &entries, viewer).await? {
            Some(items) => items,
            None => {
                let rows = newsfeeds::pulled_at(db, &originals).await?;
                crate::timeline::with_likes(db, cache, rows, viewer).await?
            }
        };
        for item in &mut items {
            let Some(original) = item.tweet.retweeted_tweet_id() else {
                continue;
            };
            if let Some(found) = hydrated.iter().find(|h| h.tweet.id() == original) {
                item.retweeted = Some(Box::new(found.clone()));
            }
        }
    }
    // A tweet nobody retweeted (its exact count is 0) needs no lookup: most pages ask nothing.
    let mut marks: Vec<i64> = Vec::new();
    for item in items.iter().filter(|_| viewer.is_some()) {
        if item.counts.retweets > 0 {
            marks.push(retweet_mark(item.tweet.id()));
        }
        if let Some(original) = item.retweeted.as_ref().filter(|o| o.counts.retweets > 0) {
            marks.push(retweet_mark(original.tweet.id()));
        }
    }
    if !marks.is_empty() {
        let retweeted: HashSet<i64> = crate::likes::liked_tweets(db, cache, viewer, &marks).await?;
        for item in &mut items {
            item.has_retweeted = retweeted.contains(&retweet_mark(item.tweet.id()));
            if let Some(original) = &mut item.retweeted {
                original.has_retweeted = retweeted.contains(&retweet_mark(original.tweet.id()));
            }
        }
    }
    Ok(items)
}

/// Whether `item` is a retweet whose retweeted tweet is gone (after [`attach`]): pages leave
/// it out ([`crate::blocks::visible_page`]).
pub fn is_orphan(item: &Item) -> bool {
    item.retweeted.is_none() && item.tweet.retweeted_tweet_id().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retweet_mark_is_below_the_liked_sets_markers() {
        use crate::cache::liked::{LIKED_MARKER, TOO_MANY_MARKER};
        for id in [1, 2, 17, i64::MAX / 2] {
            let mark = retweet_mark(id);
            assert!(
                mark < TOO_MANY_MARKER && TOO_MANY_MARKER < LIKED_MARKER,
                "{id}"
            );
            assert_ne!(mark, retweet_mark(id + 1));
        }
    }
}
