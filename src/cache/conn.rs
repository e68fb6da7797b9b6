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
//! failed pipeline ([`next_after`]): a single command that got a redirect, a pipeline of one
//! slot its master no longer serves (`MOVED`), or a node with no connection, ran none of it, so
//! it goes again; after any other failure whose outcome is unknown (a broken connection,
//! `ASK` or `TRYAGAIN` in a pipeline, `MOVED` in a pipeline of several slots), it goes again
//! only if every command in it is [`resendable`] (reads, and writes whose second run leaves
//! what the first left), else the call fails and its caller's fallback runs (a write's outbox
//! row, a read from Postgres). A per-master pipeline goes again split per slot and the map is
//! read again; a per-slot pipeline goes again once: to the node a redirect named, or, after an
//! `ASK` (an `ASKING` serves one command), one command at a time, or after [`AGAIN_AFTER`]. An
//! atomic read refused with a redirect goes to the named node whole. No
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use futures_util::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{
    Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

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
        }
    }

    /// The masters (`host`, `port`) on which this session's durable writes stand without the
    /// acknowledgement of their replicas (see the module docs); empties the list.
    pub fn take_short(&mut self) -> Vec<(String, u16)> {
        std::mem::take(&mut self.short)
    }

    /// Splits pipelines per master with `slots`, and sets `stale` when it is out of date.
    pub fn with_slots(mut self, slots: Option<Arc<SlotMap>>, stale: Arc<AtomicBool>) -> Self {
        self.slots = slots;
        self.stale = Some(stale);
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
                let result = split_per_master(c, slots, pipeline, self.wait).await;
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

/// Sends one command on a cluster; a failure goes again once where [`next_after`] allows.
async fn command(conn: &ClusterConnection, cmd: &Cmd) -> RedisResult<Value> {
    let mut c = conn.clone();
    let e = match c.req_packed_command(cmd).await {
        Ok(value) => return Ok(value),
        Err(e) => e,
    };
    // A command of one slot is one request; one of several (a cross-slot `MGET`, `UNLINK`) is
    // split by redis-rs, and goes again whole, routed by slot.
    let keyed = placement(cmd).is_some();
    match next_after(&e, resendable(cmd), keyed, keyed) {
        Next::Fail => Err(e),
        Next::Route => c.req_packed_command(cmd).await,
        Next::Later | Next::OneByOne => {
            tokio::time::sleep(AGAIN_AFTER).await;
            c.req_packed_command(cmd).await
        }
        Next::To { .. } if !keyed => {
            tokio::time::sleep(AGAIN_AFTER).await;
            c.req_packed_command(cmd).await
        }
        Next::To { host, port, ask } => {
            let mut pipe = redis::pipe();
            if ask {
                pipe.cmd("ASKING");
            }
            pipe.add_command(cmd.clone());
            let count = usize::from(ask) + 1;
            let route = SingleNodeRoutingInfo::ByAddress { host, port };
            let mut values = c.route_pipeline(pipe, 0, count, route).await?;
            values.pop().ok_or_else(|| {
                RedisError::from((ErrorKind::Client, "a redirected command got no reply"))
            })
        }
    }
}

/// How long a send waits before it goes again routed by slot (`TRYAGAIN` during a slot's
/// migration, a connection redis-rs is re-establishing).
const AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Sends an atomic pipeline (MULTI/EXEC, its keys in one slot) on a cluster. A transaction a
/// master refused with a redirect ran none of it (`EXECABORT`): it goes again once to the node
/// the redirect names, after `ASKING` for an `ASK` (which holds for a whole transaction).
async fn atomic(
    conn: &ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let mut c = conn.clone();
    let e = match c.req_packed_commands(pipeline, offset, count).await {
        Ok(values) => return Ok(values),
        Err(e) => e,
    };
    let target = e.clone().into_server_errors().and_then(|errors| {
        let (_, first) = errors.first()?;
        let kind = first.kind()?;
        if !matches!(kind, ServerErrorKind::Moved | ServerErrorKind::Ask)
            || errors.iter().any(|(_, s)| s.kind() != Some(kind))
        {
            return None;
        }
        let mut detail = first.details()?.split_ascii_whitespace();
        let _slot = detail.next()?;
        let (host, port) = detail.next()?.rsplit_once(':')?;
        let to = (host.to_owned(), port.parse::<u16>().ok()?);
        errors
            .iter()
            .all(|(_, s)| {
                s.details()
                    .and_then(|d| d.split_ascii_whitespace().nth(1))
                    .is_some_and(|a| {
                        a.rsplit_once(':').map(|(h, p)| (h, p.parse().ok()))
                            == Some((to.0.as_str(), Some(to.1)))
                    })
            })
            .then_some((to, kind == ServerErrorKind::Ask))
    });
    let Some(((host, port), ask)) = target else {
        return Err(e);
    };
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    if !ask {
        return c
            .route_pipeline(pipeline.clone(), offset, count, route)
            .await;
    }
    // `ASKING`, then the transaction as plain commands: replies `OK`, `OK`, `QUEUED`…, then
    // EXEC's, which the caller's (`offset`, `count`) take one place further on.
    let mut asking = redis::pipe();
    asking.cmd("ASKING").cmd("MULTI");
    for cmd in pipeline.cmd_iter() {
        asking.add_command(cmd.clone());
    }
    asking.cmd("EXEC");
    let total = pipeline.cmd_iter().count() + 3;
    let mut values = c.route_pipeline(asking, 0, total, route).await?;
    values.drain(..(offset + 1).min(values.len()));
    values.truncate(count);
    Ok(values)
}

/// What a pipeline (or command) that failed on a cluster may do (see the module docs).
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Fail the call.
    Fail,
    /// Go again, routed by slot.
    Route,
    /// Go again after [`AGAIN_AFTER`], routed by slot.
    Later,
    /// Go again to the node a redirect named (after `ASKING` for an `ASK`).
    To { host: String, port: u16, ask: bool },
    /// Go again one command at a time: an `ASK` serves the one command after `ASKING`, and the
    /// old master still serves the keys it has.
    OneByOne,
}

/// What a send that failed with `e` may do next (see the module docs): `resendable` says
/// whether every command of it is [`resendable`], `one_slot` whether its keys are all in one
/// slot, `single` whether it was one command (a trailing `WAIT` aside).
fn next_after(e: &RedisError, resendable: bool, one_slot: bool, single: bool) -> Next {
    let kind = e.kind();
    let moved = kind == ErrorKind::Server(ServerErrorKind::Moved);
    let ask = kind == ErrorKind::Server(ServerErrorKind::Ask);
    // A node picks the redirect before it runs a command: a single command that got one did
    // not run, nor did a pipeline of one slot that its master no longer serves.
    let ran_none = (moved && one_slot)
        || ((moved || ask) && single)
        || kind == ErrorKind::ClusterConnectionNotFound;
    let unknown = e.is_io_error()
        || e.is_connection_dropped()
        || matches!(
            kind,
            ErrorKind::Server(
                ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
            )
        );
    if !(ran_none || (unknown && resendable)) {
        return Next::Fail;
    }
    if ask && !single {
        return Next::OneByOne;
    }
    match redirect_of(e) {
        Some((host, port)) => Next::To { host, port, ask },
        None if kind == ErrorKind::ClusterConnectionNotFound => Next::Route,
        None => Next::Later,
    }
}

/// The node a `MOVED` or `ASK` names.
fn redirect_of(e: &RedisError) -> Option<(String, u16)> {
    let (addr, _slot) = e.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// The hashes of [`super::scripts::once_only`].
static ONCE_ONLY: LazyLock<Vec<String>> = LazyLock::new(|| {
    super::scripts::once_only()
        .iter()
        .map(|s| s.get_hash().to_owned())
        .collect()
});

/// Whether `cmd` may be sent again when its first send's outcome is unknown: a read, or a
/// write whose second run leaves what the first left (`SET`, `DEL`, `EXPIRE`, a trim, and
/// every script but [`super::scripts::once_only`]). `PUBLISH` and anything unknown are not.
fn resendable(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().map(|a| match a {
        Arg::Simple(bytes) => bytes,
        _ => &[][..],
    });
    let Some(name) = args.next() else {
        return false;
    };
    match name.to_ascii_uppercase().as_slice() {
        b"EVALSHA" => args.next().is_some_and(|sha| {
            !ONCE_ONLY
                .iter()
                .any(|h| h.as_bytes().eq_ignore_ascii_case(sha))
        }),
        b"GET" | b"MGET" | b"EXISTS" | b"ZRANGE" | b"ZREVRANGE" | b"ZCARD" | b"ZSCORE"
        | b"SMEMBERS" | b"SMISMEMBER" | b"SISMEMBER" | b"SRANDMEMBER" | b"SCARD" | b"HGET"
        | b"HGETALL" | b"HMGET" | b"TTL" | b"PTTL" | b"TYPE" | b"SCAN" | b"INFO" | b"PING"
        | b"TIME" | b"CLUSTER" | b"SET" | b"DEL" | b"UNLINK" | b"EXPIRE" | b"PEXPIRE" | b"SADD"
        | b"SREM" | b"ZADD" | b"ZREM" | b"ZREMRANGEBYRANK" | b"HSET" | b"HDEL" | b"WAIT" => true,
        _ => false,
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

/// A cluster master: its address and the slot ranges (inclusive) it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// `(host, port)`.
    pub addr: (String, u16),
    /// Inclusive slot ranges.
    pub slots: Vec<(u16, u16)>,
}

impl Master {
    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// A cluster node, from `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The node id.
    pub id: String,
    /// `(host, port)`.
    pub addr: (String, u16),
    /// A master (else a replica).
    pub master: bool,
    /// A master that serves slots.
    pub serves: bool,
    /// A replica's master (its node id).
    pub replica_of: Option<String>,
}

/// Every node in `CLUSTER NODES` output (but those without an address).
fn parse_all_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if flags.split(',').any(|f| f == "noaddr" || f == "handshake") {
                return None;
            }
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let master = flags.split(',').any(|f| f == "master");
            Some(Node {
                id: (*fields.first()?).to_owned(),
                addr: (host.to_owned(), port.parse().ok()?),
                master,
                serves: master && fields.len() > 8,
                replica_of: fields
                    .get(3)
                    .filter(|m| !master && **m != "-")
                    .map(|m| (*m).to_owned()),
            })
        })
        .collect()
}

/// The masters in `CLUSTER NODES` output that serve slots, with their slots.
fn parse_nodes(text: &str) -> Vec<Master> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Every master that serves slots, also one flagged `fail?` or `fail` (a scan of
            // the prefix must not skip it: it then fails, and is tried again).
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") {
                return None;
            }
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let slots = fields
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect::<Vec<_>>();
            if slots.is_empty() {
                return None;
            }
            Some(Master {
                addr: (host.to_owned(), port.parse().ok()?),
                slots,
            })
        })
        .collect()
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

/// Where a pipeline command goes on a cluster: with the commands of its slot, or on its own.
fn placement(cmd: &Cmd) -> Option<Slot> {
    routing_key(cmd).map(Slot::for_key)
}

/// The key a pipeline command is routed by on a cluster; `None`: it goes on its own.
fn routing_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|a| match a {
        Arg::Simple(bytes) => bytes,
        _ => &[][..],
    });
    let name = args.next()?.to_ascii_uppercase();
    let key = match name.as_slice() {
        b"EVALSHA" | b"EVAL" => {
            let _script = args.next()?;
            let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
            if keys == 0 {
                return None;
            }
            args.next()?
        }
        // Multi-key commands: with their slot's commands when every key is in one slot (one
        // owner's keys: `EXISTS list gen`), else on their own (redis-rs splits them).
        b"MGET" | b"DEL" | b"UNLINK" | b"EXISTS" | b"TOUCH" => {
            let key = args.next()?;
            let slot = key_slot(key);
            if args.any(|k| key_slot(k) != slot) {
                return None;
            }
            key
        }
        // Keyless or multi-node commands: redis-rs routes them.
        b"PING" | b"INFO" | b"CONFIG" | b"SCAN" | b"WAIT" | b"SCRIPT" | b"CLUSTER" | b"PUBSUB"
        | b"KEYS" | b"FLUSHALL" | b"FLUSHDB" | b"DBSIZE" | b"MEMORY" | b"OBJECT" | b"CLIENT"
        | b"TIME" | b"ECHO" | b"MSET" => return None,
        // PUBLISH goes to the master of its channel's slot, where this process's subscribers
        // listen (see `super::pubsub`), so its receiver count is theirs.
        _ => args.next()?,
    };
    Some(key)
}

/// Which master serves each of the 16384 hash slots.
#[derive(Debug)]
pub struct SlotMap {
    masters: Vec<(String, u16)>,
    /// Per slot, an index into `masters` (`u16::MAX`: none).
    owner: Vec<u16>,
}

impl SlotMap {
    /// The map of `masters` (from [`Session::masters`]).
    pub fn new(masters: &[Master]) -> Self {
        let mut owner = vec![u16::MAX; 16384];
        for (i, m) in masters.iter().enumerate() {
            for &(a, b) in &m.slots {
                for slot in a..=b.min(16383) {
                    owner[usize::from(slot)] = u16::try_from(i).unwrap_or(u16::MAX);
                }
            }
        }
        SlotMap {
            masters: masters.iter().map(|m| m.addr.clone()).collect(),
            owner,
        }
    }

    fn master_of(&self, key: &[u8]) -> Option<usize> {
        let i = *self.owner.get(usize::from(key_slot(key)))?;
        (usize::from(i) < self.masters.len()).then_some(usize::from(i))
    }
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{` and
/// the next `}`, if not empty) or of the whole key, mod 16384 (the Redis Cluster spec).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

fn redirected(value: &Value) -> bool {
    matches!(value, Value::ServerError(e)
        if matches!(e.kind(), Some(ServerErrorKind::Moved | ServerErrorKind::Ask)))
}

/// Where one command sent to a master came from: a command of the pipeline, or one key of a
/// multi-key `MGET` of it (cross-slot `MGET`s are sent as one `GET` per key, in the masters'
/// pipelines, and put together again).
#[derive(Debug, Clone, Copy)]
enum Origin {
    Whole(usize),
    Part(usize, usize),
}

/// The keys of `cmd` if it is an `MGET` of more than one key.
fn mget_keys(cmd: &Cmd) -> Option<Vec<&[u8]>> {
    let mut args = cmd.args_iter().map(|a| match a {
        Arg::Simple(bytes) => bytes,
        _ => &[][..],
    });
    if !args.next()?.eq_ignore_ascii_case(b"MGET") {
        return None;
    }
    let keys: Vec<&[u8]> = args.collect();
    (keys.len() > 1).then_some(keys)
}

/// What [`split_per_master`] got back.
struct Split {
    /// The replies, in the pipeline's order.
    values: Vec<Value>,
    /// Whether the map proved out of date.
    stale: bool,
    /// Masters whose replicas did not acknowledge in time.
    short: Vec<(String, u16)>,
}

/// Runs `pipeline` on a cluster, one pipeline per master of `slots` (see the module docs).
async fn split_per_master(
    conn: &ClusterConnection,
    slots: &SlotMap,
    pipeline: &Pipeline,
    wait: Option<Wait>,
) -> RedisResult<Split> {
    let cmds: Vec<&Cmd> = pipeline.cmd_iter().collect();
    let mut groups: Vec<Vec<(Cmd, Origin)>> = vec![Vec::new(); slots.masters.len()];
    let mut alone = Vec::new();
    let mut parts: HashMap<usize, Vec<Option<Value>>> = HashMap::new();
    for (i, cmd) in cmds.iter().enumerate() {
        if let Some(keys) = mget_keys(cmd)
            && let Some(masters) = keys
                .iter()
                .map(|k| slots.master_of(k))
                .collect::<Option<Vec<usize>>>()
        {
            for (j, (key, m)) in keys.iter().zip(masters).enumerate() {
                let mut get = redis::cmd("GET");
                get.arg(*key);
                groups[m].push((get, Origin::Part(i, j)));
            }
            parts.insert(i, vec![None; keys.len()]);
            continue;
        }
        match routing_key(cmd).and_then(|k| slots.master_of(k)) {
            Some(m) => groups[m].push(((*cmd).clone(), Origin::Whole(i))),
            None => alone.push(i),
        }
    }
    let grouped = groups
        .into_iter()
        .enumerate()
        .filter(|(_, group)| !group.is_empty())
        .map(|(m, group)| {
            let mut conn = conn.clone();
            let mut sub = redis::pipe();
            let origins: Vec<Origin> = group.iter().map(|(_, o)| *o).collect();
            let again_ok = group.iter().all(|(c, _)| resendable(c));
            let single = group.len() == 1;
            let one_slot = group
                .iter()
                .map(|(c, _)| placement(c))
                .collect::<Option<std::collections::HashSet<Slot>>>()
                .is_some_and(|slots| slots.len() == 1);
            for (cmd, _) in group {
                sub.add_command(cmd);
            }
            if let Some(w) = wait {
                sub.cmd("WAIT").arg(w.replicas).arg(w.timeout_ms);
            }
            let count = origins.len() + usize::from(wait.is_some());
            let (host, port) = slots.masters[m].clone();
            async move {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                };
                match conn.route_pipeline(sub, 0, count, route).await {
                    Ok(mut values) => {
                        let short = match wait {
                            Some(w) if !acknowledged(values.pop(), w) => Some((host, port)),
                            _ => None,
                        };
                        let values = origins
                            .into_iter()
                            .zip(values.into_iter().map(Some))
                            .collect::<Vec<_>>();
                        Ok::<_, RedisError>((values, short))
                    }
                    // The topology changed, or the master is gone: these go again per slot
                    // when that runs nothing twice (see the module docs).
                    Err(e) if next_after(&e, again_ok, one_slot, single) != Next::Fail => {
                        Ok((origins.into_iter().map(|o| (o, None)).collect(), None))
                    }
                    Err(e) => Err(e),
                }
            }
        });
    let single = alone.iter().map(|&i| {
        let cmd = cmds[i];
        async move {
            let value = command(conn, cmd).await?;
            Ok::<_, RedisError>(vec![(Origin::Whole(i), Some(value))])
        }
    });
    let (grouped, single) =
        futures_util::future::try_join(try_join_all(grouped), try_join_all(single)).await?;
    let mut short = Vec::new();
    let grouped = grouped.into_iter().map(|(values, s)| {
        short.extend(s);
        values
    });
    let mut out: Vec<Option<Value>> = vec![None; cmds.len()];
    for (origin, v) in grouped.chain(single).flatten() {
        let v = v.filter(|v| !redirected(v));
        match origin {
            Origin::Whole(i) => out[i] = v,
            Origin::Part(i, j) => {
                if let Some(slot) = parts.get_mut(&i).and_then(|p| p.get_mut(j)) {
                    *slot = v;
                }
            }
        }
    }
    for (i, values) in parts {
        // An `MGET` with a part that must go again goes again whole (redis-rs splits it).
        out[i] = values
            .into_iter()
            .collect::<Option<Vec<Value>>>()
            .map(Value::Array);
    }
    let again: Vec<usize> = (0..cmds.len()).filter(|&i| out[i].is_none()).collect();
    if again.is_empty() {
        return Ok(Split {
            values: out.into_iter().map(|v| v.unwrap_or(Value::Nil)).collect(),
            stale: false,
            short,
        });
    }
    let mut retry = redis::pipe();
    for &i in &again {
        retry.add_command(cmds[i].clone());
    }
    let values = split(conn, &retry, wait).await?;
    for (i, v) in again.into_iter().zip(values) {
        out[i] = Some(v);
    }
    Ok(Split {
        values: out.into_iter().map(|v| v.unwrap_or(Value::Nil)).collect(),
        stale: true,
        short,
    })
}

/// Runs `pipeline` on a cluster, split per slot (see the module docs).
async fn split(
    conn: &ClusterConnection,
    pipeline: &Pipeline,
    wait: Option<Wait>,
) -> RedisResult<Vec<Value>> {
    let cmds: Vec<&Cmd> = pipeline.cmd_iter().collect();
    let mut groups: HashMap<Slot, Vec<usize>> = HashMap::new();
    let mut alone = Vec::new();
    for (i, cmd) in cmds.iter().enumerate() {
        match placement(cmd) {
            Some(slot) => groups.entry(slot).or_default().push(i),
            None => alone.push(i),
        }
    }
    let grouped = groups.into_iter().map(|(slot, indices)| {
        let mut conn = conn.clone();
        let mut sub = redis::pipe();
        for &i in &indices {
            sub.add_command(cmds[i].clone());
        }
        if let Some(w) = wait {
            sub.cmd("WAIT").arg(w.replicas).arg(w.timeout_ms);
        }
        let count = indices.len() + usize::from(wait.is_some());
        let again_ok = indices.iter().all(|&i| resendable(cmds[i]));
        let single = indices.len() == 1;
        let own: Vec<Cmd> = indices.iter().map(|&i| cmds[i].clone()).collect();
        async move {
            let route =
                SingleNodeRoutingInfo::SpecificNode(Route::with_slot(slot, SlotAddr::Master));
            let mut values = match conn
                .route_pipeline(sub.clone(), 0, count, route.clone())
                .await
            {
                Ok(values) => values,
                Err(e) => match next_after(&e, again_ok, true, single) {
                    Next::Fail => return Err(e),
                    Next::Route => conn.route_pipeline(sub, 0, count, route).await?,
                    Next::Later => {
                        tokio::time::sleep(AGAIN_AFTER).await;
                        conn.route_pipeline(sub, 0, count, route).await?
                    }
                    Next::OneByOne => {
                        let mut values = Vec::with_capacity(own.len() + 1);
                        for cmd in &own {
                            values.push(command(&conn, cmd).await?);
                        }
                        if let Some(w) = wait {
                            // They went to the slot's master or, after `ASKING`, to the node
                            // importing it: each waits for its own replicas.
                            let mut nodes = vec![route];
                            nodes.extend(redirect_of(&e).map(|(host, port)| {
                                SingleNodeRoutingInfo::ByAddress { host, port }
                            }));
                            for node in nodes {
                                let mut waited = redis::pipe();
                                waited.cmd("WAIT").arg(w.replicas).arg(w.timeout_ms);
                                let mut reply = conn.route_pipeline(waited, 0, 1, node).await?;
                                check_acks(reply.pop(), w)?;
                            }
                            values.push(Value::Int(i64::from(w.replicas)));
                        }
                        values
                    }
                    Next::To { host, port, ask } => {
                        let mut redirected = redis::pipe();
                        if ask {
                            redirected.cmd("ASKING");
                        }
                        for c in sub.cmd_iter() {
                            redirected.add_command(c.clone());
                        }
                        let to = SingleNodeRoutingInfo::ByAddress { host, port };
                        let extra = usize::from(ask);
                        let mut values = conn
                            .route_pipeline(redirected, 0, count + extra, to)
                            .await?;
                        values.drain(..extra);
                        values
                    }
                },
            };
            if let Some(w) = wait {
                check_acks(values.pop(), w)?;
            }
            Ok::<_, RedisError>(indices.into_iter().zip(values).collect::<Vec<_>>())
        }
    });
    let single = alone.iter().map(|&i| {
        let cmd = cmds[i];
        async move {
            let value = command(conn, cmd).await?;
            Ok::<_, RedisError>(vec![(i, value)])
        }
    });
    let (grouped, single) =
        futures_util::future::try_join(try_join_all(grouped), try_join_all(single)).await?;
    let mut out: Vec<Option<Value>> = vec![None; cmds.len()];
    for (i, v) in grouped.into_iter().chain(single).flatten() {
        if let Some(slot) = out.get_mut(i) {
            *slot = Some(v);
        }
    }
    Ok(out.into_iter().map(|v| v.unwrap_or(Value::Nil)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_placed_by_their_first_key_or_alone() {
        let slot = |c: &Cmd| placement(c);
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("abc")
            .arg(2)
            .arg("p:{u42}:home")
            .arg("p:{u42}:home:gen");
        assert_eq!(slot(&eval), Some(Slot::for_key("{u42}")));
        let mut get = redis::cmd("GET");
        get.arg("p:{t7}:tweet");
        assert_eq!(slot(&get), Some(Slot::for_key("t7")));
        let mut mget = redis::cmd("MGET");
        mget.arg("p:{t7}:tweet").arg("p:{t8}:tweet");
        assert_eq!(slot(&mget), None);
        let mut exists = redis::cmd("EXISTS");
        exists.arg("p:{u42}:home:gen").arg("p:{u42}:home");
        assert_eq!(
            slot(&exists),
            Some(Slot::for_key("u42")),
            "one owner's keys"
        );
        let mut del = redis::cmd("DEL");
        del.arg("p:{u42}:home").arg("p:{u43}:home");
        assert_eq!(slot(&del), None, "keys of two slots");
        let mut ping = redis::cmd("PING");
        ping.arg("x");
        assert_eq!(slot(&ping), None);
    }

    #[test]
    fn only_a_multi_key_mget_is_taken_apart() {
        let mut mget = redis::cmd("MGET");
        mget.arg("p:{t7}:tweet").arg("p:{t8}:tweet");
        assert_eq!(
            mget_keys(&mget),
            Some(vec![&b"p:{t7}:tweet"[..], b"p:{t8}:tweet"])
        );
        let mut one = redis::cmd("MGET");
        one.arg("p:{t7}:tweet");
        assert_eq!(mget_keys(&one), None);
        let mut get = redis::cmd("GET");
        get.arg("a").arg("b");
        assert_eq!(mget_keys(&get), None);
    }

    #[test]
    fn only_what_runs_nothing_twice_goes_again() {
        let redirect = |kind| {
            RedisError::from((
                ErrorKind::Server(kind),
                "redirect",
                "3999 127.0.0.1:7002".to_owned(),
            ))
        };
        let moved = redirect(ServerErrorKind::Moved);
        let to = |ask| Next::To {
            host: "127.0.0.1".into(),
            port: 7002,
            ask,
        };
        // (resendable, one slot, single command)
        assert_eq!(
            next_after(&moved, false, true, false),
            to(false),
            "one slot: none ran"
        );
        assert_eq!(
            next_after(&moved, false, false, false),
            Next::Fail,
            "several: some ran"
        );
        assert_eq!(next_after(&moved, true, false, false), to(false));
        let ask = redirect(ServerErrorKind::Ask);
        assert_eq!(
            next_after(&ask, false, true, true),
            to(true),
            "one command: it did not run"
        );
        assert_eq!(
            next_after(&ask, false, true, false),
            Next::Fail,
            "some may have run"
        );
        assert_eq!(
            next_after(&ask, true, true, false),
            Next::OneByOne,
            "ASKING serves one command"
        );
        let again = RedisError::from((ErrorKind::Server(ServerErrorKind::TryAgain), "try again"));
        assert_eq!(next_after(&again, true, true, false), Next::Later);
        assert_eq!(next_after(&again, false, true, false), Next::Fail);
        let broken = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(next_after(&broken, false, true, true), Next::Fail);
        assert_eq!(next_after(&broken, true, false, false), Next::Later);
        let script = RedisError::from((ErrorKind::Server(ServerErrorKind::NoScript), "noscript"));
        assert_eq!(next_after(&script, true, true, true), Next::Fail);

        let mut publish = redis::cmd("PUBLISH");
        publish.arg("c").arg("m");
        let mut gcra = redis::cmd("EVALSHA");
        gcra.arg(super::super::scripts::GCRA.get_hash())
            .arg(1)
            .arg("k");
        let mut fill = redis::cmd("EVALSHA");
        fill.arg(super::super::scripts::FILL.get_hash())
            .arg(1)
            .arg("k");
        let mut get = redis::cmd("GET");
        get.arg("k");
        assert!(!resendable(&publish) && !resendable(&gcra));
        assert!(resendable(&fill) && resendable(&get));
        assert!(
            !resendable(&redis::cmd("INCR")),
            "unknown to chirp: not resent"
        );
    }

    #[test]
    fn key_slots_follow_the_cluster_spec() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"p:{u42}:home"), key_slot(b"u42"));
        assert_eq!(key_slot(b"p:{}:x"), key_slot(b"p:{}:x"));
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        for key in [&b"p:{t17}:tweet"[..], b"a{b}c", b"{}x"] {
            assert_eq!(Slot::for_key(key), Slot::new(key_slot(key)).unwrap());
        }
    }

    #[test]
    fn cluster_nodes_output_gives_the_masters_and_their_slots() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922 [93-<-x]
c3 127.0.0.1:7002@17002 master,fail - 0 0 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 0 1 connected
";
        let masters = parse_nodes(text);
        assert_eq!(masters.len(), 3, "a failing master still serves its slots");
        assert_eq!(masters[0].addr, ("127.0.0.1".to_owned(), 7000));
        assert_eq!(masters[1].slots, vec![(5461, 10922)]);
        assert_eq!(masters[2].slots, vec![(10923, 16383)]);
        assert!(masters[0].serves(5460) && !masters[0].serves(5461));
        let nodes = parse_all_nodes(text);
        assert_eq!(nodes.len(), 4);
        assert!(nodes[0].serves && nodes[2].serves && !nodes[3].master && !nodes[3].serves);
        assert_eq!(nodes[3].replica_of.as_deref(), Some("a1"));
        assert_eq!(nodes[0].replica_of, None);
    }
}
