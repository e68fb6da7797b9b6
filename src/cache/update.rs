//! Cache updates after a Postgres write, and the transactional outbox that makes them durable.
//!
//! A write builds its [`Update`]s inside its transaction and calls [`Cache::stage`], which plans
//! the Redis commands and inserts the updates' [`Repair`]s as one `cache_outbox` row *in that
//! transaction*. After the commit, [`Cache::finish`] runs the commands (HTTP handlers run to
//! completion in their own task, so a client that disconnects, or the request timeout, can not
//! cancel it) and deletes the row when Redis confirmed them. If the process dies in between, or Redis fails, the row stays and the
//! relay in [`super::outbox`] applies its repairs: a repair is always safe to apply late and more
//! than once (an invalidation, a tombstone, a versioned write), never a bare `DEL` of a value a
//! slow reader could put back.

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use crate::cache::counts::Versioned;
use crate::cache::held::NearId;
use crate::cache::objects::{TOMBSTONE, encode_user, pipe_put_tweet};
use crate::cache::rank::RANK_TTL_SECS;
use crate::cache::{AfterCommit, Cache, CacheUnavailable, Keys, ListKey, Scored, scripts};
use crate::model::{TweetCounts, TweetRecord, UserCounts, UserRecord};

/// How a merge is guarded against a removal that raced it (see [`scripts::MERGE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// Apply whatever happened meanwhile (entries nobody can remove concurrently, e.g. the
    /// author's own new tweet).
    None,
    /// Apply only if the list's removal generation is still this value (read while the rows
    /// that the merge adds were locked); otherwise drop the list.
    Removals(String),
}

/// One change to apply to Redis after a Postgres commit.
#[derive(Debug, Clone)]
pub enum Update {
    /// Merge entries into a list if it is cached (never creating a partial list), then trim it.
    Merge {
        list: ListKey,
        guard: Guard,
        /// The time (µs) of the entry the merged ones follow in the timeline, if the writer
        /// knows it (a newsfeed's head before the write, an author's newest tweet): a list whose
        /// newest entry is older is dropped instead ([`scripts::MERGE`]).
        after: Option<i64>,
        entries: Vec<Scored>,
    },
    /// Remove members from a list (if cached).
    Remove {
        list: ListKey,
        members: Vec<Vec<u8>>,
        /// The time (µs) a newsfeed's removal moved its head to
        /// ([`crate::newsfeeds::mark_removals`]), stored with the list ([`scripts::REMOVE`]):
        /// a later merge (whose predecessor is that head) finds the list current only if this
        /// removal landed.
        mark: Option<i64>,
    },
    /// Drop a list.
    Invalidate { list: ListKey },
    /// Cache a new tweet object (unless a tombstone is there already) and its zero counts, so
    /// the first hydrations after a fan-out need no Postgres query.
    TweetCreated {
        tweet: TweetRecord,
        counts: TweetCounts,
    },
    /// Replace a tweet object by its tombstone and drop its counts.
    TweetDeleted { id: i64 },
    /// Write through an edited tweet object with its new `edit_version` (never over a newer
    /// version or a tombstone); every process's near cache drops the old one.
    TweetEdited { tweet: TweetRecord },
    /// Write through a user object with its new version.
    UserChanged { user: UserRecord },
    /// Write through a tweet's counts committed with their version.
    TweetCounts { id: i64, counts: TweetCounts },
    /// Write through a user's counts committed with their version.
    UserCounts { id: i64, counts: UserCounts },
    /// A bearer token was revoked (by its hash): tombstone it.
    TokenRevoked { hash: Vec<u8> },
    /// The versioned write-through of a circle tweet's score (likes + comments, committed with
    /// `version`) into its day's cached rank ([`crate::cache::rank`]); `member` from
    /// [`crate::cache::rank::rank_member`].
    RankScore {
        rank: ListKey,
        member: String,
        score: i64,
        version: i64,
    },
    /// `user` liked (`true`) `tweet`: add it to the user's liked set if cached; or stopped
    /// liking it (`false`): drop the set (a like and a cancel may reach Redis in either order;
    /// a dropped set is reloaded with the next read).
    Liked { user: i64, tweet: i64, liked: bool },
    /// Write through the shape of the thread whose first tweet is `root`, read in the
    /// transaction that bumped its version (a reply posted or deleted).
    Thread {
        root: i64,
        shape: super::threads::ThreadShape,
    },
    /// Write through `user`'s hidden set, committed with its version (a mute or block).
    Hidden {
        user: i64,
        hidden: super::hidden::Hidden,
    },
}

/// A time (µs) as the scripts compare entry times ([`scripts::MERGE`]'s `after`,
/// [`scripts::REMOVE`]'s `mark`): the score's whole seconds × 10⁶ plus the sub-second part a
/// member carries.
fn script_time(at: i64) -> i64 {
    let (score, sub) = super::lists::split_time(at);
    score * 1_000_000 + i64::from(sub)
}

/// What the outbox relay does for a key when the post-commit step did not confirm: each is safe
/// to apply late and more than once. Stored as JSON in `cache_outbox.repairs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Repair {
    /// Drop a generation-guarded list or set and bump its generations.
    Invalidate { key: String },
    /// Write the tombstone `-` (a deleted tweet, a revoked token): a reader's `SET NX` of the
    /// old value can not land over it.
    Tombstone { key: String },
    /// Write a versioned value unless a newer one is cached. Applied late (by the relay) it
    /// writes only the *floor* `"{version}|"`: readers take it for a miss and reload from
    /// Postgres, and no older version can be stored over it (a late value must not land on a
    /// key that was cleared since a newer one was written).
    SetIfNewer {
        key: String,
        version: i64,
        value: String,
    },
    /// Delete a key whose stale value is harmless (counts of a deleted tweet).
    Delete { key: String },
    /// [`Repair::Invalidate`] of the same list of many owners of one kind (a fan-out batch's
    /// merges): `{prefix}:{{tag}{id}}:{name}` for each of `ids` ([`Keys::list`]). Ids instead of
    /// keys keep a 1,000-follower batch's outbox row at 11 KB of JSON instead of 63 KB, which
    /// Postgres parses into `jsonb` in 0.6 ms instead of 2–4 ms
    /// (docs/decisions/0009-compact-outbox-rows.md).
    InvalidateMany {
        prefix: String,
        tag: String,
        name: String,
        ids: Vec<i64>,
    },
}

/// Updates staged in a write's transaction: the planned Redis commands and the id of their
/// outbox row. Hand it to [`Cache::finish`] after the commit.
#[must_use = "call Cache::finish after the commit"]
pub struct Staged {
    outbox_id: Option<i64>,
    pipe: redis::Pipeline,
    commands: usize,
    /// Merges planned only after the commit, for the lists that exist then
    /// ([`Cache::stage_merges`]).
    deferred: Vec<Update>,
    /// Objects the updates change, to evict from every process's near cache once Redis holds
    /// their new state.
    evict: Vec<NearId>,
    /// The SHA-256 hex of the tokens the updates revoke, to revoke in every process's token
    /// memory likewise.
    revoked: Vec<String>,
}

impl Staged {
    /// Nothing to do (cache off, or no updates).
    pub fn none() -> Self {
        Staged {
            outbox_id: None,
            pipe: redis::pipe(),
            commands: 0,
            deferred: Vec::new(),
            evict: Vec::new(),
            revoked: Vec::new(),
        }
    }
}

/// The near-cached values whose Redis entry these repairs change (a tweet's tombstone, a
/// user's new version, a tweet's new or deleted counters, a held list's head: every change of
/// a held list, a merge or a removal, has an invalidation for its repair): what to evict from
/// every process's memory after them.
pub fn near_evictions(repairs: &[Repair]) -> Vec<NearId> {
    let mut evict = Vec::new();
    for r in repairs {
        match r {
            Repair::Tombstone { key }
            | Repair::SetIfNewer { key, .. }
            | Repair::Delete { key }
            | Repair::Invalidate { key } => evict.extend(NearId::of_key(key)),
            Repair::InvalidateMany { tag, name, ids, .. } => evict.extend(
                (ids.iter())
                    .filter_map(|id| ListKey::held_list_of(Some((tag, *id)), Some(name)))
                    .map(NearId::Head),
            ),
        }
    }
    evict
}

/// The SHA-256 hex of the tokens that `repairs` tombstone (logouts): what to revoke in every
/// process's token memory after them.
pub fn revocations(repairs: &[Repair]) -> Vec<String> {
    (repairs.iter())
        .filter_map(|r| match r {
            Repair::Tombstone { key } => super::tokens::hex_of_token_key(key).map(str::to_owned),
            _ => None,
        })
        .collect()
}

/// [`near_evictions`] of a write's own `updates`, less the counters of the tweets it creates:
/// no process can hold those (a reader stores only counters Redis or Postgres had). A new tweet
/// still evicts the heads of its author's tweets and of its circle, and waits for their
/// acknowledgements (docs/decisions/0016-held-timeline-heads.md). (The outbox relay evicts the
/// counters anyway: harmless, and rare.)
fn evictions_of(updates: &[Update], repairs: &[Repair]) -> Vec<NearId> {
    let created: Vec<i64> = updates
        .iter()
        .filter_map(|u| match u {
            Update::TweetCreated { tweet, .. } => Some(tweet.id),
            _ => None,
        })
        .collect();
    let mut evict = near_evictions(repairs);
    evict.retain(|e| !matches!(e, NearId::Counts(id) if created.contains(id)));
    evict
}

impl Update {
    /// The repair of a merge into `list`: drop it (a late merge could land after a removal).
    fn merge_repair(keys: &Keys, list: ListKey) -> Repair {
        Repair::Invalidate {
            key: keys.list(list),
        }
    }

    /// Adds this update's Redis commands to `pipe` and returns the repairs that stand for it in
    /// the outbox: one `match`, so the two can not drift apart.
    fn plan(&self, keys: &Keys, ttl: u64, limit: usize, pipe: &mut redis::Pipeline) -> Vec<Repair> {
        // Object updates: the command is the repair itself.
        let direct = |pipe: &mut redis::Pipeline, repairs: Vec<Repair>| {
            for r in &repairs {
                r.pipe(pipe, ttl, false);
            }
            repairs
        };
        match self {
            Update::Merge {
                list,
                guard,
                after,
                entries,
            } => {
                let key = keys.list(*list);
                let mut inv = scripts::MERGE.key(&key);
                inv.key(Keys::gen_of(&key));
                match guard {
                    Guard::None => inv.arg("*"),
                    Guard::Removals(r) => inv.arg(r.as_str()),
                };
                inv.arg(ttl).arg(limit);
                match after {
                    Some(at) => inv.arg(script_time(*at)),
                    None => inv.arg(""),
                };
                for (score, member) in entries {
                    inv.arg(*score).arg(member);
                }
                pipe.invoke_script(&inv).ignore();
                vec![Update::merge_repair(keys, *list)]
            }
            Update::Remove {
                list,
                members,
                mark,
            } => {
                let key = keys.list(*list);
                let mut inv = scripts::REMOVE.key(&key);
                inv.key(Keys::gen_of(&key)).arg(ttl);
                match mark {
                    Some(at) => inv.arg(script_time(*at)),
                    None => inv.arg(""),
                };
                for m in members {
                    inv.arg(m);
                }
                pipe.invoke_script(&inv).ignore();
                vec![Repair::Invalidate { key }]
            }
            Update::Invalidate { list } => direct(
                pipe,
                vec![Repair::Invalidate {
                    key: keys.list(*list),
                }],
            ),
            Update::TweetCreated { tweet, counts } => {
                pipe_put_tweet(pipe, keys, tweet, ttl);
                // Readers fill a missing tweet object from Postgres: only the counts to repair.
                direct(
                    pipe,
                    vec![Repair::versioned(keys.tweet_counts(tweet.id), counts)],
                )
            }
            Update::TweetDeleted { id } => direct(
                pipe,
                vec![
                    Repair::Tombstone {
                        key: keys.tweet(*id),
                    },
                    Repair::Delete {
                        key: keys.tweet_counts(*id),
                    },
                ],
            ),
            Update::TweetEdited { tweet } => {
                let cached = super::objects::CachedTweet::of(tweet);
                direct(
                    pipe,
                    vec![Repair::SetIfNewer {
                        key: keys.tweet(tweet.id),
                        version: cached.version,
                        value: cached.encode(),
                    }],
                )
            }
            Update::UserChanged { user } => direct(
                pipe,
                encode_user(user)
                    .map(|value| Repair::SetIfNewer {
                        key: keys.user(user.id),
                        version: user.version,
                        value,
                    })
                    .into_iter()
                    .collect(),
            ),
            Update::TweetCounts { id, counts } => direct(
                pipe,
                vec![Repair::versioned(keys.tweet_counts(*id), counts)],
            ),
            Update::Hidden { user, hidden } => {
                direct(pipe, vec![Repair::versioned(keys.hidden(*user), hidden)])
            }
            Update::Thread { root, shape } => {
                direct(pipe, vec![Repair::versioned(keys.thread(*root), shape)])
            }
            Update::UserCounts { id, counts } => {
                direct(pipe, vec![Repair::versioned(keys.user_counts(*id), counts)])
            }
            Update::TokenRevoked { hash } => direct(
                pipe,
                vec![Repair::Tombstone {
                    key: keys.token(hash),
                }],
            ),
            Update::RankScore {
                rank,
                member,
                score,
                version,
            } => {
                let key = keys.list(*rank);
                let mut inv = scripts::RANK_SET.key(&key);
                inv.key(Keys::gen_of(&key))
                    .key(Keys::versions_of(&key))
                    .arg(RANK_TTL_SECS)
                    .arg(member)
                    .arg(*score)
                    .arg(*version);
                pipe.invoke_script(&inv).ignore();
                vec![Repair::Invalidate { key }]
            }
            Update::Liked { user, tweet, liked } => {
                let key = keys.liked(*user);
                if *liked {
                    let mut inv = scripts::SET_ADD.key(&key);
                    inv.key(Keys::gen_of(&key)).arg(ttl).arg(*tweet);
                    pipe.invoke_script(&inv).ignore();
                    vec![Repair::Invalidate { key }]
                } else {
                    direct(pipe, vec![Repair::Invalidate { key }])
                }
            }
        }
    }
}

impl Repair {
    /// The versioned write-through of `counts` under `key`.
    fn versioned(key: String, counts: &impl Versioned) -> Self {
        Repair::SetIfNewer {
            key,
            version: counts.version(),
            value: counts.encode(),
        }
    }

    /// The merge repairs of `lists`: one [`Repair::InvalidateMany`] per kind of owner and list
    /// name, in order of first appearance; an [`Repair::Invalidate`] for a list whose owner
    /// has no single-id hash tag (a circle's day).
    fn invalidate_lists(keys: &Keys, lists: impl IntoIterator<Item = ListKey>) -> Vec<Repair> {
        let mut repairs: Vec<Repair> = Vec::new();
        for list in lists {
            let Some((tag, id)) = list.owner.tag() else {
                repairs.push(Update::merge_repair(keys, list));
                continue;
            };
            let group = repairs.iter_mut().find_map(|r| match r {
                Repair::InvalidateMany {
                    tag: t, name, ids, ..
                } if t == tag && name == list.name => Some(ids),
                _ => None,
            });
            match group {
                Some(ids) => ids.push(id),
                None => repairs.push(Repair::InvalidateMany {
                    prefix: keys.prefix().to_owned(),
                    tag: tag.to_owned(),
                    name: list.name.to_owned(),
                    ids: vec![id],
                }),
            }
        }
        repairs
    }

    /// How many Redis commands [`Repair::pipe`] adds.
    pub fn commands(&self) -> usize {
        match self {
            Repair::InvalidateMany { ids, .. } => ids.len(),
            _ => 1,
        }
    }

    /// Adds this repair's commands to a pipeline. `late`: applied by the relay, not right after
    /// the commit (see [`Repair::SetIfNewer`]).
    pub fn pipe(&self, pipe: &mut redis::Pipeline, ttl: u64, late: bool) {
        let invalidate = |pipe: &mut redis::Pipeline, key: &str| {
            pipe.invoke_script(scripts::INVALIDATE.key(key).key(Keys::gen_of(key)).arg(ttl))
                .ignore();
        };
        match self {
            Repair::Invalidate { key } => invalidate(pipe, key),
            Repair::InvalidateMany {
                prefix,
                tag,
                name,
                ids,
            } => {
                for id in ids {
                    invalidate(pipe, &Keys::tagged_key(prefix, tag, *id, name));
                }
            }
            Repair::Tombstone { key } => {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(TOMBSTONE)
                    .arg("EX")
                    .arg(ttl)
                    .ignore();
            }
            Repair::SetIfNewer {
                key,
                version,
                value,
            } => {
                let floor = format!("{version}|");
                pipe.invoke_script(
                    scripts::SET_IF_NEWER
                        .key(key)
                        .arg(*version)
                        .arg(if late { &floor } else { value })
                        .arg(ttl),
                )
                .ignore();
            }
            Repair::Delete { key } => {
                pipe.cmd("DEL").arg(key).ignore();
            }
        }
    }
}

impl Cache {
    /// The Redis commands of `updates` in one pipeline, and their repairs (`None` when off).
    fn plan(&self, updates: &[Update]) -> Option<(redis::Pipeline, Vec<Repair>)> {
        let (keys, ttl) = (self.keys()?, self.ttl()?);
        let mut pipe = redis::pipe();
        let mut repairs = Vec::new();
        for update in updates {
            repairs.extend(update.plan(keys, ttl, self.list_limit(), &mut pipe));
        }
        Some((pipe, repairs))
    }

    /// Plans `updates` and records their repairs in `cache_outbox` inside the write's
    /// transaction `tx`. With the cache off, or no updates, records nothing.
    ///
    /// # Errors
    /// The outbox insert failed (the transaction should be rolled back).
    pub async fn stage(
        &self,
        tx: &mut PgConnection,
        updates: &[Update],
    ) -> Result<Staged, sqlx::Error> {
        if updates.is_empty() {
            return Ok(Staged::none());
        }
        let Some((pipe, repairs)) = self.plan(updates) else {
            return Ok(Staged::none());
        };
        Ok(Staged {
            outbox_id: Some(record(tx, &repairs).await?),
            evict: evictions_of(updates, &repairs),
            revoked: revocations(&repairs),
            pipe,
            commands: updates.len(),
            deferred: Vec::new(),
        })
    }

    /// [`Cache::stage`] for a fan-out batch, whose merges go to many followers' lists of which
    /// most are not cached: the repairs are recorded in the transaction as usual, but the merges
    /// are planned after the commit, and only for the lists that exist then ([`Cache::finish`]
    /// asks with `EXISTS`, a fraction of a `MERGE` call's cost inside Redis). Skipping the others
    /// changes nothing: a merge into a list with neither its entries nor its generation hash
    /// does nothing, and a load that begins later (creating the hash with `BEGIN_LOAD` before
    /// its snapshot) reads the committed rows.
    ///
    /// # Errors
    /// The outbox insert failed (the transaction should be rolled back).
    pub async fn stage_merges(
        &self,
        tx: &mut PgConnection,
        updates: Vec<Update>,
    ) -> Result<Staged, sqlx::Error> {
        let (Some(keys), Some(ttl)) = (self.keys(), self.ttl()) else {
            return Ok(Staged::none());
        };
        if updates.is_empty() {
            return Ok(Staged::none());
        }
        let (mut pipe, mut repairs, mut deferred) = (redis::pipe(), Vec::new(), Vec::new());
        let mut commands = 0;
        for update in updates {
            match &update {
                Update::Merge { .. } => deferred.push(update),
                _ => {
                    repairs.extend(update.plan(keys, ttl, self.list_limit(), &mut pipe));
                    commands += 1;
                }
            }
        }
        repairs.extend(Repair::invalidate_lists(
            keys,
            deferred.iter().filter_map(|u| match u {
                Update::Merge { list, .. } => Some(*list),
                _ => None,
            }),
        ));
        Ok(Staged {
            outbox_id: Some(record(tx, &repairs).await?),
            evict: near_evictions(&repairs),
            revoked: revocations(&repairs),
            pipe,
            commands,
            deferred,
        })
    }

    /// Which of the lists of `merges` exist (their entries or their generation hash), in
    /// order: one `EXISTS list gen` per list (both keys in the list's slot) in one pipeline.
    async fn lists_exist(&self, merges: &[Update]) -> Result<Vec<bool>, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        for update in merges {
            if let Update::Merge { list, .. } = update {
                let key = keys.list(*list);
                pipe.cmd("EXISTS").arg(Keys::gen_of(&key)).arg(key);
            }
        }
        let counts: Vec<i64> = self.run_bulk(&pipe, merges.len()).await?;
        Ok(counts.into_iter().map(|n| n > 0).collect())
    }

    /// Applies staged updates after their transaction committed. On success the outbox row is
    /// deleted; otherwise it stays for the relay. Never fails: a cache problem must not fail a
    /// committed write. Callers run where nothing cancels them halfway (HTTP handlers run to
    /// completion in their own task, see `http::run_to_completion`; jobs are never dropped), and
    /// if a process dies here anyway, the row is relayed.
    pub async fn finish(&self, db: &PgPool, staged: Staged) {
        let Some(id) = staged.outbox_id else { return };
        match self.after_commit() {
            AfterCommit::Apply => {}
            AfterCommit::Crash => return,
            AfterCommit::Gate(gate) => drop(gate.lock().await),
        }
        let (mut pipe, mut commands) = (staged.pipe, staged.commands);
        if !staged.deferred.is_empty() {
            let (Ok(exist), Some(keys), Some(ttl)) = (
                self.lists_exist(&staged.deferred).await,
                self.keys(),
                self.ttl(),
            ) else {
                self.repair_now(db, id).await;
                return;
            };
            for (update, _) in staged.deferred.iter().zip(exist).filter(|(_, e)| *e) {
                update.plan(keys, ttl, self.list_limit(), &mut pipe);
                commands += 1;
            }
        }
        if commands > 0 {
            // Where the write stands on a master alone, that master's replicas leave the
            // epoch's record before the row goes (see `super::conn`).
            let stood = match self.run_durable::<()>(&pipe, commands).await {
                Ok(((), short)) => super::epoch::distrust_replicas(self, db, &short)
                    .await
                    .map_err(|e| tracing::warn!(error = %e, "could not take replicas out of the epoch's record"))
                    .is_ok(),
                Err(CacheUnavailable) => false,
            };
            if !stood {
                self.repair_now(db, id).await;
                return;
            }
        }
        // Redis holds the new state: now no process may answer from its old memory.
        if !self.evict_everywhere(&staged.evict, &staged.revoked).await {
            self.hand_off(db, id).await;
            return;
        }
        self.forget_applied(db, id);
    }

    /// Evicts what a write changed from every process's near caches (objects, then tokens),
    /// each waiting for the acknowledgements or the leases ([`super::near`]); false if an
    /// eviction could not be published.
    async fn evict_everywhere(&self, evict: &[NearId], revoked: &[String]) -> bool {
        if let Some(near) = self.near_objects()
            && near.evict_everywhere(self, evict).await.is_err()
        {
            return false;
        }
        for hex in revoked {
            if super::tokens::broadcast(self, hex).await.is_err() {
                return false;
            }
        }
        true
    }

    /// The cache step of a committed write failed or was not tried (Redis timed out, was
    /// marked down, or is being fenced after a flush): applies its outbox row now, as the relay
    /// would (an invalidation bumps the generation a concurrent load saw, so the load can not
    /// store what the write replaced; a flushed Redis is cleared by the fence anyway), and
    /// evicts the near caches. If Redis does not answer this process at all, hands the row to
    /// the others ([`Cache::hand_off`]).
    async fn repair_now(&self, db: &PgPool, id: i64) {
        if super::outbox::relay_one(self, db, id).await {
            return; // the relay's pass evicted the near caches too
        }
        self.hand_off(db, id).await;
    }

    /// A write whose repairs or evictions this process could not apply must not answer while
    /// another process could still answer from what it replaced (review of 2026-11-26,
    /// finding 2). It notifies every process through Postgres (`NOTIFY` on
    /// [`super::handoff::CHANNEL`]; each one's listener applies the row at once, as its relay
    /// would, evictions included) and waits until the row is gone, at most one lease bound
    /// after the notification committed: by then every process that still uses Redis or its
    /// memory holds its hand-off lease by an echo sent after the notification, so it has seen
    /// the row applied, or marked Redis down until its recovery relays it (the proof is in
    /// [`super::handoff`]'s docs). The row stays for the relay otherwise, and this process
    /// stops using Redis until its recovery has applied every row (read-your-writes on the
    /// writer's process; found by the history checker, seed 8614345048595040233: a tweet
    /// missing from its author's tweets on the process that posted it, right after Redis
    /// restarted from an older snapshot).
    async fn hand_off(&self, db: &PgPool, id: i64) {
        for attempt in 1..=3 {
            let notified = sqlx::query("select pg_notify($1, $2)")
                .bind(super::handoff::CHANNEL)
                .bind(id.to_string())
                .execute(db)
                .await;
            match notified {
                Ok(_) => break,
                Err(e) if attempt == 3 => {
                    tracing::warn!(error = %e, outbox_id = id, "could not hand an outbox row off");
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
        let deadline = std::time::Instant::now() + self.lease_bound();
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let left: Result<bool, _> =
                sqlx::query_scalar("select exists (select 1 from cache_outbox where id = $1)")
                    .bind(id)
                    .fetch_one(db)
                    .await;
            if matches!(left, Ok(false)) {
                return;
            }
            if std::time::Instant::now() >= deadline {
                // Nobody could apply it: Redis may still hold what the write replaced, and a
                // load racing the write could even store it again. This process reads
                // Postgres from now until its monitor's recovery has applied every row
                // (`outbox::recover`), so its own client reads its write.
                self.mark_down(&"a committed write's cache repairs could not be applied");
                tracing::debug!(outbox_id = id, "cache update left to the outbox relay");
                return;
            }
        }
    }

    /// The longest a lease held anywhere can outlast a write that answers now: this process's
    /// lease length plus the margin (processes share the setting).
    fn lease_bound(&self) -> std::time::Duration {
        self.near_objects()
            .map_or(super::lease::DEFAULT_BOUND, |near| near.lease_bound())
    }

    /// Applies updates that need no durability (a reader removing entries of tweets it found
    /// deleted: the delete's own outbox row covers them, and its eviction the other processes'
    /// memory), then forgets what they change in this process's near cache (a held list's
    /// head that still named the deleted tweets), so the reader's retry reads the list again.
    /// Best effort.
    pub async fn apply_best_effort(&self, updates: &[Update]) {
        if let Some((pipe, repairs)) = self.plan(updates) {
            let _ = self.run::<()>(&pipe).await;
            if let Some(near) = self.near_objects() {
                near.forget_here(&near_evictions(&repairs));
            }
        }
    }
}

/// Inserts the outbox row of `repairs` in the write's transaction; returns its id.
async fn record(tx: &mut PgConnection, repairs: &[Repair]) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("insert into cache_outbox (repairs) values ($1) returning id")
        .bind(sqlx::types::Json(repairs))
        .fetch_one(tx)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Owner;

    #[test]
    fn a_batch_of_merges_is_repaired_by_one_compact_invalidation_per_kind_of_list() {
        let keys = Keys::new("p").unwrap();
        let lists = [
            ListKey::new(Owner::User(42), "home"),
            ListKey::new(Owner::List(7), "timeline"),
            ListKey::new(Owner::User(43), "home"),
            ListKey::new(Owner::CircleDay(3, 20261122), "rank"),
        ];
        let repairs = Repair::invalidate_lists(&keys, lists);
        assert_eq!(
            repairs,
            vec![
                Repair::InvalidateMany {
                    prefix: "p".into(),
                    tag: "u".into(),
                    name: "home".into(),
                    ids: vec![42, 43],
                },
                Repair::InvalidateMany {
                    prefix: "p".into(),
                    tag: "l".into(),
                    name: "timeline".into(),
                    ids: vec![7],
                },
                Repair::Invalidate {
                    key: "p:{c3d20261122}:rank".into(),
                },
            ]
        );
        assert_eq!(repairs.iter().map(Repair::commands).sum::<usize>(), 4);
        // The compact repair runs exactly the commands of one invalidation per list, grouped
        // by kind (their order does not matter: each stands alone).
        let (mut compact, mut each) = (redis::pipe(), redis::pipe());
        for r in &repairs {
            r.pipe(&mut compact, 60, true);
        }
        for list in [lists[0], lists[2], lists[1], lists[3]] {
            Update::merge_repair(&keys, list).pipe(&mut each, 60, true);
        }
        assert_eq!(compact.get_packed_pipeline(), each.get_packed_pipeline());
        let json = serde_json::to_string(&repairs[0]).unwrap();
        assert_eq!(
            json,
            r#"{"op":"invalidate_many","prefix":"p","tag":"u","name":"home","ids":[42,43]}"#
        );
        assert_eq!(serde_json::from_str::<Repair>(&json).unwrap(), repairs[0]);
    }
}
