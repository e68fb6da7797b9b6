//! Edits of a tweet's text within [`EDIT_WINDOW`] of posting, and its versions.

use anyhow::Context;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use super::{EDIT_WINDOW, Tweet, TweetRow};
use crate::cache::{Cache, Update};
use crate::error::{ApiError, ApiResult};
use crate::model::TweetRecord;
use crate::time::{self, Timestamp};
use crate::timeline::Timeline;
use crate::{hashtags, mentions, streams, users};

/// One version of a tweet's text (`GET /api/tweets/{id}/history/`).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TweetVersion {
    /// 0: as posted; each edit adds one (the tweet's `edit_version`).
    pub version: i64,
    pub content: String,
    /// When this text was written: the tweet's `created_at` for version 0, else its edit's.
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
}

/// Replaces the text of tweet `id` of user `me` by `content` (validated), within
/// [`EDIT_WINDOW`] of posting: the replaced text is kept in `tweet_edits`, `edit_version` goes
/// up by one and `edited_at` is set. After the commit the new object is written through to
/// Redis (`SET_IF_NEWER`: no reader that loaded the old text can put it back) and evicted from
/// every process's near cache before this returns ([`Update::TweetEdited`]); then the `edit`
/// stream event goes out. Timeline lists hold ids only, so nothing else changes but the
/// hashtag timelines of the tags the edit adds or removes. Mentions are resolved again from the
/// new text; the users it newly mentions are notified ([`crate::mentions`]). The same text again changes nothing
/// (and is not a new version).
///
/// Returns the tweet as it now is (`has_liked` false: the caller's own is the caller's to add).
///
/// # Errors
/// `NotFound` if there is no such tweet, `Forbidden` if `me` is not its author, a 400 on
/// `content` if the window has passed or the tweet is a retweet.
#[tracing::instrument(name = "tweets::edit", skip(db, cache, content))]
pub async fn edit(db: &PgPool, cache: &Cache, me: i64, id: i64, content: &str) -> ApiResult<Tweet> {
    // The author, for the answer and the stream event (before the row lock, not under it).
    let author = users::load_many(db, cache, &[me])
        .await?
        .remove(&me)
        .ok_or(ApiError::NotFound)?;
    let mut tx = db.begin().await?;
    // `for update`, as a delete: waits for the fan-out batches in flight (they hold a key
    // share), so the readers read below include their rows, and a batch that starts later
    // waits for this commit and streams the new text ([`crate::newsfeeds::fanout_jobs`]);
    // two edits take turns.
    let row: Option<TweetRow> = sqlx::query_as(
        "select id, user_id, content, created_at, circle_id, photo_urls, coordinates, place,
                edited_at, edit_version, in_reply_to_tweet_id, in_reply_to_user_id,
                retweeted_tweet_id, mentioned_user_ids, likes_count, comments_count, replies_count, retweets_count,
                counts_version
         from tweets where id = $1 for update",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let old = match row {
        None => return Err(ApiError::NotFound),
        Some(t) if t.record.user_id != me => return Err(ApiError::Forbidden),
        Some(t) => t,
    };
    if old.record.retweeted_tweet_id.is_some() {
        return Err(ApiError::field("content", "A retweet has no text to edit."));
    }
    if chrono::Utc::now() - old.record.created_at > EDIT_WINDOW {
        return Err(ApiError::field(
            "content",
            "A tweet can only be edited within an hour of posting.",
        ));
    }
    if old.record.content == content {
        // Nothing to write: end the transaction before reading the mentions' users, so this
        // request never holds one pooled connection while it waits for another.
        tx.rollback().await?;
        let mut tweet = Tweet::new(old.record, author.into(), &old.counts, false);
        crate::mentions::complete(db, cache, &mut tweet).await?;
        return Ok(tweet);
    }
    // Whom the new text mentions, resolved now (crate::mentions); those it newly mentions are
    // notified below.
    let mentioned = mentions::resolve(&mut *tx, &mentions::parse(content)).await?;
    sqlx::query(
        "insert into tweet_edits (tweet_id, version, content, created_at) values ($1, $2, $3, $4)",
    )
    .bind(id)
    .bind(old.record.edit_version)
    .bind(&old.record.content)
    .bind(old.record.edited_at.unwrap_or(old.record.created_at))
    .execute(&mut *tx)
    .await
    .context("keeping the replaced text")?;
    // Edit times of one tweet only go up, whatever the clocks.
    let new: TweetRow = sqlx::query_as(concat!(
        "update tweets set content = $2, edit_version = edit_version + 1,
             edited_at = greatest(clock_timestamp(),
                                  coalesce(edited_at, created_at) + interval '1 microsecond'),
             mentioned_user_ids = $3
         where id = $1",
        returning_tweet_row!()
    ))
    .bind(id)
    .bind(content)
    .bind(&mentioned)
    .fetch_one(&mut *tx)
    .await
    .context("editing the tweet")?;
    // Its readers (its rows'), and whether it is pulled (its author's followers read it).
    let (readers, pulled): (Vec<i64>, bool) = sqlx::query_as(
        "select array(select user_id from newsfeeds where tweet_id = $1),
                (select pulled from tweets where id = $1)",
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await
    .context("reading the tweet's readers")?;
    let newly: Vec<i64> = (mentioned.iter())
        .filter(|m| !old.record.mentioned_user_ids.contains(m))
        .copied()
        .collect();
    mentions::notify(&mut tx, me, id, &newly)
        .await
        .context("notifying the newly mentioned")?;
    let mut updates = vec![Update::TweetEdited {
        tweet: new.record.clone(),
    }];
    updates.extend(
        retag(&mut tx, &old.record, &new.record)
            .await
            .context("moving the tweet's hashtag rows")?,
    );
    let staged = cache.stage(&mut tx, &updates).await?;
    tx.commit().await.context("committing the edit")?;
    cache.finish(db, staged).await;
    let mut tweet = Tweet::new(new.record.clone(), author.into(), &new.counts, false);
    // The edit stands; without its mentioned users if Postgres fails now.
    let _ = crate::mentions::complete(db, cache, &mut tweet).await;
    let old_text = old.record.content.as_str();
    streams::publish_edited(cache, &tweet, &new.record, (old_text, &readers), pulled).await;
    Ok(tweet)
}

/// Lists an edited tweet under the tags its new text has and its old one had not, at its own
/// time (below newer tweets of those tags), and unlists it from the tags it lost; the cached
/// lists of both are dropped (not merged into nor trimmed); returns the cache updates.
async fn retag(
    tx: &mut PgConnection,
    old: &TweetRecord,
    new: &TweetRecord,
) -> sqlx::Result<Vec<Update>> {
    let (before, after) = (hashtags::parse(&old.content), hashtags::parse(&new.content));
    let lost: Vec<String> = before
        .iter()
        .filter(|t| !after.contains(t))
        .cloned()
        .collect();
    let gained: Vec<String> = after
        .iter()
        .filter(|t| !before.contains(t))
        .cloned()
        .collect();
    let mut updates = Vec::new();
    if !lost.is_empty() {
        // Dropped, not trimmed of the entry: a removal that lands late (after a later edit
        // gave the tag back and a reader refilled the list) would take out a listed tweet.
        for tag in hashtags::delete_rows(tx, new.id, Some(&lost)).await? {
            updates.push(Update::Invalidate {
                list: Timeline::Hashtag(tag).key(),
            });
        }
    }
    let gained: Vec<i64> = hashtags::lock(tx, &gained)
        .await?
        .iter()
        .map(|t| t.id)
        .collect();
    hashtags::insert_rows(tx, new.id, new.user_id, new.created_at, &gained).await?;
    updates.extend(gained.into_iter().map(|tag| Update::Invalidate {
        list: Timeline::Hashtag(tag).key(),
    }));
    Ok(updates)
}

/// The versions of tweet `id`'s text, oldest first, and its author; `None` if there is no such
/// tweet. One statement, so the versions are of one snapshot.
pub async fn history(db: &PgPool, id: i64) -> sqlx::Result<Option<(i64, Vec<TweetVersion>)>> {
    let rows: Vec<(i64, i64, String, Timestamp)> = sqlx::query_as(
        "select t.user_id, e.version, e.content, e.created_at
         from tweets t join tweet_edits e on e.tweet_id = t.id where t.id = $1
         union all
         select user_id, edit_version, content, coalesce(edited_at, created_at)
         from tweets where id = $1
         order by 2",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    let Some(&(author, ..)) = rows.first() else {
        return Ok(None);
    };
    let versions = rows
        .into_iter()
        .map(|(_, version, content, created_at)| TweetVersion {
            version,
            content,
            created_at,
        })
        .collect();
    Ok(Some((author, versions)))
}
