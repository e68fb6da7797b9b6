//! One connection type for a single Redis server and for Redis Cluster, so the rest of the cache
//! layer builds plain `redis::Pipeline`s and never asks which one it talks to.
//!
//! On a cluster a pipeline may hold commands of many owners (a page's hydration, a fan-out
//! batch, the outbox relay): [`Session`] splits it per master, using the [`SlotMap`] it last
//! read from `CLUSTER NODES`, and sends each master its commands as one pipeline (all masters
//! at once, over redis-rs's multiplexed connections). A cross-slot `MGET` (hydration) becomes
//! one `GET` per key in those pipelines; other multi-key and keyless commands go on their own
//! (redis-rs routes and splits those: `UNLINK` per slot, `PING` to every master). The replies
//! are put back in the pipeline's order. Every key of one owner shares a hash tag (see
//! [`super::keys`]), so each Lua script stays in one slot.
//!
//! **Nothing is sent twice behind chirp's back** (review of 2026-11-26, finding 8). redis-rs
//! runs with `retries(0)`: its own retry re-sends a whole pipeline after a redirect or a
//! broken connection, running again the commands that had run. chirp decides instead, per
//! failed pipeline ([`retry::next_after`]): a single command that got a redirect, a pipeline
//! of one slot its master no longer serves (`MOVED`), or a node with no connection, ran none
//! of it, so it goes again; after any other failure whose outcome is unknown (a broken
//! connection, `ASK` or `TRYAGAIN` in a pipeline, `MOVED` in a pipeline of several slots), it
//! goes again only if every command in it is [`retry::resendable`] (reads, and writes whose
//! second run leaves what the first left), else the call fails and its caller's fallback runs
//! (a write's outbox row, a read from Postgres). A per-master pipeline goes again split per
//! slot and the map is read again; a per-slot pipeline goes again once: to the node a
//! redirect named, or, after an `ASK` (an `ASKING` serves one command), one command at a
//! time, or after [`retry::AGAIN_AFTER`]. An atomic read refused with a redirect goes to the
//! named node whole. No
//! timeout re-sends: each call's budget is chirp's own ([`super::Cache::new`]).
//!
//! A durable session (the post-commit step, the outbox relay) ends each master's pipeline with
//! `WAIT {replicas} {timeout}`: Redis replication is asynchronous, and a failover would
//! otherwise drop writes the old master acknowledged while their outbox rows are already gone.
//! A master whose replicas did not acknowledge in time is reported ([`Session::take_short`]):
//! the write stands on that master, and the caller takes the master's replicas out of the
//! epoch's record before it deletes the outbox row, so a promotion of one of them is fenced
//! ([`super::epoch::distrust_replicas`]; review of 2026-11-26, finding 3: failing the whole write
//! instead kept every row of a healthy shard too and re-applied them every second while one
//! replica was down). A shortfall that can not be put on a master (a pipeline split per slot,
//! after a topology change) fails the write as before: its row stays for the relay. On a
//! single server a shortfall is ignored: the epoch records no replica there, so a promoted one
//! is always fenced.
//!
//! A master whose replicas fell short is remembered for [`ShortMasters::HELD`]: meanwhile its
//! durable writes send no `WAIT` and are reported short at once, which is what a `WAIT` that
//! timed out would have led to (the caller takes the replicas out of the record again after
//! the write, so no epoch check that began before it can trust them). With a replica down, one
//! write per master and period waits out the `WAIT` timeout instead of every write (issue 35:
//! "`WAIT` failures are bounded"); the first `WAIT` answered in full forgets the master.

mod retry;
mod split;
mod topology;

use retry::{atomic, command};
use split::{Split, split, split_per_master};
pub use topology::{Master, Node, SlotMap, key_slot, parse_nodes};
use topology::{parse_all_nodes, placement};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// A connection to a single Redis server or to a Redis Cluster; cheap to clone.
#[derive(Clone)]
pub enum Conn {
    /// One server (reconnects by itself).
    Single(ConnectionManager),
    /// A cluster (follows the topology and reconnects by itself).
    Cluster(ClusterConnection),
}

/// How many replicas must acknowledge a durable write, within how many milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// Replicas (`WAIT`'s first argument); 0 turns waiting off.
    pub replicas: u32,
    /// Milliseconds `WAIT` may block.
    pub timeout_ms: u64,
}

/// Masters (`host`, `port`) whose replicas recently did not acknowledge a durable write in
/// time (see the module docs), shared by every session of a [`super::Cache`], and how many
/// `WAIT`s were skipped for them.
#[derive(Debug, Default)]
pub struct ShortMasters {
    since: std::sync::Mutex<std::collections::HashMap<(String, u16), std::time::Instant>>,
    skipped: std::sync::atomic::AtomicU64,
}

impl ShortMasters {
    /// How long a shortfall is remembered: about the epoch check's period, so a replica that
    /// is back is waited for again (and re-trusted) within about a second.
    pub const HELD: std::time::Duration = std::time::Duration::from_secs(1);

    /// Whether `master` fell short within [`ShortMasters::HELD`] (its next write skips `WAIT`).
    fn is_short(&self, master: &(String, u16)) -> bool {
        let since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        since
            .get(master)
            .is_some_and(|at| at.elapsed() < Self::HELD)
    }

    /// Notes `WAIT`'s outcome on `master`: remembered if short, forgotten if acknowledged.
    fn note(&self, master: &(String, u16), acknowledged: bool) {
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        if acknowledged {
            since.remove(master);
        } else {
            since.insert(master.clone(), std::time::Instant::now());
        }
    }

    /// Durable writes on a master that sent no `WAIT` because the master had just fallen
    /// short (`/healthz` `cache.waits_skipped`).
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

/// The error a durable write reports when too few replicas acknowledged it.
pub const NOT_REPLICATED: &str = "cache write not acknowledged by enough replicas (WAIT)";

/// Whether `e` is [`NOT_REPLICATED`].
pub fn is_not_replicated(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Client && e.to_string().contains(NOT_REPLICATED)
}

/// A [`Conn`] for one operation, optionally durable (see the module docs). Implements
/// `redis::aio::ConnectionLike`, so `pipe.query_async(&mut session)` works on both kinds.
pub struct Session {
    conn: Conn,
    wait: Option<Wait>,
    /// Which master serves which slot (a cluster); without one, pipelines are split per slot.
    slots: Option<Arc<SlotMap>>,
    /// Set when a reply showed the map out of date (`MOVED`, `ASK`, a master gone).
    stale: Option<Arc<AtomicBool>>,
    /// Masters (`host`, `port`) whose replicas did not acknowledge a durable write in time.
    short: Vec<(String, u16)>,
    /// Masters that fell short recently: their writes skip `WAIT` (see the module docs).
    short_masters: Option<Arc<ShortMasters>>,
}

impl Session {
    /// A session over `conn`; `wait`: end every write with `WAIT` (durable).
    pub fn new(conn: Conn, wait: Option<Wait>) -> Self {
        Session {
            conn,
            wait: wait.filter(|w| w.replicas > 0),
            slots: None,
            stale: None,
            short: Vec::new(),
            short_masters: None,
        }
    }

    /// The masters (`host`, `port`) on which this session's durable writes stand without the
    /// acknowledgement of their replicas (see the module docs); empties the list.
    pub fn take_short(&mut self) -> Vec<(String, u16)> {
        std::mem::take(&mut self.short)
    }

    /// Splits pipelines per master with `slots`, sets `stale` when it is out of date, and
    /// skips `WAIT` on the masters `short` holds (see the module docs).
    pub fn with_slots(
        mut self,
        slots: Option<Arc<SlotMap>>,
        stale: Arc<AtomicBool>,
        short: Arc<ShortMasters>,
    ) -> Self {
        self.slots = slots;
        self.stale = Some(stale);
        self.short_masters = Some(short);
        self
    }

    /// Sends `cmd` to every master of a cluster (or the one server) and returns each reply.
    ///
    /// # Errors
    /// Any node failed.
    pub async fn on_every_master(&mut self, cmd: &Cmd) -> RedisResult<Vec<Value>> {
        match &mut self.conn {
            Conn::Single(c) => Ok(vec![c.req_packed_command(cmd).await?]),
            Conn::Cluster(c) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let reply = c.route_command(cmd.clone(), routing).await?;
                Ok(match reply {
                    Value::Map(pairs) => pairs.into_iter().map(|(_, v)| v).collect(),
                    Value::Array(values) => values,
                    other => vec![other],
                })
            }
        }
    }

    /// Sends `cmd` to the master at `host:port` (a cluster node), or to the one server.
    ///
    /// # Errors
    /// The node failed.
    pub async fn on_node(&mut self, node: Option<&(String, u16)>, cmd: &Cmd) -> RedisResult<Value> {
        match (&mut self.conn, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                c.route_command(cmd.clone(), routing).await
            }
            (conn, _) => conn.req_packed_command(cmd).await,
        }
    }

    /// `CLUSTER {args}` on any master; `None` for a single server.
    async fn cluster<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> RedisResult<Option<T>> {
        let Conn::Cluster(c) = &mut self.conn else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg(args);
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
        let reply = c.route_command(cmd, routing).await?;
        Ok(Some(T::from_redis_value(reply)?))
    }

    /// The masters of a cluster with the slot ranges each serves (from `CLUSTER NODES`);
    /// `None` for a single server.
    ///
    /// # Errors
    /// The cluster could not be asked, or answered something unreadable.
    pub async fn masters(&mut self) -> RedisResult<Option<Vec<Master>>> {
        Ok(self
            .cluster::<String>(&["NODES"])
            .await?
            .map(|t| parse_nodes(&t)))
    }

    /// Every node of a cluster (`CLUSTER NODES`): id, address, whether it is a master;
    /// `None` for a single server.
    ///
    /// # Errors
    /// The cluster could not be asked.
    pub async fn nodes(&mut self) -> RedisResult<Option<Vec<Node>>> {
        Ok(self
            .cluster::<String>(&["NODES"])
            .await?
            .map(|t| parse_all_nodes(&t)))
    }

    /// [`Session::masters`] on an owned session (a future that borrows nothing).
    ///
    /// # Errors
    /// The cluster could not be asked.
    pub async fn masters_owned(mut self) -> RedisResult<Option<Vec<Master>>> {
        self.masters().await
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`); `None` for a single server.
    ///
    /// # Errors
    /// The cluster could not be asked.
    pub async fn slot_of(&mut self, key: &str) -> RedisResult<Option<u16>> {
        self.cluster::<u16>(&["KEYSLOT", key]).await
    }

    async fn pipeline(&mut self, pipeline: &Pipeline, count: usize) -> RedisResult<Vec<Value>> {
        match &mut self.conn {
            Conn::Single(c) => match self.wait {
                None => c.req_packed_commands(pipeline, 0, count).await,
                Some(wait) => {
                    let mut waited = pipeline.clone();
                    waited.cmd("WAIT").arg(wait.replicas).arg(wait.timeout_ms);
                    let mut values = c.req_packed_commands(&waited, 0, count + 1).await?;
                    // A shortfall is ignored on a single server (see the module docs).
                    let _ = acknowledged(values.pop(), wait);
                    Ok(values)
                }
            },
            Conn::Cluster(c) => {
                let Some(slots) = &self.slots else {
                    return split(c, pipeline, self.wait).await;
                };
                let short = self.short_masters.as_deref();
                let result = split_per_master(c, slots, pipeline, self.wait, short).await;
                // Any failure may come from a changed topology: read the map again.
                if !matches!(result, Ok(Split { stale: false, .. }))
                    && let Some(flag) = &self.stale
                {
                    flag.store(true, Ordering::Release);
                }
                result.map(|split| {
                    self.short.extend(split.short);
                    split.values
                })
            }
        }
    }
}

impl Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => Box::pin(command(c, cmd)),
        }
    }
}

impl ConnectionLike for Session {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            if offset != 0 {
                // An atomic pipeline (MULTI/EXEC, one owner's reads: one slot), unsplit.
                return match &mut self.conn {
                    Conn::Single(c) => c.req_packed_commands(pipeline, offset, count).await,
                    Conn::Cluster(c) => atomic(c, pipeline, offset, count).await,
                };
            }
            self.pipeline(pipeline, count).await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Whether `WAIT`'s reply counts enough replicas.
fn acknowledged(reply: Option<Value>, wait: Wait) -> bool {
    matches!(reply, Some(Value::Int(n)) if n >= i64::from(wait.replicas))
}

fn check_acks(reply: Option<Value>, wait: Wait) -> RedisResult<()> {
    if acknowledged(reply, wait) {
        Ok(())
    } else {
        Err(RedisError::from((ErrorKind::Client, NOT_REPLICATED)))
    }
}
