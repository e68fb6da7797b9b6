//! Mentions: `@username` in a tweet's text names a user (Twitter v1.1's
//! `entities.user_mentions`, Mastodon's `mentions`).
//!
//! **Resolved when posted.** [`parse`] reads the names; [`resolve`] turns them into user ids as
//! the tweet is posted (or edited), kept on the row (`tweets.mentioned_user_ids`) in order of
//! first mention. A later rename, or a new account taking a freed name, does not change whom a
//! tweet mentions; a name nobody has is plain text.
//!
//! **Hydrated when read.** The public `mentions` are the users' objects as they are now, like a
//! tweet's author: a cached tweet keeps the ids beside its JSON members
//! ([`crate::cache::objects::CachedTweet::mentions`]), and [`attach`] (a page) or [`complete`]
//! (one tweet) looks the users up in this process's near cache, then Redis (one `MGET` for
//! all of a page), then Postgres. A page without mentions asks nothing.
//!
//! **Notified once.** Each mentioned user but the author gets a `mentioned you` notification in
//! the post's transaction ([`notify`]), unless they mute or block the author or the author
//! blocks them; an edit notifies those it newly mentions (the notification index makes it once
//! per tweet and user).
//!
//! **Streams.** `statuses/filter`'s `follow` delivers the tweets that mention a followed user
//! (`streams::filter`), as Twitter's did.

use std::collections::HashMap;

use sqlx::{PgConnection, PgPool};

use crate::cache::Cache;
use crate::entities::{self, Grammar};
use crate::notifications::{self, Verb};
use crate::timeline::{AuthorBody, Item};
use crate::tweets::Tweet;
use crate::users;

/// Most users one tweet mentions: the first this many distinct names count, the rest of the
/// text stays as written (a cap on the notifications and lookups of one post).
pub const MAX_MENTIONS: usize = 20;

/// Longest name read after `@` (usernames are 3 to 30 characters; imported ones may be
/// shorter).
const MAX_NAME_CHARS: usize = 30;

/// How a mention is written: `@` (or `＠`), then ASCII letters, digits and `_`; not right after
/// a letter, digit, `_` or `@`.
const MENTION: Grammar = Grammar {
    sigils: ['@', '＠'],
    body: name_char,
    joins: joins_mention,
};

/// Whether `c` may be part of a username.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether an `@` right after `c` is part of a word (`ann@example.com`, `@@bob`).
fn joins_mention(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '@' || c == '＠'
}

/// The usernames `content` mentions: each `@name` (ASCII letters, digits and `_`, at most 30;
/// not right after a letter, digit, `_` or `@`, so `ann@example.com` is none), lowercased,
/// without repeats, in order of first use, at most [`MAX_MENTIONS`].
pub fn parse(content: &str) -> Vec<String> {
    let names = entities::scan(content, &MENTION)
        .filter(|name| (1..=MAX_NAME_CHARS).contains(&name.len()))
        .map(str::to_ascii_lowercase);
    entities::distinct(names, MAX_MENTIONS)
}

/// The ids of the users `names` ([`parse`]) name, in the order of `names`; names nobody has are
/// left out. Usernames never change and accounts are never deleted, so a post resolves them
/// before its transaction (not under its locks); a text without `@` asks nothing.
///
/// # Errors
/// Postgres failed.
pub async fn resolve<'e>(
    db: impl sqlx::PgExecutor<'e>,
    names: &[String],
) -> sqlx::Result<Vec<i64>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar(
        "select u.id from unnest($1::text[]) with ordinality n(name, i)
         join users u on u.username = n.name order by n.i",
    )
    .bind(names)
    .fetch_all(db)
    .await
}

/// Notifies each of `mentioned` that `author` mentioned them in `tweet`, inside the caller's
/// transaction: not the author, nobody who mutes or blocks the author or whom the author
/// blocks, and nobody twice for one tweet.
///
/// # Errors
/// Postgres failed.
pub async fn notify(
    tx: &mut PgConnection,
    author: i64,
    tweet: i64,
    mentioned: &[i64],
) -> sqlx::Result<()> {
    if mentioned.iter().all(|m| *m == author) {
        return Ok(());
    }
    let told: Vec<i64> = sqlx::query_scalar(
        "select m from unnest($2::bigint[]) with ordinality x(m, i)
         where m <> $1
           and not exists (select 1 from mutes where user_id = m and target_id = $1)
           and not exists (select 1 from blocks where user_id = m and target_id = $1)
           and not exists (select 1 from blocks where user_id = $1 and target_id = m)
         order by i",
    )
    .bind(author)
    .bind(mentioned)
    .fetch_all(&mut *tx)
    .await?;
    for recipient in told {
        notifications::notify(tx, recipient, author, Verb::Mentioned, tweet).await?;
    }
    Ok(())
}

/// Users by id for hydration: this process's near cache, then Redis (one `MGET`), then Postgres
/// (one query, then cached). Unknown ids are absent; a cache failure falls back to Postgres.
async fn users_of(
    db: &PgPool,
    cache: &Cache,
    ids: &[i64],
) -> sqlx::Result<HashMap<i64, AuthorBody>> {
    let mut found: HashMap<i64, AuthorBody> = HashMap::with_capacity(ids.len());
    let mut missing: Vec<i64> = ids.to_vec();
    if let Ok(cached) = cache.fetch_users(ids).await {
        missing.clear();
        for (id, user) in ids.iter().zip(cached) {
            match user {
                Some(u) => {
                    found.insert(*id, AuthorBody::Cached(u));
                }
                None => missing.push(*id),
            }
        }
    }
    for (id, user) in users::load_uncached(db, cache, &missing).await? {
        found.insert(id, AuthorBody::Record(Box::new(user)));
    }
    Ok(found)
}

/// Sets the `mentions` of `items` and of their retweeted tweets (after
/// [`crate::retweets::attach`]) from the users their tweets mention, as they are now. A page
/// whose tweets mention nobody asks nothing.
///
/// # Errors
/// Postgres failed.
pub async fn attach(db: &PgPool, cache: &Cache, mut items: Vec<Item>) -> sqlx::Result<Vec<Item>> {
    let mut ids: Vec<i64> = Vec::new();
    for item in &items {
        ids.extend(item.tweet.mentioned_user_ids());
        if let Some(original) = &item.retweeted {
            ids.extend(original.tweet.mentioned_user_ids());
        }
    }
    if ids.is_empty() {
        return Ok(items);
    }
    ids.sort_unstable();
    ids.dedup();
    let users = users_of(db, cache, &ids).await?;
    let of = |item: &Item| -> Vec<AuthorBody> {
        (item.tweet.mentioned_user_ids().iter())
            .filter_map(|id| users.get(id).cloned())
            .collect()
    };
    for item in &mut items {
        item.mentions = of(item);
        if let Some(original) = &mut item.retweeted {
            original.mentions = of(original);
        }
    }
    Ok(items)
}

/// Sets the `mentions` of `tweet` and of its retweeted tweet (after
/// [`crate::retweets::complete`]) from the ids they were posted with, as the users are now.
///
/// # Errors
/// Postgres failed.
pub async fn complete(db: &PgPool, cache: &Cache, tweet: &mut Tweet) -> sqlx::Result<()> {
    let original: &[i64] = match &tweet.retweeted_tweet {
        Some(o) => &o.mentioned_user_ids,
        None => &[],
    };
    let mut ids: Vec<i64> = tweet
        .mentioned_user_ids
        .iter()
        .chain(original)
        .copied()
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    ids.sort_unstable();
    ids.dedup();
    let users = users_of(db, cache, &ids).await?;
    let of = |ids: &[i64]| -> Vec<users::User> {
        ids.iter()
            .filter_map(|id| users.get(id).cloned()?.into_record())
            .map(users::User::from)
            .collect()
    };
    tweet.mentions = of(&tweet.mentioned_user_ids);
    if let Some(original) = &mut tweet.retweeted_tweet {
        original.mentions = of(&original.mentioned_user_ids);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_are_read_as_twitter_reads_them() {
        assert_eq!(parse("hi @Bob and @al_1!"), ["bob", "al_1"]);
        assert_eq!(parse("@bob @BOB @bob."), ["bob"], "once, lowercased");
        assert!(
            parse("mail ann@example.com").is_empty(),
            "not inside a word"
        );
        assert!(parse("@@bob").is_empty());
        assert!(parse("@ bob, @").is_empty());
        assert_eq!(parse("(@carol)"), ["carol"]);
        assert_eq!(parse("＠dave é@eve"), ["dave"]);
        let long = format!("@{}", "a".repeat(31));
        assert!(parse(&long).is_empty(), "longer than any username");
        let many: String = (0..30).map(|i| format!("@user{i} ")).collect();
        let names = parse(&many);
        assert_eq!(names.len(), MAX_MENTIONS);
        assert_eq!(names[0], "user0");
    }
}
