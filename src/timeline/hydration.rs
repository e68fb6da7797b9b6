//! A page's hydration: its entries' tweets, authors, counters and the viewer's likes, from
//! Redis and this process's memory, misses from Postgres.

use std::collections::HashSet;

use sqlx::PgPool;

use crate::cache::Cache;
use crate::cache::hydration::{Authors, Prefetched};
use crate::cache::objects::Cached;
use crate::model::{TweetCounts, TweetRecord};
use crate::time::{self, Timestamp};
use crate::{likes, tweets, users};

use super::read::ReadError;
use super::{AuthorBody, FeedRow, Item, ListEntry, ListMember, TweetBody};

/// Hydrates entries from the object caches, falling back to Postgres for misses. Returns the
/// items in order and the entries whose tweet no longer exists. `viewer_likes`: a sample of
/// the viewer's liked set, if the range read took one ([`crate::cache::Window::owner_likes`]);
/// `prefetched`: counters the range read took along ([`crate::cache::Window::prefetched`]).
pub(super) async fn hydrate(
    db: &PgPool,
    cache: &Cache,
    entries: &[ListMember],
    viewer: Option<i64>,
    viewer_likes: Option<&[i64]>,
    prefetched: Prefetched<'_>,
) -> Result<(Vec<Item>, Vec<ListMember>), ReadError> {
    let ids: Vec<i64> = entries.iter().map(|e| e.tweet_id).collect();
    // One round trip: tweets, their counts, their authors, the viewer's likes.
    let fetched = cache
        .fetch_for_hydration(&ids, Authors::Read, viewer, viewer_likes, prefetched)
        .await?;
    let mut author_ids = fetched.authors;

    // Everything below is aligned with `ids` (the entries) or with the sorted `author_ids`: a
    // page is at most a few dozen items, so positions and binary search beat hashing.
    let mut tweets: Vec<Option<(TweetBody, TweetCounts)>> = Vec::with_capacity(ids.len());
    let mut misses = Vec::new();
    for ((id, tweet), count) in ids.iter().zip(fetched.tweets).zip(fetched.counts) {
        tweets.push(match (tweet, count) {
            (Cached::Deleted, _) => None,
            (Cached::Hit(t), Some(c)) => Some((TweetBody::Cached(t), c)),
            _ => {
                misses.push(*id);
                None
            }
        });
    }
    if !misses.is_empty() {
        let rows = (cache.time_postgres("hydration", tweets::rows_by_ids(db, &misses))).await?;
        let loaded: Vec<(TweetRecord, TweetCounts)> =
            rows.into_iter().map(|r| (r.record, r.counts)).collect();
        let absent: Vec<i64> = misses
            .iter()
            .copied()
            .filter(|id| !loaded.iter().any(|(t, _)| t.id == *id))
            .collect();
        cache.put_tweets(&loaded, &absent).await;
        for (tweet, counts) in loaded {
            // The first entry of this tweet gets it; a repeat finds it among the items below.
            if let Some(i) = ids
                .iter()
                .zip(&tweets)
                .position(|(id, t)| *id == tweet.id && t.is_none())
            {
                tweets[i] = Some((TweetBody::Record(Box::new(tweet)), counts));
            }
        }
    }
    let mut authors: Vec<Option<AuthorBody>> = fetched
        .users
        .into_iter()
        .map(|u| u.map(AuthorBody::Cached))
        .collect();
    // The authors of tweets loaded from Postgres were not known to the pipeline.
    for (tweet, _) in tweets.iter().flatten() {
        if let Err(at) = author_ids.binary_search(&tweet.user_id()) {
            author_ids.insert(at, tweet.user_id());
            authors.insert(at, None);
        }
    }
    let missing_authors: Vec<i64> = author_ids
        .iter()
        .zip(&authors)
        .filter(|(_, a)| a.is_none())
        .map(|(id, _)| *id)
        .collect();
    // Misses were asked of Redis above: go straight to Postgres for them.
    for (id, user) in users::load_uncached(db, cache, &missing_authors).await? {
        if let Ok(i) = author_ids.binary_search(&id) {
            authors[i] = Some(AuthorBody::Record(Box::new(user)));
        }
    }
    let liked = match viewer {
        // The pipeline asked the viewer's liked set: `fetched.liked` is its answer.
        Some(user) => likes::liked_given(db, cache, user, &ids, fetched.liked).await?,
        None => HashSet::new(),
    };

    let mut items: Vec<Item> = Vec::with_capacity(entries.len());
    let mut gone = Vec::new();
    for (e, tweet) in entries.iter().zip(tweets) {
        let author_of = |user_id: i64| {
            author_ids
                .binary_search(&user_id)
                .ok()
                .and_then(|i| authors[i].clone())
        };
        let found = match tweet {
            // A tweet is moved into its first item, not cloned.
            Some((tweet, counts)) => author_of(tweet.user_id()).map(|a| (tweet, counts, a)),
            // A page lists a tweet once; should it list one twice, the repeat clones the first.
            None => items
                .iter()
                .find(|i| i.tweet.id() == e.tweet_id)
                .map(|first| (first.tweet.clone(), first.counts, first.author.clone())),
        };
        match found {
            Some((tweet, counts, author)) => items.push(Item {
                id: e.id,
                created_at: time::from_micros(time::to_micros(tweet.created_at()) + e.shift),
                tweet,
                author,
                counts,
                has_liked: liked.contains(&e.tweet_id),
                has_retweeted: false,
                retweeted: None,
                mentions: Vec::new(),
            }),
            None => gone.push(*e),
        }
    }
    Ok((items, gone))
}

/// Hydrates entries that are not a timeline page (a rank): like the read path, from the object
/// caches with Postgres for misses. Returns the items in order (entries of deleted tweets are
/// left out) and whether Redis answered (`false`: the caller should read Postgres alone).
///
/// # Errors
/// Only Postgres errors.
pub async fn hydrate_entries(
    db: &PgPool,
    cache: &Cache,
    entries: &[ListEntry],
    viewer: Option<i64>,
) -> sqlx::Result<Option<Vec<Item>>> {
    let members: Vec<ListMember> = entries.iter().map(ListMember::from).collect();
    match hydrate(db, cache, &members, viewer, None, Prefetched::default()).await {
        Ok((items, _gone)) => Ok(Some(items)),
        Err(ReadError::Cache) => Ok(None),
        Err(ReadError::Db(e)) => Err(e),
    }
}

/// Runs `sql`, a query of a timeline's newest entries (to fill or grow its cached list) whose
/// parameters are the timeline's owner (`$1`), `lt` (`$2`: only entries older, if not null)
/// and the limit (`$3`): the Postgres side of every [`super::Timeline::entries`].
pub(crate) async fn fetch_entries(
    db: &PgPool,
    sql: &'static str,
    owner: i64,
    lt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<ListEntry>> {
    sqlx::query_as(sql)
        .bind(owner)
        .bind(lt)
        .bind(limit as i64)
        .fetch_all(db)
        .await
}

/// Runs `sql`, a hydrated page query strictly between the cursors whose parameters are the
/// timeline's owner (`$1`), `lt` (`$2`), `gt` (`$3`) and the limit (`$4`): the Postgres side
/// of every [`super::Timeline`] page.
pub(crate) async fn fetch_page(
    db: &PgPool,
    sql: &'static str,
    owner: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    sqlx::query_as(sql)
        .bind(owner)
        .bind(lt)
        .bind(gt)
        .bind(limit as i64)
        .fetch_all(db)
        .await
}

/// Items from joined Postgres rows, with `has_liked` for the viewer.
pub async fn with_likes(
    db: &PgPool,
    cache: &Cache,
    rows: Vec<FeedRow>,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Item>> {
    mark_liked(
        db,
        cache,
        rows.into_iter().map(Item::from).collect(),
        viewer,
    )
    .await
}

/// Sets `has_liked` of `items` for the viewer.
pub(super) async fn mark_liked(
    db: &PgPool,
    cache: &Cache,
    mut items: Vec<Item>,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Item>> {
    let ids: Vec<i64> = items.iter().map(|i| i.tweet.id()).collect();
    let liked = likes::liked_tweets(db, cache, viewer, &ids).await?;
    for item in &mut items {
        item.has_liked = liked.contains(&item.tweet.id());
    }
    Ok(items)
}
