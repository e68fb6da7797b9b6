//! How a pipeline reaches Redis: a session on the single server's or the cluster's connection
//! (the cluster's slot map read again when stale), the timeouts, the reload of scripts Redis
//! forgot, and a keyspace scan node by node. [`Cache`](super::Cache)'s `run_*` methods are
//! built on these.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{ErrorKind, FromRedisValue, Pipeline, ServerErrorKind};

use super::conn::{self, Conn, Session};
use super::{Backend, CacheUnavailable, Inner, scripts};

/// The keys under a pattern, node by node; see [`Cache::scan`](super::Cache::scan).
pub(crate) struct Scan {
    pub(super) session: Session,
    /// Nodes still to scan (the last first); `None` is the single server.
    pub(super) nodes: Vec<Option<(String, u16)>>,
    pub(super) cursor: u64,
    pub(super) pattern: String,
    pub(super) timeout: Duration,
}

impl Scan {
    /// The next non-empty batch of keys; `None` when every node was scanned.
    ///
    /// # Errors
    /// A node failed or timed out.
    pub(crate) async fn next(&mut self) -> Result<Option<Vec<String>>, CacheUnavailable> {
        loop {
            let Some(node) = self.nodes.last().cloned() else {
                return Ok(None);
            };
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(self.cursor)
                .arg("MATCH")
                .arg(&self.pattern)
                .arg("COUNT")
                .arg(1000);
            let reply =
                tokio::time::timeout(self.timeout, self.session.on_node(node.as_ref(), &cmd))
                    .await
                    .map_err(|_| CacheUnavailable)?
                    .map_err(|_| CacheUnavailable)?;
            let (next, keys): (u64, Vec<String>) =
                FromRedisValue::from_redis_value(reply).map_err(|_| CacheUnavailable)?;
            if next == 0 {
                self.nodes.pop();
            }
            self.cursor = next;
            if !keys.is_empty() {
                return Ok(Some(keys));
            }
        }
    }
}

/// How often a cluster's slot map is read again even if no reply showed it out of date.
pub(super) const SLOT_MAP_EVERY: Duration = Duration::from_secs(5);

/// The extra time a bulk pipeline gets: 50 µs per item.
pub(super) fn per_item(items: usize) -> Duration {
    Duration::from_micros(50).saturating_mul(u32::try_from(items).unwrap_or(u32::MAX))
}

/// A session on `inner`'s connection; a cluster is connected at first use, within `timeout`.
/// `Err(None)`: timed out.
pub(super) async fn session(
    inner: &Inner,
    durable: bool,
    timeout: Duration,
) -> Result<Session, Option<redis::RedisError>> {
    let wait = durable.then_some(inner.wait);
    // Durable writes that `WAIT` go on connections of their own.
    let own = wait.is_some_and(|w| w.replicas > 0);
    match &inner.backend {
        Backend::Single {
            conn, durable: d, ..
        } => {
            let c = if own { d } else { conn };
            Ok(Session::new(Conn::Single(c.clone()), wait))
        }
        Backend::Cluster {
            client,
            conn,
            durable: d,
            slots,
            stale,
            read_at,
        } => {
            let cell = if own { d } else { conn };
            let connect = cell.get_or_try_init(|| client.get_async_connection());
            let c = match tokio::time::timeout(timeout, connect).await {
                Ok(Ok(c)) => c.clone(),
                Ok(Err(e)) => return Err(Some(e)),
                Err(_) => return Err(None),
            };
            {
                // A topology change that no reply showed (a replica promoted, the old master
                // back as its replica) is picked up within this period.
                let mut at = read_at.lock().unwrap_or_else(|p| p.into_inner());
                if at.elapsed() >= SLOT_MAP_EVERY {
                    *at = std::time::Instant::now();
                    stale.store(true, Ordering::Release);
                }
            }
            if stale.swap(false, Ordering::AcqRel) {
                // One session reads the map again; the others use the old one meanwhile
                // (what it routes wrong is retried per slot).
                let read = Session::new(Conn::Cluster(c.clone()), None).masters_owned();
                match tokio::time::timeout(timeout, read).await {
                    Ok(Ok(Some(masters))) if !masters.is_empty() => {
                        *slots.write().unwrap_or_else(|p| p.into_inner()) =
                            Some(Arc::new(conn::SlotMap::new(&masters)));
                    }
                    _ => stale.store(true, Ordering::Release),
                }
            }
            let map = slots.read().unwrap_or_else(|p| p.into_inner()).clone();
            let short = inner.short_masters.clone();
            Ok(Session::new(Conn::Cluster(c), wait).with_slots(map, stale.clone(), short))
        }
    }
}

/// The client's response timeout, in base timeouts (`CHIRP_REDIS_TIMEOUT_MS`): above the
/// longest budget a call sets (five base timeouts plus per-item time and `WAIT`'s).
pub(super) const RESPONSE_TIMEOUTS: u32 = 20;

/// Runs a pipeline within `timeout`; a script missing from Redis's script cache (restart,
/// `SCRIPT FLUSH`, a new cluster node) is loaded (on every node of a cluster) and the pipeline
/// retried once. `Err(None)`: timed out.
pub(super) async fn query<T: FromRedisValue>(
    inner: &Inner,
    pipe: &Pipeline,
    timeout: Duration,
) -> Result<T, Option<redis::RedisError>> {
    query_noting_acks(inner, pipe, timeout, false)
        .await
        .map(|(v, _)| v)
}

/// [`query`], also returning the masters whose replicas did not acknowledge a durable write
/// (see [`conn`]).
pub(super) async fn query_noting_acks<T: FromRedisValue>(
    inner: &Inner,
    pipe: &Pipeline,
    timeout: Duration,
    durable: bool,
) -> Result<(T, Vec<(String, u16)>), Option<redis::RedisError>> {
    let mut conn = session(inner, durable, timeout).await?;
    let v = match query_once(&mut conn, pipe, timeout).await {
        Err(Some(e)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            for script in scripts::all() {
                script.load_async(&mut conn).await.map_err(Some)?;
            }
            query_once(&mut conn, pipe, timeout).await
        }
        other => other,
    }?;
    Ok((v, conn.take_short()))
}

async fn query_once<T: FromRedisValue>(
    conn: &mut Session,
    pipe: &Pipeline,
    timeout: Duration,
) -> Result<T, Option<redis::RedisError>> {
    match tokio::time::timeout(timeout, pipe.query_async::<T>(conn)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(None),
    }
}
