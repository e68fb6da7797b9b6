//! Posting a tweet: one transaction for the row, the author's own entry, the counts, the
//! fan-out job and the outbox; then the author's cached lists, the object and the streams.

use anyhow::Context;
use sqlx::PgPool;

use super::{NewTweet, Tweet, complete};
use crate::cache::{Cache, Guard, Update};
use crate::db;
use crate::error::ApiResult;
use crate::hybrid::{self, PullPolicy};
use crate::jobs;
use crate::model::{TweetCounts, TweetRecord};
use crate::time::Timestamp;
use crate::timeline::{ListEntry, Timeline};
use crate::{circles, hashtags, newsfeeds, notifications, replies, streams};

/// The predecessors of a new tweet's cached-list merges (`$1` author, `$2` whether the tweet is
/// pulled, `$3` its circle): the author's newest tweet, its newest pulled one, the circle's
/// newest. Each is the top of its index (`order by … limit 1`), one row read however many
/// tweets the author has: written as `max(created_at)`, the planner may aggregate over all of
/// them (it did whenever its statistics predated an author's tweets: 4,380 of them cost 2.5 ms
/// of a 10 ms compose, and the cost grew with every tweet).
macro_rules! predecessors {
    () => {
        "select (select created_at from tweets where user_id = $1
                 order by created_at desc limit 1) as newest,
                case when $2 then (select created_at from tweets where user_id = $1 and pulled
                                   order by created_at desc limit 1) end as newest_pulled,
                (select created_at from tweets where circle_id = $3
                 order by created_at desc limit 1) as newest_in_circle"
    };
}

/// The predecessors' query alone (`$1` author, `$2` pulled, `$3` circle), the first part of
/// the compose's insert ([`INSERT`]); public so a test can read its plan.
pub const PREDECESSORS: &str = predecessors!();

/// The new tweet's time, from the predecessors `p` (`$5` the process's fresh timestamp, `$14`
/// the newest tweet of its hashtags): 1 µs above the author's, the circle's and each tag's
/// newest (read under their row locks, so their tweets commit in the order of their times),
/// or `$5` if that is later (times are whole µs; `greatest` skips the predecessors that are
/// null).
macro_rules! tweet_time {
    () => {
        "greatest(greatest(p.newest, p.newest_in_circle, $14) + interval '1 microsecond', $5)"
    };
}

/// The insert of the tweet with what decides its time and its fan-out job, in one statement
/// (one round trip; the predecessors and the job took one each before): reads the predecessors
/// ([`predecessors!`]), stamps the time, inserts the row, queues its [`jobs::Job::Fanout`]
/// ([`crate::queue_fanout!`]) and returns the row with the predecessors. `$1` author, `$2`
/// pulled, `$3` circle, `$4` content, `$5` a fresh timestamp, `$6` photo URLs, `$7`
/// coordinates, `$8` place, `$9` – `$11` the replied-to tweet, its author and the thread's
/// root, `$12` the retweeted tweet, `$13` the mentioned users, `$14` the tags' newest, `$15`
/// the job's trace id.
///
/// Its snapshot is taken after the author's, the circle's and the tags' row locks (earlier
/// statements of the transaction), so it sees every tweet that committed before them.
macro_rules! insert_tweet {
    ($ctes:expr, $time:expr, $from:expr) => {
        concat!(
            "with ",
            $ctes,
            "p as (",
            predecessors!(),
            "), t as (select p.*, ",
            $time,
            " as at from p",
            $from,
            "), ins as (
                 insert into tweets (user_id, content, created_at, circle_id, photo_urls,
                                     coordinates, place, pulled, in_reply_to_tweet_id,
                                     in_reply_to_user_id, thread_id, retweeted_tweet_id,
                                     mentioned_user_ids)
                 select $1, $4, t.at, $3, $6, $7, $8, $2, $9, $10, $11, $12, $13 from t
                 returning id, user_id, content, created_at, circle_id, photo_urls,
                           coordinates, place, edited_at, edit_version, in_reply_to_tweet_id,
                           in_reply_to_user_id, retweeted_tweet_id, mentioned_user_ids), ",
            crate::queue_fanout!("$15"),
            "
             select ins.*, t.newest, t.newest_pulled, t.newest_in_circle from ins, t"
        )
    };
}

/// [`insert_tweet!`] for a tweet that is fanned out: its time is [`tweet_time!`]. Public so a
/// test can read its plan.
pub const INSERT: &str = insert_tweet!("", tweet_time!(), "");

/// [`insert_tweet!`] for a pulled tweet ([`crate::hybrid`]): its time lies above
/// [`tweet_time!`], above the newest pulled tweet and above the database clock (so above every
/// newsfeed entry committed before: their writers wait for the clock to pass them,
/// [`hybrid::check`]). The statement takes the author's newsfeed head first (`$16`, the author
/// alone: every writer takes heads before the clock, [`crate::newsfeeds::lock_heads`]), then
/// the `pull-clock` lock exclusively until the commit (`pull_clock_stamp`: a pulled compose
/// waits for the entry writers in their last statement, and they wait for it) and moves the
/// clock to the new time. The time is computed on a join with the locked heads' count, so the
/// two locks come in that order.
const INSERT_PULLED: &str = insert_tweet!(
    concat!("heads as (", crate::lock_heads!("$16"), "), "),
    concat!("pull_clock_stamp(", tweet_time!(), ")"),
    ", (select count(*) from heads) as locked"
);

/// What [`INSERT`] and [`INSERT_PULLED`] return: the tweet and its predecessors.
#[derive(sqlx::FromRow)]
struct Inserted {
    #[sqlx(flatten)]
    tweet: TweetRecord,
    newest: Option<Timestamp>,
    newest_pulled: Option<Timestamp>,
    newest_in_circle: Option<Timestamp>,
}

/// Creates a tweet, posted into circle `circle` if given (the caller checked membership with
/// [`circles::check_can_post`]), with the photos the caller stored already (see
/// [`crate::media`]). An author above `CHIRP_FANOUT_PULL_ABOVE` followers (`pull`) has its tweet
/// pulled by its readers instead of fanned out ([`crate::hybrid`]). One transaction inserts the
/// tweet, the author's own newsfeed row, the author's (and circle's) count, the fan-out job
/// (followers, then lists) and the outbox row of its cache updates. Right after the commit it calls `committed` (the caller
/// wakes the job runners: [`crate::jobs::Worker::announce`]), so the fan-out to followers and
/// lists starts while the author's cached lists (and the circle's tweets and rank) get the
/// entry (read your writes), the tweet object and its zero counts are cached and the streams
/// get it ([`streams::publish_created`]). Returns the stored record and the public `Tweet`
/// (`None` if its author could not be loaded after the commit: the tweet stands, and the
/// caller builds the object itself).
///
/// A reply (`new.in_reply_to_tweet_id`) is counted on the tweet it answers and joins its thread
/// ([`crate::replies`]).
///
/// # Errors
/// 400 if the replied-to tweet does not exist, 403 if its author and `author` block each other
/// (nothing is written); Postgres failed before the commit.
#[tracing::instrument(name = "tweets::create", skip(db, cache, new, committed), fields(circle = new.circle_id))]
pub async fn create(
    db: &PgPool,
    cache: &Cache,
    pull: &PullPolicy,
    author: i64,
    new: &NewTweet,
    committed: impl FnOnce(),
) -> ApiResult<(TweetRecord, Option<Tweet>)> {
    let circle = new.circle_id;
    let tag_names = &hashtags::parse(&new.content);
    // Whom it mentions, as the names are now (crate::mentions): before the transaction, not
    // under its locks.
    let mentioned = &crate::mentions::resolve(db, &crate::mentions::parse(&new.content)).await?;
    let created = db::with_unique_timestamp(&["tweets_created_at_key"], |now| async move {
        // Tries rolled back by the pull clock's check (crate::hybrid::check).
        let mut conflicts = 0;
        loop {
            let mut tx = db.begin().await?;
            // The author's row lock first, the time after it: one author's tweets commit in
            // the order of their times (also across processes whose clocks differ), so a
            // refresh of the author's tweets from the newest one a client holds misses none.
            // The same statement counts the tweet and decides whether it is fanned out or
            // pulled by its readers (crate::hybrid); a reply is always fanned out, to the
            // readers who follow both (crate::replies), and so is a retweet (a status appears
            // once in a newsfeed: crate::retweets).
            let may_pull = new.in_reply_to_tweet_id.is_none() && new.retweeted_tweet_id.is_none();
            let (author_counts, pulled, author_row) =
                hybrid::count_tweet(&mut tx, pull, author, may_pull).await?;
            // The thread's row and the replied-to tweet's next (crate::replies: the order of
            // tweet deletes), before the circle's.
            let parent = match new.in_reply_to_tweet_id {
                None => None,
                Some(id) => match replies::lock_parent(&mut tx, author, id).await? {
                    Ok(parent) => Some(parent),
                    Err(refused) => return Ok(Err(refused)),
                },
            };
            // The retweeted tweet's row (its count) next (crate::retweets).
            let original = match new.retweeted_tweet_id {
                None => None,
                Some(id) => match crate::retweets::lock_original(&mut tx, author, id).await? {
                    Ok(row) => Some(row),
                    Err(refused) => return Ok(Err(refused)),
                },
            };
            // The circle's row before any newsfeed head and the pull clock (the order every
            // compose locks in: no two wait for each other in a cycle).
            if let Some(circle) = circle {
                circles::shift_tweets(&mut tx, circle, 1).await?;
            }
            // Its hashtags' rows next, in name order, with each tag's newest tweet.
            let tags = hashtags::lock(&mut tx, tag_names).await?;
            let newest_tagged = tags.iter().filter_map(|t| t.newest).max();
            // A fanned-out tweet's writer that lost the pull clock's check twice takes its
            // head and the clock before it stamps (crate::hybrid::lock_clock).
            if !pulled && conflicts >= hybrid::OPTIMISTIC_TRIES {
                newsfeeds::lock_heads(&mut tx, &[author]).await?;
                hybrid::lock_clock(&mut tx).await?;
            }
            // The tweet, timed above its predecessors (the author's newest tweet, its newest
            // pulled one if this one is pulled, its circle's and each tag's newest, all under
            // their row locks: the author's tweets, the circle's and each tag's commit in the
            // order of their times, so a refresh of any misses none), and a pulled one under
            // the pull clock held exclusively (crate::hybrid). The predecessors also guard the
            // merges into the cached lists.
            // Its fan-out job (followers, then lists: `Job::Fanout`) is queued by the same
            // statement.
            let insert = sqlx::query_as(if pulled { INSERT_PULLED } else { INSERT })
                .bind(author)
                .bind(pulled)
                .bind(circle)
                .bind(&new.content)
                .bind(now)
                .bind(&new.photo_urls)
                .bind(new.coordinates.map(Vec::from))
                .bind(new.place.clone().map(sqlx::types::Json))
                .bind(parent.as_ref().map(|p| p.row.record.id))
                .bind(parent.as_ref().map(|p| p.row.record.user_id))
                .bind(parent.as_ref().map(|p| p.root))
                .bind(original.as_ref().map(|o| o.record.id))
                .bind(mentioned)
                .bind(newest_tagged)
                .bind(jobs::trace_column());
            let insert = if pulled {
                insert.bind([author])
            } else {
                insert
            };
            let Inserted {
                tweet,
                newest,
                newest_pulled,
                newest_in_circle,
            } = insert.fetch_one(&mut *tx).await?;
            let created_at = tweet.created_at;
            crate::mentions::notify(&mut tx, author, tweet.id, mentioned).await?;
            // What the tweet links to: the replied-to tweet's count and the thread's shape with
            // this reply in it, or the retweeted tweet's count.
            let mut linked_updates = Vec::new();
            if let Some(parent) = &parent {
                linked_updates.extend(parent.row.counts_updates());
                linked_updates
                    .push(replies::shape_update(&mut tx, parent.root, parent.version).await?);
            }
            // A retweet: the retweeted tweet's count, and its author is told.
            if let Some(original) = &original {
                linked_updates.extend(original.counts_updates());
                linked_updates.push(Update::Liked {
                    user: author,
                    tweet: crate::retweets::retweet_mark(original.record.id),
                    liked: true,
                });
                if original.record.user_id != author {
                    let verb = notifications::Verb::RetweetedTweet;
                    notifications::notify(
                        &mut tx,
                        original.record.user_id,
                        author,
                        verb,
                        original.record.id,
                    )
                    .await?;
                }
            }
            let tag_ids: Vec<i64> = tags.iter().map(|t| t.id).collect();
            hashtags::insert_rows(&mut tx, tweet.id, author, created_at, &tag_ids).await?;
            // A retweet of a tweet the author's newsfeed shows already gets no row there.
            let own_row = newsfeeds::insert_own(
                &mut tx,
                author,
                tweet.id,
                created_at,
                tweet.retweeted_tweet_id,
            )
            .await?;
            let own = ListEntry::stamped(tweet.id, tweet.id, author, created_at, created_at);
            let feed = own_row.map(|row| {
                let entry = ListEntry::stamped(row.id, tweet.id, author, created_at, row.at);
                (Timeline::Newsfeed(author), entry, row.prev)
            });
            // Each merge names its predecessor: a list that lacks it (an earlier write's cache
            // step has not landed yet) is dropped instead.
            let pulled_list = pulled.then_some((Timeline::Pulled(author), own, newest_pulled));
            let tag_lists = tags
                .iter()
                .map(|t| (Timeline::Hashtag(t.id), own, t.newest));
            let updates = std::iter::once((Timeline::UserTweets(author), own, newest))
                .chain(feed)
                .chain(pulled_list)
                .chain(tag_lists)
                .map(|(t, entry, after)| Update::Merge {
                    list: t.key(),
                    guard: Guard::None,
                    after: after.map(crate::time::to_micros),
                    entries: vec![t.scored(&entry)],
                })
                .chain([
                    Update::TweetCreated {
                        tweet: tweet.clone(),
                        counts: TweetCounts::default(),
                    },
                    Update::UserCounts {
                        id: author,
                        counts: author_counts,
                    },
                ])
                .chain(circles::created_updates(&tweet, newest_in_circle))
                .chain(linked_updates)
                .collect::<Vec<_>>();
            let staged = cache.stage(&mut tx, &updates).await?;
            // The author's own row is a newsfeed entry, ordered with pulled tweets: the
            // database clock must have passed it (its insert read the clock: nearly always
            // past it already, and no statement is needed).
            if pulled {
                let (feed_at, clock) =
                    own_row.map_or((created_at, None), |r| (r.at, Some(r.clock)));
                hybrid::wait_past(&mut tx, feed_at, clock).await?;
            } else if !hybrid::check(&mut tx, own_row.map(|r| r.at)).await? {
                conflicts += 1;
                continue; // rolled back: post it again
            }
            let own_row = own_row.map(|r| (r.id, r.at));
            tx.commit().await?;
            return Ok(Ok((tweet, (staged, own_row, pulled, author_row))));
        }
    })
    .await
    .context("inserting the tweet")?;
    let (tweet, staged) = created?;
    // The fan-out job is queued: its runners need the commit, not the cache step below.
    committed();
    let (staged, own_row, pulled, author_row) = staged;
    cache.finish(db, staged).await;
    // The tweet object (for the streams and the caller), with its author as the transaction
    // left the row (no cache nor Postgres read after the commit). A retweet carries its
    // retweeted tweet (crate::retweets), a tweet its mentioned users.
    let object = Tweet::new(
        tweet.clone(),
        author_row.into(),
        &TweetCounts::default(),
        false,
    );
    let object = complete(db, cache, None, object).await.ok();
    if let Some(object) = &object {
        streams::publish_created(cache, object, &tweet, own_row, pulled).await;
    }
    Ok((tweet, object))
}
