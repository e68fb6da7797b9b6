//! Writing to Postgres: `COPY` into temporary staging tables, then `insert … select … on
//! conflict do nothing` into the real tables, all inside the caller's transaction; then the
//! counts, the id sequences and the optional tokens.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::Path;

use anyhow::Context;
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use super::map::{Mapped, Post};
use super::read::InList;
use crate::accounts;
use crate::time::Timestamp;

/// `COPY` text-format escaping.
fn copy_text(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => {}
            c => out.push(c),
        }
    }
}

/// A timestamp in `COPY` text format (UTC, µs).
fn copy_time(t: &Timestamp) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.6f+00").to_string()
}

/// A tweet (`id, user_id, content, created_at, coordinates, place, retweeted_tweet_id`) as a
/// `COPY` text-format line (`\N` for a missing location or retweeted tweet).
fn post_line(p: &Post<'_>) -> String {
    let mut line = String::with_capacity(p.content.len() + 64);
    let _ = write!(line, "{}\t", p.id);
    let _ = write!(line, "{}\t", p.user_id);
    copy_text(p.content, &mut line);
    let _ = write!(line, "\t{}", copy_time(&p.created_at));
    match p.coordinates {
        Some([lon, lat]) => {
            let _ = write!(line, "\t{{{lon},{lat}}}");
        }
        None => line.push_str("\t\\N"),
    }
    match p.place.and_then(|p| serde_json::to_string(p).ok()) {
        Some(json) => {
            line.push('\t');
            copy_text(&json, &mut line);
        }
        None => line.push_str("\t\\N"),
    }
    match p.retweeted_tweet_id {
        Some(id) => {
            let _ = write!(line, "\t{id}");
        }
        None => line.push_str("\t\\N"),
    }
    let mentioned: Vec<String> = p.mentioned_user_ids.iter().map(i64::to_string).collect();
    let _ = write!(line, "\t{{{}}}", mentioned.join(","));
    line
}

/// Streams rows (already in COPY text format, one per line) into `table`.
async fn copy_rows(
    conn: &mut PgConnection,
    statement: &str,
    rows: impl Iterator<Item = String>,
) -> anyhow::Result<u64> {
    let mut copy = conn.copy_in_raw(statement).await?;
    let mut chunk = String::with_capacity(1 << 20);
    for row in rows {
        chunk.push_str(&row);
        chunk.push('\n');
        if chunk.len() >= 1 << 20 {
            copy.send(std::mem::take(&mut chunk).into_bytes()).await?;
        }
    }
    if !chunk.is_empty() {
        copy.send(chunk.into_bytes()).await?;
    }
    Ok(copy.finish().await?)
}

/// Empties every table chirp writes (`--reset`).
pub(super) async fn reset(conn: &mut PgConnection) -> anyhow::Result<()> {
    sqlx::query(
        "truncate users, auth_tokens, tweets, friendships, newsfeeds, feed_heads, jobs, cache_outbox,
                  comments, tweet_likes, comment_likes, lists, list_members, list_feeds,
                  circles, circle_members, notifications, chat_channels, chat_members,
                  chat_messages, mutes, blocks, tweet_edits, tweet_hashtags, hashtags, threads
         restart identity",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The statements that rebuild what [`defer_indexes`] dropped, in order: primary and unique
/// keys, then plain indexes, then foreign keys.
pub(super) struct Deferred(Vec<String>);

/// Drops the indexes, primary and unique keys and foreign keys of `tables` (just emptied by
/// `--reset`, in this transaction) so that the bulk inserts that follow append rows without
/// maintaining an index per row; [`restore_indexes`] builds each once at the end (a sorted
/// build, several times faster for millions of rows). A key that another table's foreign key
/// depends on is kept. The definitions come from the catalog, so what the migrations define
/// is what comes back.
pub(super) async fn defer_indexes(
    conn: &mut PgConnection,
    tables: &[&str],
) -> anyhow::Result<Deferred> {
    let tables: Vec<String> = tables.iter().map(|t| (*t).to_owned()).collect();
    let constraints: Vec<(String, String, bool)> = sqlx::query_as(
        "select format('alter table %s drop constraint %I', c.conrelid::regclass, c.conname),
                format('alter table %s add constraint %I %s', c.conrelid::regclass, c.conname,
                       pg_get_constraintdef(c.oid)),
                c.contype = 'f'
         from pg_constraint c
         where c.conrelid = any($1::text[]::regclass[]) and c.contype in ('p', 'u', 'f')
           and not exists (select 1 from pg_constraint r
                           where r.contype = 'f' and r.conindid = c.conindid and c.contype <> 'f')
         order by c.contype = 'f' desc, c.conname",
    )
    .bind(&tables)
    .fetch_all(&mut *conn)
    .await?;
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "select format('drop index %s', i.indexrelid::regclass), pg_get_indexdef(i.indexrelid)
         from pg_index i
         where i.indrelid = any($1::text[]::regclass[])
           and not exists (select 1 from pg_constraint c where c.conindid = i.indexrelid)
         order by 2",
    )
    .bind(&tables)
    .fetch_all(&mut *conn)
    .await?;
    let (foreign, keys): (Vec<_>, Vec<_>) = constraints.into_iter().partition(|c| c.2);
    // Foreign keys go first (they may use a key), then keys, then indexes. Every statement
    // was written by Postgres's `format` with quoted identifiers from its own catalog.
    for (drop, _, _) in foreign.iter().chain(&keys) {
        sqlx::raw_sql(AssertSqlSafe(drop.clone()))
            .execute(&mut *conn)
            .await?;
    }
    for (drop, _) in &indexes {
        sqlx::raw_sql(AssertSqlSafe(drop.clone()))
            .execute(&mut *conn)
            .await?;
    }
    let mut rebuild: Vec<String> = keys.into_iter().map(|c| c.1).collect();
    rebuild.extend(indexes.into_iter().map(|i| i.1));
    rebuild.extend(foreign.into_iter().map(|c| c.1));
    Ok(Deferred(rebuild))
}

/// Rebuilds what [`defer_indexes`] dropped (a duplicate row fails the import here, and the
/// transaction rolls back: nothing is half-imported).
pub(super) async fn restore_indexes(
    conn: &mut PgConnection,
    deferred: Deferred,
) -> anyhow::Result<()> {
    sqlx::raw_sql("set local maintenance_work_mem = '512MB'")
        .execute(&mut *conn)
        .await?;
    for statement in deferred.0 {
        sqlx::raw_sql(AssertSqlSafe(statement.clone()))
            .execute(&mut *conn)
            .await
            .with_context(|| format!("rebuilding after the bulk load: {statement}"))?;
    }
    Ok(())
}

/// Creates the staging tables, dropped when the transaction ends.
pub(super) async fn create_staging(conn: &mut PgConnection) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "create temp table import_users (id bigint) on commit drop;
         create temp table import_follows (a bigint, b bigint, created_at timestamptz) on commit drop;
         create temp table import_tweets (id bigint, user_id bigint, content text, created_at timestamptz, coordinates double precision[], place jsonb, retweeted_tweet_id bigint, mentioned_user_ids bigint[]) on commit drop;
         create temp table import_replies (id bigint, parent bigint, root bigint) on commit drop;
         create temp table import_tags (tweet_id bigint, tag text) on commit drop;",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Adds one account per graph node (unusable password, no login).
pub(super) async fn users(conn: &mut PgConnection, mapped: &Mapped<'_>) -> anyhow::Result<()> {
    copy_rows(
        conn,
        "copy import_users (id) from stdin",
        mapped.nodes.iter().map(|n| n.to_string()),
    )
    .await?;
    sqlx::query(
        "insert into users (id, username, email, password_hash, created_at)
         select id, case when id between 0 and 9 then 'u0' else 'u' end || id, 'u' || id || '@import.invalid', '!', timestamptz '2012-01-01' from import_users
         on conflict do nothing",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Adds the friendships, one per edge.
pub(super) async fn friendships(
    conn: &mut PgConnection,
    mapped: &Mapped<'_>,
    edges: &[(i64, i64)],
) -> anyhow::Result<()> {
    copy_rows(
        conn,
        "copy import_follows (a, b, created_at) from stdin",
        mapped
            .friendships(edges)
            .map(|(a, b, t)| format!("{a}\t{b}\t{}", copy_time(&t))),
    )
    .await?;
    sqlx::query(
        "insert into friendships (from_user_id, to_user_id, created_at)
         select a, b, created_at from import_follows on conflict do nothing",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Adds the tweets, then links the replies to the tweets they answer (`in_reply_to_tweet_id`,
/// `in_reply_to_user_id`, their thread) and counts them (`replies_count`, the threads' rows),
/// as posting them one by one would have ([`crate::replies`]), and counts the retweets
/// (`retweets_count`, [`crate::retweets`]).
pub(super) async fn tweets_and_replies(
    conn: &mut PgConnection,
    mapped: &Mapped<'_>,
) -> anyhow::Result<()> {
    copy_rows(
        conn,
        "copy import_tweets (id, user_id, content, created_at, coordinates, place, retweeted_tweet_id, mentioned_user_ids) from stdin",
        mapped.tweets().map(|p| post_line(&p)),
    )
    .await?;
    copy_rows(
        conn,
        "copy import_replies (id, parent, root) from stdin",
        mapped
            .replies()
            .map(|(id, parent, root)| format!("{id}\t{parent}\t{root}")),
    )
    .await?;
    sqlx::query(
        "insert into tweets (id, user_id, content, created_at, coordinates, place,
                             retweeted_tweet_id, mentioned_user_ids)
         select id, user_id, content, created_at, coordinates, place, retweeted_tweet_id,
                mentioned_user_ids
         from import_tweets
         on conflict do nothing",
    )
    .execute(&mut *conn)
    .await?;
    hashtags(conn, mapped).await?;
    sqlx::raw_sql(
        "update tweets t set in_reply_to_tweet_id = r.parent, in_reply_to_user_id = p.user_id,
                             thread_id = r.root
         from import_replies r join tweets p on p.id = r.parent
         where t.id = r.id and t.in_reply_to_tweet_id is null;
         update tweets t set replies_count = c.n, counts_version = t.counts_version + 1
         from (select in_reply_to_tweet_id as id, count(*) as n from tweets
               where in_reply_to_tweet_id in (select parent from import_replies) group by 1) c
         where c.id = t.id and t.replies_count <> c.n;
         insert into threads as h (root_id, version) select distinct root, 1 from import_replies
         on conflict (root_id) do update set version = h.version + 1;
         update tweets t set retweets_count = c.n, counts_version = t.counts_version + 1
         from (select retweeted_tweet_id as id, count(*) as n from tweets
               where retweeted_tweet_id in (select retweeted_tweet_id from import_tweets)
               group by 1) c
         where c.id = t.id and t.retweets_count <> c.n;",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Lists the tweets just added under their hashtags ([`crate::hashtags::parse`] of their text,
/// as a post does): the tags' rows, then one `tweet_hashtags` row per (tag, tweet).
async fn hashtags(conn: &mut PgConnection, mapped: &Mapped<'_>) -> anyhow::Result<()> {
    copy_rows(
        conn,
        "copy import_tags (tweet_id, tag) from stdin",
        mapped.tweets().flat_map(|p| {
            crate::hashtags::parse(p.content)
                .into_iter()
                .map(move |tag| {
                    let mut line = format!("{}\t", p.id);
                    copy_text(&tag, &mut line);
                    line
                })
        }),
    )
    .await?;
    sqlx::raw_sql(
        "insert into hashtags (name) select distinct tag from import_tags order by 1
         on conflict do nothing;
         insert into tweet_hashtags (hashtag_id, tweet_id, user_id, created_at)
         select h.id, t.id, t.user_id, t.created_at
         from import_tags i join hashtags h on h.name = i.tag join tweets t on t.id = i.tweet_id
         on conflict do nothing;",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Adds the lists of a circles file, owned by their egos, with their members; accounts for
/// egos and members that are not there yet are added as graph nodes are (`u{id}`). A list's
/// `created_at` is 2012-01-02T00:00:00Z plus its line's position in µs, a membership's
/// 2012-01-03T00:00:00Z plus its position among all memberships in µs (unique, as chirp
/// requires). Lists are matched by (owner, name), so a second import adds nothing.
pub(super) async fn lists(conn: &mut PgConnection, circles: &[InList]) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "create temp table import_lists (owner bigint, name text, created_at timestamptz) on commit drop;
         create temp table import_list_members (owner bigint, name text, user_id bigint, created_at timestamptz) on commit drop;",
    )
    .execute(&mut *conn)
    .await?;
    let list_base = chrono::DateTime::from_timestamp(1_325_462_400, 0).unwrap_or_default();
    let member_base = list_base + chrono::Duration::days(1);
    let mut name = String::new();
    copy_rows(
        conn,
        "copy import_lists (owner, name, created_at) from stdin",
        circles.iter().enumerate().map(|(i, l)| {
            name.clear();
            copy_text(&l.name, &mut name);
            let at = list_base + chrono::Duration::microseconds(i as i64);
            format!("{}\t{name}\t{}", l.owner, copy_time(&at))
        }),
    )
    .await?;
    let memberships = circles
        .iter()
        .flat_map(|l| l.members.iter().map(move |m| (l, *m)))
        .enumerate()
        .map(|(i, (l, m))| {
            let mut name = String::new();
            copy_text(&l.name, &mut name);
            let at = member_base + chrono::Duration::microseconds(i as i64);
            format!("{}\t{name}\t{m}\t{}", l.owner, copy_time(&at))
        });
    copy_rows(
        conn,
        "copy import_list_members (owner, name, user_id, created_at) from stdin",
        memberships,
    )
    .await?;
    sqlx::raw_sql(
        "insert into users (id, username, email, password_hash, created_at)
         select id, case when id between 0 and 9 then 'u0' else 'u' end || id, 'u' || id || '@import.invalid', '!', timestamptz '2012-01-01'
         from (select owner as id from import_lists union select user_id from import_list_members) n
         on conflict do nothing;
         insert into lists (owner_id, name, created_at)
         select owner, name, created_at from import_lists on conflict do nothing;
         insert into list_members (list_id, user_id, created_at)
         select l.id, m.user_id, m.created_at
         from import_list_members m join lists l on l.owner_id = m.owner and l.name = m.name
         on conflict do nothing;",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Puts every staged tweet in its author's and its author's followers' newsfeeds.
pub(super) async fn newsfeeds(conn: &mut PgConnection) -> anyhow::Result<()> {
    crate::newsfeeds::fill_from_friendships(conn).await?;
    Ok(())
}

/// Fills every list's timeline with its members' tweets (rows already there are left alone;
/// imported rows have no `arrived_at`, like imported newsfeed rows).
pub(super) async fn list_feeds(conn: &mut PgConnection) -> anyhow::Result<()> {
    sqlx::query(
        "insert into list_feeds (list_id, tweet_id, created_at, arrived_at)
         select m.list_id, t.id, t.created_at, null
         from list_members m join tweets t on t.user_id = m.user_id
         on conflict do nothing",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Recomputes every user's and tweet's counts from the rows, so they are right whatever was
/// there before, and moves the id sequences past the imported ids, so later sign-ups, tweets
/// and comments get ids above them.
pub(super) async fn counts_and_sequences(conn: &mut PgConnection) -> anyhow::Result<()> {
    sqlx::query(
        "update users u set followers_count = c.followers, followings_count = c.followings,
                tweets_count = c.tweets, counts_version = u.counts_version + 1
         from (select u.id, coalesce(fr.n, 0) as followers, coalesce(fg.n, 0) as followings,
                      coalesce(tw.n, 0) as tweets
               from users u
               left join (select to_user_id as id, count(*) as n from friendships group by 1) fr
                 on fr.id = u.id
               left join (select from_user_id as id, count(*) as n from friendships group by 1) fg
                 on fg.id = u.id
               left join (select user_id as id, count(*) as n from tweets group by 1) tw
                 on tw.id = u.id) c
         where c.id = u.id and (u.followers_count, u.followings_count, u.tweets_count)
                               is distinct from (c.followers, c.followings, c.tweets)",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "update tweets t set comments_count = c.n, counts_version = t.counts_version + 1
         from (select tweet_id, count(*) as n from comments group by tweet_id) c
         where c.tweet_id = t.id and t.comments_count <> c.n",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "update lists l set members_count = c.n
         from (select l.id, (select count(*) from list_members where list_id = l.id) as n from lists l) c
         where c.id = l.id and l.members_count <> c.n",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "select setval(pg_get_serial_sequence('users', 'id'), greatest((select max(id) from users), 1)),
                setval(pg_get_serial_sequence('tweets', 'id'), greatest((select max(id) from tweets), 1)),
                setval(pg_get_serial_sequence('comments', 'id'), greatest((select max(id) from comments), 1)),
                setval(pg_get_serial_sequence('lists', 'id'), greatest((select max(id) from lists), 1))",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Issues tokens for a seeded random sample of `n` accounts that follow someone, and writes
/// `user_id<TAB>token` lines to `path`.
pub(super) async fn write_tokens(
    conn: &mut PgConnection,
    path: &Path,
    n: usize,
) -> anyhow::Result<usize> {
    let mut readers: Vec<i64> =
        sqlx::query_scalar("select id from users where followings_count > 0 order by id")
            .fetch_all(&mut *conn)
            .await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(20121101);
    readers.shuffle(&mut rng);
    readers.truncate(n);
    let mut tokens = Vec::with_capacity(readers.len());
    let mut sys = rand::rng();
    for id in &readers {
        let mut bytes = [0u8; 32];
        sys.fill_bytes(&mut bytes);
        use base64::Engine;
        tokens.push((
            *id,
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
        ));
    }
    copy_rows(
        conn,
        "copy auth_tokens (token_hash, user_id) from stdin",
        tokens.iter().map(|(id, token)| {
            let hash: String = accounts::hash_token(token)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("\\\\x{hash}\t{id}")
        }),
    )
    .await?;
    let mut out = std::io::BufWriter::new(
        File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for (id, token) in &tokens {
        writeln!(out, "{id}\t{token}")?;
    }
    out.flush()?;
    Ok(tokens.len())
}

/// Vacuums the tables the import filled and updates their planner statistics (after the
/// commit). The vacuum sets the visibility map, without which an index-only scan (a fan-out
/// batch's followers, a followers page) fetches every row from the heap until autovacuum gets
/// there: the followers of the most-followed imported account took 3.9 ms to read instead of
/// 0.8 ms. The phase took 1.3 s of a 28.7 s import of the shared data, `ANALYZE` alone 0.8 s
/// (docs/decisions/0010-import-vacuums.md).
pub(super) async fn vacuum_analyze(db: &PgPool) -> anyhow::Result<()> {
    // The simple protocol: `VACUUM` may not run in the implicit block of a prepared statement.
    sqlx::raw_sql(
        "vacuum (analyze) users, tweets, friendships, newsfeeds, comments, lists, list_members,
                          list_feeds",
    )
    .execute(db)
    .await
    .context("vacuuming the imported tables")?;
    Ok(())
}

/// `(table, rows)` for the tables the import writes.
pub(super) async fn table_counts(db: &PgPool) -> anyhow::Result<Vec<(String, i64)>> {
    let tables = [
        "users",
        "friendships",
        "tweets",
        "comments",
        "newsfeeds",
        "auth_tokens",
        "lists",
        "list_members",
        "list_feeds",
    ];
    let counts: Vec<i64> = sqlx::query_scalar(
        "select n from (values
            (1, (select count(*) from users)), (2, (select count(*) from friendships)),
            (3, (select count(*) from tweets)), (4, (select count(*) from comments)),
            (5, (select count(*) from newsfeeds)), (6, (select count(*) from auth_tokens)),
            (7, (select count(*) from lists)), (8, (select count(*) from list_members)),
            (9, (select count(*) from list_feeds))) t(i, n) order by i",
    )
    .fetch_all(db)
    .await?;
    Ok(tables.iter().map(|t| (*t).to_owned()).zip(counts).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_text_escapes_control_characters() {
        let mut out = String::new();
        copy_text("a\tb\nc\\d\0", &mut out);
        assert_eq!(out, "a\\tb\\nc\\\\d");
    }
}
