//! Newsfeeds: the fan-out-on-write rows of `newsfeeds` (every SQL statement on that table lives
//! here) and the three jobs that keep them: fan-out of a new tweet, follow backfill and unfollow
//! unmerge (the merge / unmerge of Mastodon's `FeedManager` and Redis in Action ch. 8). The read
//! path is the generic one of [`crate::timeline`] ([`read`]).
//!
//! Each job step commits its rows and stages its cache updates in the outbox in one transaction
//! (see [`crate::cache::update`]), so a crash between the commit and Redis is repaired by the
//! relay, and a re-run of a step is harmless. Backfill and unmerge are the shared steps of
//! [`crate::fanout`] on the (follower, followee) pair, so follow / unfollow / follow in any job
//! order ends with the feed matching the friendship.
//!
//! The tweets of authors with very many followers are not fanned out but pulled at read time
//! ([`crate::hybrid`], [`read`]).

mod fanout_jobs;

pub use fanout_jobs::{
    Fresh, Leftover, MOVE_HEADS, PART_BATCHES, fanout, fanout_batch, lock_followers, part_size,
};

use std::sync::atomic::Ordering;

use sqlx::{PgConnection, PgPool};

use crate::hybrid;
use crate::likes;
use crate::time::Timestamp;
use crate::timeline::{FeedRow, ListEntry, Timeline};

/// The SQL condition "reader `$reader` sees tweet `$status` pulled from its author"
/// ([`crate::hybrid`]: a pulled tweet after the friendship's `visible_from`): such a reader's
/// newsfeed shows the tweet without a row, so no retweet of it is written there
/// ([`crate::retweets`]). A macro, so queries stay `&'static str`.
#[macro_export]
macro_rules! pulls_tweet {
    ($status:literal, $reader:literal) => {
        concat!(
            "exists (select 1 from tweets o join friendships f on f.to_user_id = o.user_id
                     where o.id = ",
            $status,
            " and o.pulled and f.from_user_id = ",
            $reader,
            " and o.created_at > coalesce(f.visible_from, '-infinity'))"
        )
    };
}

/// `select … from newsfeeds n join tweets t join users u` with the columns of a [`FeedRow`].
macro_rules! newsfeed_rows {
    () => {
        concat!(
            "select n.id as entry_id, n.created_at,",
            crate::feed_row_columns!(),
            "from newsfeeds n join tweets t on t.id = n.tweet_id join users u on u.id = t.user_id "
        )
    };
}

/// The fan-out rows of a hydrated newsfeed page: user `$1`'s, strictly between the cursors
/// (`$2`, `$3`), `$4` at most, newest first ([`rows_page`], and [`page`]'s first branch).
macro_rules! rows_between {
    () => {
        concat!(
            newsfeed_rows!(),
            "where n.user_id = $1
               and n.created_at < coalesce($2, 'infinity') and n.created_at > coalesce($3, '-infinity')
             order by n.created_at desc limit $4"
        )
    };
}

/// The `shift` column of a [`ListEntry`] read from `newsfeeds n join tweets t`: how many µs the
/// entry's time lies past its tweet's (see [`stamp`]).
macro_rules! shift_column {
    () => {
        " (extract(epoch from n.created_at - t.created_at) * 1000000)::bigint as shift "
    };
}

// After the macros it uses.
mod pair;

pub use pair::{backfill, fill_from_friendships, unmerge};

/// The statement of [`stamp`] (`$1` the readers, `$2` the tweet's time; returns `user_id, head,
/// prev`), also the first part of [`insert_own`]'s one statement.
macro_rules! stamp_heads {
    () => {
        "insert into feed_heads as h (user_id, head)
         select r, greatest($2, (select at from pull_clock) + interval '1 microsecond')
         from unnest($1::bigint[]) with ordinality as x(r, i) order by i
         on conflict (user_id) do update
             set prev = nullif(h.head, '-infinity'),
                 head = greatest(excluded.head, h.head + interval '1 microsecond')
         returning user_id, head, prev"
    };
}

/// Stamps new entries of a tweet posted at `at` in the newsfeeds of `readers` (ascending ids,
/// no repeats): each entry's time is `at` if that is above everything the reader's newsfeed
/// ever held (its head), else the head plus 1 µs; the heads move to the new times. A caller
/// that then inserts no row for a reader (its newsfeed had the tweet already) puts the head back
/// with [`unstamp`] in the same transaction.
/// Returns `(reader, entry time, the head before)` in `readers`' order: the head before is
/// the entry's predecessor, which guards its cache merge ([`crate::cache::Update::Merge`]).
///
/// The head rows stay locked until the transaction ends, so the writers of one newsfeed (the
/// author's own row, fan-out batches, a follow's backfill) commit its entries in the order of
/// their times: whoever sees an entry sees every older one, and a refresh with
/// `created_at__gt` = the newest entry a client holds returns exactly what it has not seen
/// (docs/API.md, "Refresh and resume are exact"). Ids in ascending order: two batches lock
/// their common readers in the same order and never deadlock. A reader without a head row
/// (no entry yet) gets one.
///
/// The entries are also stamped above the newest pulled tweet, and the caller ends its
/// transaction with [`hybrid::check`], so pulled tweets and rows keep one order (see
/// [`crate::hybrid`]).
///
/// # Errors
/// Postgres failed.
pub async fn stamp(
    tx: &mut PgConnection,
    readers: &[i64],
    at: Timestamp,
) -> sqlx::Result<Vec<(i64, Timestamp, Option<Timestamp>)>> {
    // `prev` is scratch: only this statement's RETURNING reads it (the row stays locked).
    sqlx::query_as(stamp_heads!())
        .bind(readers)
        .bind(at)
        .fetch_all(tx)
        .await
}

/// Puts the heads of `readers` back where [`stamp`] found them (their newsfeeds got no row), in
/// the transaction that stamped them: nobody else saw the moved heads.
///
/// # Errors
/// Postgres failed.
pub async fn unstamp(tx: &mut PgConnection, readers: &[i64]) -> sqlx::Result<()> {
    if readers.is_empty() {
        return Ok(());
    }
    sqlx::query("update feed_heads set head = coalesce(prev, '-infinity') where user_id = any($1)")
        .bind(readers)
        .execute(tx)
        .await
        .map(|_| ())
}

/// Marks a removal of entries from the newsfeeds of `readers` (ascending ids, no repeats):
/// moves each existing head 1 µs on (no entry takes that time) and returns `(reader, mark)`,
/// the new head, for the removal's cache update ([`crate::cache::Update::Remove`]'s `mark`).
/// Every later entry of the newsfeed names a head at or after the mark as its predecessor, so
/// its merge drops a cached list that this removal has not reached yet (a writer stopped
/// between the commit and its cache step) rather than add an entry beside a removed one: a
/// retweet's status shown twice, by the stale entry and by the new one
/// (docs/decisions/0026-retweets.md). Readers without a head row had no entry: skipped.
///
/// # Errors
/// Postgres failed.
pub async fn mark_removals(
    tx: &mut PgConnection,
    readers: &[i64],
) -> sqlx::Result<Vec<(i64, Timestamp)>> {
    if readers.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "update feed_heads h set head = h.head + interval '1 microsecond'
         from (select user_id from feed_heads
               where user_id = any($1) and head > '-infinity'
               order by user_id for update) x
         where h.user_id = x.user_id
         returning h.user_id, h.head",
    )
    .bind(readers)
    .fetch_all(tx)
    .await
}

/// The statement of [`lock_heads`] (`$1` the readers, or the parameter given; returns
/// `user_id`), also the first part of a pulled compose's insert (`tweets::create`).
#[macro_export]
macro_rules! lock_heads {
    () => {
        $crate::lock_heads!("$1")
    };
    ($readers:literal) => {
        concat!(
            "insert into feed_heads as h (user_id, head)
             select r, '-infinity' from unnest(",
            $readers,
            "::bigint[]) with ordinality as x(r, i) order by i
             on conflict (user_id) do update set head = h.head
             returning user_id"
        )
    };
}

/// Locks the head rows of `readers` (ascending ids; creating missing ones) until the
/// transaction ends, stamping nothing: taken before the pull clock by a writer that must hold
/// both (a pulled compose, a writer's retry that holds the clock from the start), so every
/// transaction takes heads before the clock and none waits in a cycle (see [`crate::hybrid`]).
///
/// # Errors
/// Postgres failed.
pub async fn lock_heads(tx: &mut PgConnection, readers: &[i64]) -> sqlx::Result<()> {
    sqlx::query(lock_heads!())
        .bind(readers)
        .execute(tx)
        .await
        .map(|_| ())
}

/// The newest `limit` entries of user `user_id`'s newsfeed older than `lt` (if given), for
/// filling the cache.
pub async fn entries(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<ListEntry>> {
    let sql = concat!(
        "select n.id, n.tweet_id, t.user_id as author_id, n.created_at,",
        shift_column!(),
        "from newsfeeds n join tweets t on t.id = n.tweet_id
             where n.user_id = $1 and n.created_at < coalesce($2, 'infinity')
             order by n.created_at desc limit $3"
    );
    crate::timeline::fetch_entries(db, sql, user_id, lt, limit).await
}

/// A page of user `user_id`'s newsfeed strictly between the cursors, hydrated in the same
/// query: its fan-out rows and the pulled tweets of the followees it pulls
/// ([`crate::hybrid`]): those after the friendship's `visible_from`, as entries with the
/// tweet's time and the tweet's id negated as their id (they have no row). This is the
/// newsfeed's meaning in one query (the oracle the model tests compare every page with); a
/// cached page of a reader who pulls nothing equals its first branch. (Each pull source's
/// tweets are read by their own index scan: joined flat, the planner merged the reader's
/// followings with every user, 18 ms for a reader of a star with 100,000 followers against
/// 0.2 ms.)
pub async fn page(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    let sql = concat!(
        "(",
        rows_between!(),
        ")
         union all
         (select -t.id as entry_id, t.created_at,",
        crate::feed_row_columns!(),
        "from users u
         join friendships f on f.from_user_id = $1 and f.to_user_id = u.id
         cross join lateral (
             select * from tweets t
             where t.user_id = u.id and t.pulled
               and t.created_at > coalesce(f.visible_from, '-infinity')
               and t.created_at < coalesce($2, 'infinity')
               and t.created_at > coalesce($3, '-infinity')
             order by t.created_at desc limit $4) t
         where u.has_pulled
         order by t.created_at desc limit $4)
         order by created_at desc limit $4"
    );
    crate::timeline::fetch_page(db, sql, user_id, lt, gt, limit).await
}

/// A page of user `user_id`'s fan-out rows strictly between the cursors, hydrated in the same
/// query: [`page`] without the pulled tweets (the Postgres side of the cached rows list,
/// [`Timeline::Newsfeed`], past its window).
pub async fn rows_page(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    crate::timeline::fetch_page(db, rows_between!(), user_id, lt, gt, limit).await
}

/// A newsfeed row of [`first_rows_and_liked`]: the row, and on the newest one only, the reader's
/// liked set.
#[derive(sqlx::FromRow)]
struct RowAndLiked {
    #[sqlx(flatten)]
    row: FeedRow,
    liked: Option<Vec<i64>>,
}

/// The newest `limit` of user `user_id`'s fan-out rows, hydrated ([`rows_page`] without
/// cursors), and its liked set as [`likes::liked_set`] reads it (`None`: too many to cache), in
/// one statement: a cold first page of a reader whose liked set is not cached either (issue
/// 42; decision 0035). The set rides on the newest row (Postgres computes it once, as an
/// init plan); a newsfeed without rows reads it alone.
///
/// # Errors
/// Postgres failed.
pub async fn first_rows_and_liked(
    db: &PgPool,
    user_id: i64,
    limit: usize,
) -> sqlx::Result<(Vec<FeedRow>, Option<Vec<i64>>)> {
    let sql = concat!(
        "select p.*, case when p.newest
                     then array(",
        crate::liked_set_select!("$5"),
        ") end as liked
         from (select r.*, row_number() over (order by r.created_at desc) = 1 as newest
               from (",
        rows_between!(),
        ") r) p
         order by p.created_at desc"
    );
    let mut rows: Vec<RowAndLiked> = sqlx::query_as(sql)
        .bind(user_id)
        .bind(None::<Timestamp>)
        .bind(None::<Timestamp>)
        .bind(limit as i64)
        .bind(likes::MAX_CACHED_LIKES as i64 + 1)
        .fetch_all(db)
        .await?;
    let liked = rows.iter_mut().find_map(|r| r.liked.take());
    let rows = rows.into_iter().map(|r| r.row).collect();
    let liked = match liked {
        Some(all) => likes::cacheable_liked_set(all),
        None => likes::liked_set(db, user_id).await?,
    };
    Ok((rows, liked))
}

/// One source of a newsfeed page that merges pulled tweets ([`read`]), as of one Postgres
/// snapshot ([`sources`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Source {
    /// The pull source whose pulled tweets these are; `None` for the reader's own rows.
    pub author: Option<i64>,
    /// The reader's friendship's `visible_from`: the author's pulled tweets after it are the
    /// reader's (older ones came with the follow's backfill).
    pub visible_from: Option<Timestamp>,
    /// The time of the source's newest entry between the page's cursors in the snapshot
    /// (`None`: it has none there).
    pub newest: Option<Timestamp>,
}

/// The sources of `reader`'s newsfeed between the cursors, in one snapshot: the pull sources
/// among `authors` that the reader follows and its own rows, each with its newest entry there
/// ([`Source::newest`]: index lookups, no join). Empty if it follows none of `authors` (then
/// its rows alone are its newsfeed).
///
/// # Errors
/// Postgres failed.
pub async fn sources(
    db: &PgPool,
    reader: i64,
    authors: &[i64],
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
) -> sqlx::Result<Vec<Source>> {
    if authors.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "with pulls as (
             select f.to_user_id as author, f.visible_from,
                    (select t.created_at from tweets t
                     where t.user_id = f.to_user_id and t.pulled
                       and t.created_at > coalesce(f.visible_from, '-infinity')
                       and t.created_at < coalesce($2, 'infinity')
                       and t.created_at > coalesce($3, '-infinity')
                     order by t.created_at desc limit 1) as newest
             from friendships f where f.from_user_id = $1 and f.to_user_id = any($4))
         select author, visible_from, newest from pulls
         union all
         select null, null, (select created_at from newsfeeds
                             where user_id = $1 and created_at < coalesce($2, 'infinity')
                               and created_at > coalesce($3, '-infinity')
                             order by created_at desc limit 1)
         where exists (select 1 from pulls)",
    )
    .bind(reader)
    .bind(lt)
    .bind(gt)
    .bind(authors)
    .fetch_all(db)
    .await
}

/// A page of `reader`'s newsfeed, newest first (see [`crate::timeline::read`] for `req`).
///
/// A reader who follows no pull source ([`crate::hybrid`]) gets the cached read path of its
/// rows. Otherwise its page merges its cached rows with the cached pulled list of each pull
/// source it follows ([`Timeline::Pulled`]: one list that all the author's readers share,
/// Feeding Frenzy's and Twitter's pull side), checked against one Postgres snapshot of
/// where each source ends ([`sources`]):
///
/// - each list read must reach its source's newest entry in the snapshot: a cached list holds
///   every entry below its newest (merges name their predecessor), so it then holds all the
///   snapshot's entries of the source; a list that lags (a cache step not landed yet) does not,
///   and the page falls back to Postgres;
/// - entries newer than the snapshot's newest are left out: they committed after it, and an
///   entry of another source that committed before them may still be missing from its list.
///   Rows and pulled tweets commit in the order of their times (the pull clock), so what is
///   left is exactly the snapshot's page, the same page as [`page`], the oracle: a refresh
///   from its newest entry misses nothing.
///
/// Redis down, or a list that lags or had more entries past the snapshot than the page: one
/// Postgres query, [`page`].
///
/// # Errors
/// Postgres failed.
pub async fn read(
    db: &PgPool,
    cache: &crate::cache::Cache,
    pulled: &hybrid::PullAuthors,
    reader: i64,
    req: &crate::pagination::PageRequest,
) -> sqlx::Result<Vec<crate::timeline::Item>> {
    let authors = pulled.current(db).await?;
    let sources = sources(db, reader, &authors, req.lt, req.gt).await?;
    if sources.is_empty() {
        let timeline = Timeline::Newsfeed(reader);
        return crate::timeline::read(db, cache, timeline, req, Some(reader)).await;
    }
    if let Some(stats) = cache.stats().filter(|_| cache.available()) {
        if let Some(items) = merge_cached(db, cache, reader, req, &sources).await? {
            stats.merged.fetch_add(1, Ordering::Relaxed);
            return Ok(items);
        }
        stats.merge_fallbacks.fetch_add(1, Ordering::Relaxed);
    }
    let rows = page(db, reader, req.lt, req.gt, req.want()).await?;
    crate::timeline::with_likes(db, cache, rows, Some(reader)).await
}

/// The merged page of [`read`] from the cached lists of `sources`; `None` if a list cannot
/// give the snapshot's page.
async fn merge_cached(
    db: &PgPool,
    cache: &crate::cache::Cache,
    reader: i64,
    req: &crate::pagination::PageRequest,
    sources: &[Source],
) -> sqlx::Result<Option<Vec<crate::timeline::Item>>> {
    // The snapshot's newest entry: everything after it is left out.
    let Some(cap) = sources.iter().filter_map(|s| s.newest).max() else {
        return Ok(Some(Vec::new()));
    };
    let want = req.want();
    // Only sources with an entry between the cursors are read, all at once.
    let reads = sources.iter().filter_map(|s| {
        let newest = s.newest?;
        let timeline = s
            .author
            .map_or(Timeline::Newsfeed(reader), Timeline::Pulled);
        Some(async move {
            let items = crate::timeline::read(db, cache, timeline, req, Some(reader)).await;
            items.map(|items| (s, newest, items))
        })
    });
    let mut merged = Vec::with_capacity(want);
    for (source, newest, items) in futures_util::future::try_join_all(reads).await? {
        // The list lags behind the snapshot (or the entry was deleted since).
        if items.first().is_none_or(|i| i.created_at < newest) {
            return Ok(None);
        }
        // A full page with entries past the snapshot may hide some of its entries below.
        if items.len() >= want && items.iter().any(|i| i.created_at > cap) {
            return Ok(None);
        }
        let visible_from = source.visible_from;
        merged.extend(
            items
                .into_iter()
                .filter(|i| i.created_at <= cap)
                // Pulled tweets after the follow; the reader's rows hold the older ones.
                .filter(|i| {
                    source.author.is_none() || visible_from.is_none_or(|v| i.created_at > v)
                })
                .map(|mut i| {
                    if source.author.is_some() {
                        i.id = -i.tweet.id(); // a pulled entry has no row: [`page`]'s id
                    }
                    i
                }),
        );
    }
    merged.sort_by_key(|i| std::cmp::Reverse(i.created_at));
    merged.truncate(want);
    Ok(Some(merged))
}

/// Where a `streaming/user` stream of user `user_id` starts ([`crate::streams::Cursor::after`]):
/// the id of the newest row of its newsfeed at or before `through` (`0` if none; it anchors the
/// resume token's ids) and the newest entry time there, of a row or of a pulled tweet of the
/// pull sources among `authors` that the user follows ([`crate::hybrid`]; `None` if the
/// newsfeed has no entry). A new stream starts after its newsfeed's newest entry; a `since`
/// resume asks `through` = its time.
///
/// # Errors
/// Postgres failed.
pub async fn newest_entry(
    db: &PgPool,
    user_id: i64,
    authors: &[i64],
    through: Option<Timestamp>,
) -> sqlx::Result<(i64, Option<Timestamp>)> {
    let (id, at): (Option<i64>, Option<Timestamp>) = sqlx::query_as(
        "with r as (select id, created_at from newsfeeds
                    where user_id = $1 and created_at <= coalesce($2, 'infinity')
                    order by created_at desc limit 1)
         select (select id from r),
                greatest((select created_at from r),
                         (select max((select t.created_at from tweets t
                                      where t.user_id = f.to_user_id and t.pulled
                                        and t.created_at > coalesce(f.visible_from, '-infinity')
                                        and t.created_at <= coalesce($2, 'infinity')
                                      order by t.created_at desc limit 1))
                          from friendships f
                          where f.from_user_id = $1 and f.to_user_id = any($3)))",
    )
    .bind(user_id)
    .bind(through)
    .bind(authors)
    .fetch_one(db)
    .await?;
    Ok((id.unwrap_or(0), at))
}

/// The pull sources among `authors` ([`crate::hybrid`]) that `reader` follows, each with its
/// friendship's `visible_from` (its pulled tweets after it are the reader's): which pulled
/// tweets a `streaming/user` stream of the reader is sent live. Primary-key lookups.
///
/// # Errors
/// Postgres failed.
pub async fn pull_follows(
    db: &PgPool,
    reader: i64,
    authors: &[i64],
) -> sqlx::Result<Vec<(i64, Option<Timestamp>)>> {
    if authors.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "select to_user_id, visible_from from friendships
         where from_user_id = $1 and to_user_id = any($2)",
    )
    .bind(reader)
    .bind(authors)
    .fetch_all(db)
    .await
}

/// Which of `users` follow `author` (a pull source, [`crate::hybrid`]), each with its
/// friendship's `visible_from` (the author's pulled tweets after it are the user's): to whose
/// `streaming/user` streams a pulled tweet goes. Primary-key lookups.
///
/// # Errors
/// Postgres failed.
pub async fn followers_among(
    db: &PgPool,
    author: i64,
    users: &[i64],
) -> sqlx::Result<Vec<(i64, Option<Timestamp>)>> {
    sqlx::query_as(
        "select from_user_id, visible_from from friendships
         where to_user_id = $1 and from_user_id = any($2)",
    )
    .bind(author)
    .bind(users)
    .fetch_all(db)
    .await
}

/// Pulled tweets `tweet_ids` as entries of a newsfeed (the tweet's id negated as the entry's,
/// its time as the entry's, as in [`page`]), hydrated (any order; deleted tweets are absent):
/// the Postgres side of a stream's catch-up while Redis does not answer.
pub async fn pulled_at(db: &PgPool, tweet_ids: &[i64]) -> sqlx::Result<Vec<FeedRow>> {
    if tweet_ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(concat!(
        "select -t.id as entry_id, t.created_at,",
        crate::feed_row_columns!(),
        "from tweets t join users u on u.id = t.user_id where t.id = any($1)"
    ))
    .bind(tweet_ids)
    .fetch_all(db)
    .await
}

/// The rows of user `user_id`'s newsfeed at times `at` (primary-key lookups), hydrated (any
/// order; rows of deleted tweets are absent): the Postgres side of a stream's catch-up while
/// Redis does not answer.
pub async fn rows_at(db: &PgPool, user_id: i64, at: &[Timestamp]) -> sqlx::Result<Vec<FeedRow>> {
    sqlx::query_as(concat!(
        newsfeed_rows!(),
        "where n.user_id = $1 and n.created_at = any($2)"
    ))
    .bind(user_id)
    .bind(at)
    .fetch_all(db)
    .await
}

/// The author's own newsfeed row of a new tweet ([`insert_own`]).
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct OwnRow {
    /// The row's id.
    pub id: i64,
    /// Its time (its place in the newsfeed: the tweet's time, or 1 µs past the head).
    pub at: Timestamp,
    /// The head before it: the entry's predecessor, which guards its cache merge.
    pub prev: Option<Timestamp>,
    /// The database clock when the row was written (after its stamp): what
    /// [`crate::hybrid::wait_past`] needs to know whether the clock has passed the row.
    pub clock: Timestamp,
}

/// Inserts the author's own newsfeed row for a new tweet (in the tweet's transaction), stamped
/// as [`stamp`] does; returns it. A tweet's row takes one statement (the stamp, then the row
/// that reads it). A retweet (`retweeted` its tweet) gets no row if the author's newsfeed
/// shows that tweet already ([`shows`]; a status appears once, [`crate::retweets`]): `None`,
/// and the head is put back.
///
/// # Errors
/// Postgres failed.
pub async fn insert_own(
    tx: &mut PgConnection,
    author: i64,
    tweet_id: i64,
    created_at: Timestamp,
    retweeted: Option<i64>,
) -> sqlx::Result<Option<OwnRow>> {
    let Some(status) = retweeted else {
        let row = sqlx::query_as(concat!(
            "with stamped as (",
            stamp_heads!(),
            ")
             insert into newsfeeds (user_id, tweet_id, created_at, arrived_at)
             select user_id, $3, head, clock_timestamp() from stamped
             returning id, created_at as at, (select prev from stamped) as prev,
                       arrived_at as clock"
        ))
        .bind([author])
        .bind(created_at)
        .bind(tweet_id)
        .fetch_one(tx)
        .await?;
        return Ok(Some(row));
    };
    let (at, prev) = stamp(&mut *tx, &[author], created_at)
        .await?
        .first()
        .map_or((created_at, None), |(_, at, prev)| (*at, *prev));
    if !shows(&mut *tx, status, &[author]).await?.is_empty() {
        unstamp(&mut *tx, &[author]).await?;
        return Ok(None);
    }
    let (id, clock) = sqlx::query_as(
        "insert into newsfeeds (user_id, tweet_id, status_id, created_at, arrived_at)
         values ($1, $2, $3, $4, clock_timestamp()) returning id, arrived_at",
    )
    .bind(author)
    .bind(tweet_id)
    .bind(status)
    .bind(at)
    .fetch_one(tx)
    .await?;
    Ok(Some(OwnRow {
        id,
        at,
        prev,
        clock,
    }))
}

/// Which of `readers` have status `status` (a tweet, by itself or by a retweet of it) in
/// their newsfeed: a row of it (the unique `(user_id, status)` index), or the tweet pulled
/// from a followee ([`crate::hybrid`]). Read under the readers' head locks, it sees every row.
///
/// # Errors
/// Postgres failed.
pub async fn shows(tx: &mut PgConnection, status: i64, readers: &[i64]) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(concat!(
        "select r from unnest($2::bigint[]) as x(r)
         where exists (select 1 from newsfeeds n
                       where n.user_id = r and coalesce(n.status_id, n.tweet_id) = $1)
            or ",
        crate::pulls_tweet!("$1", "r")
    ))
    .bind(status)
    .bind(readers)
    .fetch_all(tx)
    .await
}

/// Which of `readers` see tweet `status` pulled from its author ([`crate::hybrid`]): a
/// retweet of it is not written to their newsfeeds (see [`shows`]).
///
/// # Errors
/// Postgres failed.
pub async fn pulled_shows(
    tx: &mut PgConnection,
    status: i64,
    readers: &[i64],
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(concat!(
        "select r from unnest($2::bigint[]) as x(r) where ",
        crate::pulls_tweet!("$1", "r")
    ))
    .bind(status)
    .bind(readers)
    .fetch_all(tx)
    .await
}

/// Inserts newsfeed rows `(reader, tweet, retweeted tweet or null, entry time)` (stamped by
/// the caller under the readers' head locks); returns `(reader, row id)` of each.
///
/// # Errors
/// Postgres failed.
pub async fn insert_rows(
    tx: &mut PgConnection,
    rows: &[(i64, i64, Option<i64>, Timestamp)],
) -> sqlx::Result<Vec<(i64, i64)>> {
    let readers: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let tweets: Vec<i64> = rows.iter().map(|r| r.1).collect();
    let statuses: Vec<Option<i64>> = rows.iter().map(|r| r.2).collect();
    let times: Vec<Timestamp> = rows.iter().map(|r| r.3).collect();
    sqlx::query_as(
        "insert into newsfeeds (user_id, tweet_id, status_id, created_at, arrived_at)
         select r, t, s, at, clock_timestamp()
         from unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::timestamptz[]) as x(r, t, s, at)
         returning user_id, id",
    )
    .bind(readers)
    .bind(tweets)
    .bind(statuses)
    .bind(times)
    .fetch_all(tx)
    .await
}

/// Deletes every newsfeed row of a tweet (in the delete's transaction); returns
/// `(newsfeed_id, reader, entry time)` of each.
pub async fn delete_for_tweet(
    tx: &mut PgConnection,
    tweet_id: i64,
) -> sqlx::Result<Vec<(i64, i64, Timestamp)>> {
    sqlx::query_as("delete from newsfeeds where tweet_id = $1 returning id, user_id, created_at")
        .bind(tweet_id)
        .fetch_all(tx)
        .await
}
