//! Deleting a tweet: its retweets first, then every row that lists it and its cached entries
//! (a retweet's undo shows its readers the next one: [`crate::retweets::reveal`]).

use std::collections::HashMap;

use anyhow::Context;
use sqlx::PgPool;

use super::{MAX_EAGER_REMOVALS, entry_of, shift_tweets_count};
use crate::cache::{Cache, Update};
use crate::error::{ApiError, ApiResult};
use crate::model::TweetRecord;
use crate::time;
use crate::timeline::{ListEntry, Timeline};
use crate::{circles, hashtags, lists, newsfeeds, notifications, replies, streams};

/// Deletes tweet `id` of user `me`: the tweet, every newsfeed, list timeline and hashtag row of
/// it (and its circle's count), and every cached entry (the tweet object becomes a tombstone, so no
/// late reader can bring it back). A tweet with more
/// than [`MAX_EAGER_REMOVALS`] readers (newsfeeds and lists) leaves their cached entries to the
/// tombstone.
///
/// Returns the deleted tweet (the caller deletes its photos).
///
/// # Errors
/// `NotFound` if there is no such tweet, `Forbidden` if `me` is not its author.
#[tracing::instrument(name = "tweets::delete", skip(db, cache))]
pub async fn delete(db: &PgPool, cache: &Cache, me: i64, id: i64) -> ApiResult<TweetRecord> {
    // A tweet with retweets: they go first (crate::retweets), then it, once none is left.
    for _ in 0..MAX_DELETE_ROUNDS {
        match delete_once(db, cache, me, id, true).await? {
            Deleted::Done(deleted) => return Ok(*deleted),
            Deleted::Retweeted => {
                crate::retweets::delete_all_of(db, cache, id).await?;
            }
            // Rolled back: the next try takes the new candidate's lock first.
            Deleted::Contended => {}
        }
    }
    Err(ApiError::Busy(1, "the tweet keeps being retweeted"))
}

/// What one try of [`delete`] did.
enum Deleted {
    /// Deleted (committed).
    Done(Box<TweetRecord>),
    /// Nothing changed: the tweet has retweets, to delete first.
    Retweeted,
    /// Nothing changed: a retweet's undo found a new candidate whose followers lock it could
    /// not take without risking a deadlock ([`crate::retweets::reveal`]); try again.
    Contended,
}

/// How many times [`delete`] deletes a tweet's retweets and tries again before it answers 503
/// (each round deletes every retweet it finds; a new one needs a retweet between the two).
const MAX_DELETE_ROUNDS: usize = 5;

/// Deletes retweet `id` of user `me` while its retweeted tweet is being deleted: as [`delete`],
/// but the readers whose newsfeed showed the tweet by it get no next one
/// ([`crate::retweets::reveal`]): the tweet is going.
///
/// # Errors
/// As [`delete`].
pub async fn delete_retweet(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    id: i64,
) -> ApiResult<TweetRecord> {
    match delete_once(db, cache, me, id, false).await? {
        Deleted::Done(deleted) => Ok(*deleted),
        // Without a reveal nothing is contended; a new retweet of it waits for the tweet's
        // delete and then finds it gone.
        Deleted::Retweeted | Deleted::Contended => Err(ApiError::NotFound),
    }
}

/// What a delete reads of its tweet before it locks anything (none of it ever changes).
#[derive(sqlx::FromRow)]
struct Head {
    user_id: i64,
    thread_id: Option<i64>,
    retweeted_tweet_id: Option<i64>,
    in_reply_to_tweet_id: Option<i64>,
}

/// One try of [`delete`]. A retweet's readers get the next retweet with `reveal_next`
/// ([`crate::retweets::reveal`]).
async fn delete_once(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    id: i64,
    reveal_next: bool,
) -> ApiResult<Deleted> {
    let mut tx = db.begin().await?;
    // Its author and thread never change: read first, to lock in the order of every compose
    // (the author's row, the thread's, then tweet rows, then a circle's; crate::replies).
    let head: Option<Head> = sqlx::query_as(
        "select user_id, thread_id, retweeted_tweet_id, in_reply_to_tweet_id
         from tweets where id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let (thread, original, parent) = match head {
        None => return Err(ApiError::NotFound),
        Some(h) if h.user_id != me => return Err(ApiError::Forbidden),
        Some(h) => (h.thread_id, h.retweeted_tweet_id, h.in_reply_to_tweet_id),
    };
    // A retweet's undo reveals the next one (crate::retweets::reveal), which takes the
    // candidates' followers locks: before the author's row, the order of an unfollow or a
    // block (which hold a followers lock exclusively, then move their users' counts). Taken
    // after the row, an undo and an unfollow of a candidate by its author deadlocked (the
    // history checker's 10-minute run found it).
    if let Some(original) = original.filter(|_| reveal_next) {
        crate::retweets::lock_candidates(&mut tx, &[original])
            .await
            .context("locking the candidates' followers")?;
    }
    let author_counts = shift_tweets_count(&mut tx, me, -1)
        .await
        .context("moving tweets_count")?;
    let thread = match thread {
        Some(root) => Some((root, replies::lock_thread(&mut tx, root).await?)),
        None => None,
    };
    // A reply: the tweet it answers, whose count `replies::detach` moves, is locked now, before
    // this tweet's row and any newsfeed row (the order of a reply's post, and of an unfollow's
    // unmerge, which locks the tweets it reveals before it deletes newsfeed rows). Taken at
    // the detach, after this tweet's newsfeed rows, a delete and an unmerge deadlocked (the
    // history checker's 10-minute run).
    if let Some(parent) = parent {
        sqlx::query("select 1 from tweets where id = $1 for no key update")
            .bind(parent)
            .execute(&mut *tx)
            .await?;
    }
    // Locking the row waits for fan-out batches inserting rows for it (they hold a key share),
    // and for comment deletes and likes (they lock it before their own rows).
    let tweet: Option<TweetRecord> = sqlx::query_as(
        "select id, user_id, content, created_at, circle_id, photo_urls, coordinates, place,
                edited_at, edit_version, in_reply_to_tweet_id, in_reply_to_user_id,
                retweeted_tweet_id, mentioned_user_ids
         from tweets where id = $1 for update",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let tweet = match tweet {
        None => return Err(ApiError::NotFound),
        Some(t) if t.user_id != me => return Err(ApiError::Forbidden),
        Some(t) => t,
    };
    // Its retweets lock this row (`for update`) to count themselves: none commits from here.
    let retweeted: bool =
        sqlx::query_scalar("select exists (select 1 from tweets where retweeted_tweet_id = $1)")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
    if retweeted {
        return Ok(Deleted::Retweeted);
    }
    // A retweet: its original's row next (crate::retweets::uncount), before any row goes.
    let uncounted = crate::retweets::uncount(&mut tx, &tweet)
        .await
        .context("uncounting the retweet")?;
    let readers = newsfeeds::delete_for_tweet(&mut tx, id)
        .await
        .context("deleting the tweet's newsfeed rows")?;
    let reader_ids: Vec<i64> = readers.iter().map(|(_, reader, _)| *reader).collect();
    let lists = lists::delete_for_tweet(&mut tx, id)
        .await
        .context("deleting the tweet's list timeline rows")?;
    if let Some(circle) = tweet.circle_id {
        circles::shift_tweets(&mut tx, circle, -1).await?;
    }
    notifications::forget_tweet(&mut tx, id).await?;
    let tags = hashtags::delete_rows(&mut tx, id, None)
        .await
        .context("deleting the tweet's hashtag rows")?;
    // Its comments and likes go with it (on delete cascade).
    let pulled: bool = sqlx::query_scalar("delete from tweets where id = $1 returning pulled")
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .context("deleting the tweet")?;
    // A reply: the replied-to tweet's count and its thread's shape.
    let linked_updates = match thread {
        Some((root, version)) => replies::detach(&mut tx, &tweet, root, version)
            .await
            .context("detaching the reply from its thread")?,
        None => Vec::new(),
    };
    // A retweet: its readers' next retweet (crate::retweets::reveal).
    let mut retweet_updates = uncounted;
    if let Some(original) = tweet.retweeted_tweet_id.filter(|_| reveal_next) {
        let next = crate::retweets::reveal(&mut tx, cache, original, &reader_ids)
            .await
            .context("revealing the next retweets")?;
        let Some(next) = next else {
            return Ok(Deleted::Contended);
        };
        retweet_updates.extend(next);
    }
    let eager = readers.len() + lists.len() <= MAX_EAGER_REMOVALS;
    // An undone retweet's status may come back to its readers (another retweet, a follow):
    // their removals are marked, after the reveal's stamps (crate::newsfeeds::mark_removals).
    let marks: HashMap<i64, i64> = match tweet.retweeted_tweet_id {
        Some(_) if reveal_next && eager => newsfeeds::mark_removals(&mut tx, &reader_ids)
            .await
            .context("marking the removals")?
            .into_iter()
            .map(|(reader, at)| (reader, time::to_micros(at)))
            .collect(),
        _ => HashMap::new(),
    };
    let own = Timeline::UserTweets(me);
    let mut updates = vec![
        Update::TweetDeleted { id },
        Update::UserCounts {
            id: me,
            counts: author_counts,
        },
        Update::Remove {
            list: own.key(),
            members: vec![own.member(&entry_of(id, id, &tweet))],
            mark: None,
        },
    ];
    if pulled {
        // Its readers' newsfeeds merge it from its author's pulled list (crate::hybrid).
        let list = Timeline::Pulled(me);
        updates.push(Update::Remove {
            list: list.key(),
            members: vec![list.member(&entry_of(id, id, &tweet))],
            mark: None,
        });
    }
    updates.extend(circles::deleted_updates(&tweet));
    updates.extend(linked_updates);
    updates.extend(retweet_updates);
    updates.extend(tags.into_iter().map(|tag| {
        let timeline = Timeline::Hashtag(tag);
        Update::Remove {
            list: timeline.key(),
            members: vec![timeline.member(&entry_of(id, id, &tweet))],
            mark: None,
        }
    }));
    if eager {
        let feeds = readers
            .into_iter()
            .map(|(newsfeed_id, reader, at)| {
                let entry = ListEntry::stamped(newsfeed_id, id, me, tweet.created_at, at);
                (
                    Timeline::Newsfeed(reader),
                    entry,
                    marks.get(&reader).copied(),
                )
            })
            .chain(
                lists
                    .into_iter()
                    .map(|list| (Timeline::List(list), entry_of(id, id, &tweet), None)),
            );
        updates.extend(feeds.map(|(timeline, entry, mark)| Update::Remove {
            list: timeline.key(),
            members: vec![timeline.member(&entry)],
            mark,
        }));
    }
    let staged = cache.stage(&mut tx, &updates).await?;
    tx.commit().await.context("committing the delete")?;
    cache.finish(db, staged).await;
    streams::publish_deleted(cache, &tweet, &reader_ids, pulled).await;
    Ok(Deleted::Done(Box::new(tweet)))
}
