//! Mutes and blocks (../shared/API.md v3 "Blocks and mutes"), and each viewer's hidden set:
//! whom the viewer must not see.
//!
//! Filtering happens at read time (docs/decisions/0021-read-time-visibility.md): a mute or
//! block changes no fan-out row, only the viewer's hidden set ([`Hidden`]: muted or blocked
//! accounts and those blocking the viewer), which every timeline page ([`visible_page`]),
//! stream and notification listing of the viewer reads from this process's memory, Redis or
//! Postgres. The set is versioned (`users.hidden_version`, bumped with the user's row locked in
//! the transaction of each change) and written through the outbox like a counter, so from the
//! moment a mute answers no process answers from the old set. A block also removes both follow
//! edges (their unmerge jobs take the tweets out of both newsfeeds) and refuses the blocked
//! account's follows, likes and comments on the blocker's tweets (403); the blocker's tweets
//! are 404 to the blocked account.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use sqlx::{PgConnection, PgPool};

pub use crate::cache::hidden::Hidden;
use crate::cache::{Cache, Update};
use crate::db;
use crate::error::{ApiError, ApiResult};
use crate::friendships;
use crate::lists::{self, Member};
use crate::pagination::{Page, PageRequest};
use crate::time::Timestamp;
use crate::timeline::Item;
use crate::users::{self, User};

/// Which relation: a mute (hides) or a block (hides both ways, removes follows, refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    Mute,
    Block,
}

impl Relation {
    /// `insert` (`on`) or `delete` of `(user_id $1, target_id $2[, created_at $3])`.
    fn write_sql(self, on: bool) -> &'static str {
        match (self, on) {
            (Relation::Mute, true) => {
                "insert into mutes (user_id, target_id, created_at) values ($1, $2, $3)
                 on conflict (user_id, target_id) do nothing"
            }
            (Relation::Block, true) => {
                "insert into blocks (user_id, target_id, created_at) values ($1, $2, $3)
                 on conflict (user_id, target_id) do nothing"
            }
            (Relation::Mute, false) => "delete from mutes where user_id = $1 and target_id = $2",
            (Relation::Block, false) => "delete from blocks where user_id = $1 and target_id = $2",
        }
    }

    /// A page of `(target_id, created_at)` of user `$1`: `$2` lt, `$3` gt, `$4` limit.
    fn list_sql(self) -> &'static str {
        match self {
            Relation::Mute => {
                "select target_id, created_at from mutes where user_id = $1
                   and created_at < coalesce($2, 'infinity')
                   and created_at > coalesce($3, '-infinity')
                 order by created_at desc limit $4"
            }
            Relation::Block => {
                "select target_id, created_at from blocks where user_id = $1
                   and created_at < coalesce($2, 'infinity')
                   and created_at > coalesce($3, '-infinity')
                 order by created_at desc limit $4"
            }
        }
    }

    fn created_key(self) -> &'static str {
        match self {
            Relation::Mute => "mutes_user_created_key",
            Relation::Block => "blocks_user_created_key",
        }
    }
}

/// `me` starts (`on`) or stops muting or blocking `target`; returns whether `me` now does
/// (`muting` / `blocking` in the answer). Idempotent: doing it again changes nothing. Once it
/// answers, every process's reads of the hidden sets it changed (`me`'s; for a block also
/// `target`'s) see the change.
///
/// # Errors
/// 404 if `target` does not exist, 400 if it is `me`; Postgres failed.
#[tracing::instrument(name = "blocks::set", skip(db, cache))]
pub async fn set(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    target: i64,
    relation: Relation,
    on: bool,
) -> ApiResult<bool> {
    if me == target {
        return Err(ApiError::field(
            "user_id",
            "You can not do this to yourself.",
        ));
    }
    if !users::exists(db, target).await? {
        return Err(ApiError::NotFound);
    }
    let staged = db::with_unique_timestamp(&[relation.created_key()], |now| async move {
        change(db, cache, me, target, relation, on, now).await
    })
    .await
    .context("changing a mute or block")?;
    if let Some(staged) = staged {
        cache.finish(db, staged).await;
    }
    Ok(on)
}

/// The transaction of [`set`]: `None` if nothing changed.
async fn change(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    target: i64,
    relation: Relation,
    on: bool,
    now: Timestamp,
) -> sqlx::Result<Option<crate::cache::Staged>> {
    let mut tx = db.begin().await?;
    let (low, high) = (me.min(target), me.max(target));
    let affected: Vec<i64> = match relation {
        Relation::Mute => vec![me],
        Relation::Block => vec![low, high],
    };
    if relation == Relation::Block && on {
        // As an unfollow: wait for fan-out batches of either in flight (in id order).
        crate::newsfeeds::lock_followers(&mut tx, low, true).await?;
        crate::newsfeeds::lock_followers(&mut tx, high, true).await?;
    }
    // Lock the rows whose hidden sets change (in id order, as `friendships::shift_counts`),
    // before reading anything the sets are made of.
    sqlx::query("update users set hidden_version = hidden_version + 1 where id = any($1)")
        .bind(&affected)
        .execute(&mut *tx)
        .await?;
    let mut write = sqlx::query(relation.write_sql(on)).bind(me).bind(target);
    if on {
        write = write.bind(now);
    }
    let changed = write.execute(&mut *tx).await?.rows_affected();
    if changed == 0 {
        tx.rollback().await?;
        return Ok(None);
    }
    let mut updates = Vec::new();
    if relation == Relation::Block && on {
        for (from, to) in [(me, target), (target, me)] {
            updates.extend(friendships::remove_edge(&mut tx, from, to).await?.1);
        }
    }
    for user in affected {
        let hidden = load(&mut tx, user).await?;
        updates.push(Update::Hidden { user, hidden });
    }
    let staged = cache.stage(&mut tx, &updates).await?;
    tx.commit().await?;
    Ok(Some(staged))
}

/// The ids a user must not see, as SQL: those the user (`$user`, a parameter such as `"$1"`)
/// mutes or blocks and those who block the user. The one definition of a hidden set, for its
/// cached form ([`load`]) and for reads that filter in SQL (notifications). A macro, so queries
/// stay `&'static str`.
#[macro_export]
macro_rules! hidden_accounts_of {
    ($user:literal) => {
        concat!(
            "select target_id from mutes where user_id = ",
            $user,
            " union all select target_id from blocks where user_id = ",
            $user,
            " union all select user_id from blocks where target_id = ",
            $user
        )
    };
}

/// A user's hidden set as three columns of a query over `users` (`hidden_version`, the
/// hidden ids, the ids that block the user), `$user` naming the user's id (a parameter or a
/// column): read into a [`Hidden`] by [`Hidden::new`]. Shared by [`load`] and a token's load
/// ([`crate::accounts::load_token`]), so both read the same set.
#[macro_export]
macro_rules! hidden_set_columns {
    ($user:literal) => {
        concat!(
            "users.hidden_version, array(",
            $crate::hidden_accounts_of!($user),
            "), array(select user_id from blocks where target_id = ",
            $user,
            ")"
        )
    };
}

/// `user`'s hidden set as Postgres has it (one query).
async fn load(conn: &mut PgConnection, user: i64) -> sqlx::Result<Hidden> {
    let (version, hidden, blocked_by): (i64, Vec<i64>, Vec<i64>) = sqlx::query_as(concat!(
        "select ",
        hidden_set_columns!("$1"),
        " from users where id = $1",
    ))
    .bind(user)
    .fetch_optional(conn)
    .await?
    .unwrap_or_default();
    Ok(Hidden::new(version, hidden, blocked_by))
}

/// `user`'s hidden set as Postgres has it now (for `chirp check-cache`).
///
/// # Errors
/// Postgres failed.
pub async fn load_hidden(db: &PgPool, user: i64) -> sqlx::Result<Hidden> {
    load(&mut *db.acquire().await?, user).await
}

/// Whom `viewer` must not see: from this process's memory or Redis, else from Postgres
/// (then cached). Anonymous readers hide nobody.
///
/// # Errors
/// Postgres failed (Redis errors fall back to Postgres).
pub async fn hidden(db: &PgPool, cache: &Cache, viewer: Option<i64>) -> sqlx::Result<Arc<Hidden>> {
    let Some(viewer) = viewer else {
        return Ok(Arc::default());
    };
    let lookup = match cache.get_hidden(viewer).await {
        Ok((Some(hidden), _)) => return Ok(hidden),
        Ok((None, lookup)) => Some(lookup),
        Err(_) => None,
    };
    let hidden = Arc::new(load_hidden(db, viewer).await?);
    if let Some(lookup) = lookup {
        cache.put_hidden(lookup, viewer, &hidden).await;
    }
    Ok(hidden)
}

/// Whether either of `a` and `b` blocks the other, as Postgres has it now (for a write that
/// must be refused: read in its transaction after it locked both users' rows).
///
/// # Errors
/// Postgres failed.
pub async fn blocked_either_way(conn: &mut PgConnection, a: i64, b: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "select exists (select 1 from blocks where (user_id = $1 and target_id = $2)
                                                 or (user_id = $2 and target_id = $1))",
    )
    .bind(a)
    .bind(b)
    .fetch_one(conn)
    .await
}

/// A muted or blocked account in the caller's listing: the User object with `created_at`,
/// when the mute or block began (the listing's cursor: a User has no time of its own).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Related {
    #[serde(flatten)]
    pub user: User,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::time::serialize")]
    pub created_at: Timestamp,
}

/// A page of the accounts `me` mutes or blocks, newest first ([`Related`]).
///
/// # Errors
/// Postgres failed.
pub async fn list(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    relation: Relation,
    req: &PageRequest,
) -> sqlx::Result<Page<Related>> {
    let rows: Vec<(i64, Timestamp)> = sqlx::query_as(relation.list_sql())
        .bind(me)
        .bind(req.lt)
        .bind(req.gt)
        .bind(req.want() as i64)
        .fetch_all(db)
        .await?;
    let page = lists::member_page(db, cache, rows, req).await?;
    Ok(page.map(|m: Member| Related {
        user: m.user,
        created_at: m.created_at,
    }))
}

/// Most entries one read of a filtered page asks for (a refresh's page).
const MOST_PER_READ: usize = 1000;

/// Whether a page shows `item` to a viewer who hides `hidden`: not by a hidden account, not
/// a retweet of a hidden account's tweet (API.md, "Blocks and mutes"), not a retweet whose
/// original is gone ([`crate::retweets::is_orphan`]).
fn shows(hidden: &Hidden, item: &Item) -> bool {
    !hidden.hides(item.tweet.user_id())
        && !(item.retweeted.as_ref()).is_some_and(|o| hidden.hides(o.tweet.user_id()))
        && !crate::retweets::is_orphan(item)
}

/// The page `req` of a timeline without the items it must not show ([`shows`]: hidden accounts, orphaned retweets), never a partial page:
/// `read` is called for `req`, then, while hidden items left it short and the timeline went
/// on, again below the oldest item it returned, asking for twice as many each time (up to
/// [`MOST_PER_READ`]). With nothing left out it is one `read`, as without this filter. Cursors
/// are the items' own times, so the next page continues exactly below what this one showed.
///
/// # Errors
/// What `read` returns.
pub async fn visible_page<F, Fut>(
    hidden: &Hidden,
    req: &PageRequest,
    mut read: F,
) -> sqlx::Result<Vec<Item>>
where
    F: FnMut(PageRequest) -> Fut,
    Fut: Future<Output = sqlx::Result<Vec<Item>>>,
{
    let mut shown = Vec::with_capacity(req.want());
    let mut next = *req;
    loop {
        let items = read(next).await?;
        let ended = items.len() < next.want();
        let oldest = items.last().map(|i| i.created_at);
        shown.extend(items.into_iter().filter(|i| shows(hidden, i)));
        if shown.len() >= req.want() || ended {
            break;
        }
        next.lt = oldest;
        next.limit = (next.limit * 2).min(MOST_PER_READ);
    }
    shown.truncate(req.want());
    Ok(shown)
}
