//! The epoch fence: Redis that comes back with other data than chirp last wrote (restarted from
//! an RDB/AOF snapshot, failed over to a lagging replica, flushed) must not be trusted, or it
//! would resurrect deleted tweets and revoked tokens that no outbox row remembers.
//!
//! Postgres keeps, per key prefix, the epoch chirp last wrote to `{p}:epoch` and the `run_id`s of
//! the Redis servers that held it (`cache_epoch.redis_run_id`, comma-separated: the one
//! server's, or `{node id}={run_id}` for every cluster master and every replica whose link to
//! its master was up). Redis is trusted only while it holds the epoch and every master that
//! serves slots answers with a recorded `run_id`: a restart (empty, or from an old snapshot)
//! gives a server a new `run_id`, a flush or an eviction removes the epoch key. A replica
//! promoted by a cluster failover is trusted: it was recorded, and every cache write of a
//! committed change waited for it (`WAIT`, see [`super::conn`]); writes it did not acknowledge
//! kept their outbox rows, which the relay applies to it. A replica that does not answer is
//! not needed. The recorded set follows the topology: answering nodes update their entries,
//! nodes that left the cluster lose theirs, silent ones keep theirs. On a mismatch one
//! process at a time (a row lock on `cache_epoch`) clears every key under the prefix, writes a
//! new epoch to Redis and records it with the new servers; until then nobody uses Redis. Processes check at every recovery and every second while Redis is in use, so a
//! silent restart is noticed within about a second (and a restart that broke connections at
//! once).

use std::collections::HashSet;

use anyhow::Context;
use sqlx::PgPool;

use crate::cache::{Cache, CacheUnavailable};

/// What Redis says: the epoch it holds, the `run_id`s of the servers that serve data as
/// masters (each must answer), and what to record: `"{node id}={run_id}"` per answering master
/// and per replica whose replication link is up (a single server: its `run_id`).
struct Observed {
    redis_epoch: Option<i64>,
    masters: Vec<String>,
    record: Vec<String>,
    /// The cluster's node ids now (`None`: a single server).
    present: Option<HashSet<String>>,
}

async fn observe(cache: &Cache) -> anyhow::Result<Observed> {
    let keys = cache.keys().ok_or(CacheUnavailable)?;
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(keys.epoch());
    let (redis_epoch,): (Option<i64>,) = cache
        .run_unchecked(&pipe, 1)
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable"))?;
    let mut session = cache
        .session(false)
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable"))?;
    let mut info = redis::cmd("INFO");
    info.arg("server").arg("replication");
    let Some(nodes) = session.nodes().await.context("CLUSTER NODES")? else {
        let reply = session.on_node(None, &info).await.context("INFO")?;
        let id = Info::parse(reply)?.run_id;
        return Ok(Observed {
            redis_epoch,
            masters: vec![id.clone()],
            record: vec![id],
            present: None,
        });
    };
    let (mut masters, mut record) = (Vec::new(), Vec::new());
    let timeout = std::time::Duration::from_secs(1);
    for node in &nodes {
        let reply = tokio::time::timeout(timeout, session.on_node(Some(&node.addr), &info)).await;
        let info = match reply {
            Ok(Ok(reply)) => Info::parse(reply)?,
            // A master that serves data must answer; a replica that does not is left out.
            _ if node.serves => anyhow::bail!("the master at {:?} does not answer", node.addr),
            _ => continue,
        };
        if node.serves {
            masters.push(info.run_id.clone());
        }
        if node.master || info.link_up {
            record.push(format!("{}={}", node.id, info.run_id));
        }
    }
    Ok(Observed {
        redis_epoch,
        masters,
        record,
        present: Some(nodes.into_iter().map(|n| n.id).collect()),
    })
}

/// What `INFO server replication` says of one server.
struct Info {
    run_id: String,
    /// A replica whose link to its master is up (it holds the master's data).
    link_up: bool,
}

impl Info {
    fn parse(reply: redis::Value) -> anyhow::Result<Self> {
        let text: String = redis::FromRedisValue::from_redis_value(reply)?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|s| s.trim().to_owned())
        };
        Ok(Info {
            run_id: field("run_id:").context("INFO has no run_id")?,
            link_up: field("master_link_status:").as_deref() == Some("up"),
        })
    }
}

/// The run ids in a recorded set (`"{node}={run_id}"` or `"{run_id}"` entries).
fn run_ids_of(recorded: &str) -> HashSet<&str> {
    recorded
        .split(',')
        .map(|e| e.rsplit_once('=').map_or(e, |(_, id)| id))
        .filter(|id| !id.is_empty())
        .collect()
}

/// The set to record after a trusted check: what was recorded for nodes still in the cluster,
/// updated with what answered now (a single server: what answered).
fn next_record(seen: &Observed, recorded: &str) -> String {
    let mut entries: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    if let Some(present) = &seen.present {
        for e in recorded.split(',') {
            if let Some((node, id)) = e.split_once('=')
                && present.contains(node)
            {
                entries.insert(node, id);
            }
        }
    }
    for e in &seen.record {
        let (node, id) = e.split_once('=').unwrap_or(("", e.as_str()));
        entries.insert(node, id);
    }
    entries
        .into_iter()
        .map(|(node, id)| {
            if node.is_empty() {
                id.to_owned()
            } else {
                format!("{node}={id}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

async fn recorded(db: &PgPool, prefix: &str) -> sqlx::Result<Option<(i64, String)>> {
    sqlx::query_as("select epoch, redis_run_id from cache_epoch where prefix = $1")
        .bind(prefix)
        .fetch_optional(db)
        .await
}

fn matches(seen: &Observed, recorded: Option<&(i64, String)>) -> bool {
    recorded.is_some_and(|(epoch, run_ids)| {
        let known = run_ids_of(run_ids);
        seen.redis_epoch == Some(*epoch)
            && !seen.masters.is_empty()
            && seen.masters.iter().all(|m| known.contains(m.as_str()))
    })
}

/// Whether Redis holds the epoch Postgres recorded, on the same server.
///
/// # Errors
/// Redis or Postgres could not be asked.
pub async fn is_trusted(cache: &Cache, db: &PgPool) -> anyhow::Result<bool> {
    let keys = cache.keys().ok_or(CacheUnavailable)?;
    let seen = observe(cache).await?;
    let rec = recorded(db, keys.prefix()).await?;
    let trusted = matches(&seen, rec.as_ref());
    if let (true, Some(epoch), Some(stats)) = (trusted, seen.redis_epoch, cache.stats()) {
        let before = stats
            .epoch_seen
            .swap(epoch, std::sync::atomic::Ordering::AcqRel);
        if before != 0 && before != epoch {
            // Another process fenced since this one last looked: what this one's memory holds
            // may have been read from the Redis that was fenced.
            stats
                .epoch_changes
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
    let next = rec.as_ref().map(|(_, r)| next_record(&seen, r));
    if let (true, Some((epoch, run_ids)), Some(next)) = (trusted, &rec, &next)
        && run_ids != next
    {
        // The topology changed without losing data (a failover to a recorded replica, a
        // replica that joined): record the servers that hold the epoch now.
        sqlx::query("update cache_epoch set redis_run_id = $3 where prefix = $1 and epoch = $2")
            .bind(keys.prefix())
            .bind(epoch)
            .bind(next)
            .execute(db)
            .await?;
        tracing::info!(servers = %next, "redis topology changed; epoch kept");
    }
    Ok(trusted)
}

/// Makes Redis trustworthy: if its epoch or server differs from what Postgres recorded, clears
/// every key under the prefix and starts a new epoch. Returns whether it fenced.
///
/// # Errors
/// Redis or Postgres failed; Redis must not be used then.
pub async fn verify(cache: &Cache, db: &PgPool) -> anyhow::Result<bool> {
    if is_trusted(cache, db).await? {
        return Ok(false);
    }
    let keys = cache.keys().ok_or(CacheUnavailable)?;
    let prefix = keys.prefix().to_owned();
    let mut tx = db.begin().await.context("starting the epoch fence")?;
    sqlx::query(
        "insert into cache_epoch (prefix, epoch, redis_run_id) values ($1, 0, '')
         on conflict (prefix) do nothing",
    )
    .bind(&prefix)
    .execute(&mut *tx)
    .await?;
    let locked: (i64, String) =
        sqlx::query_as("select epoch, redis_run_id from cache_epoch where prefix = $1 for update")
            .bind(&prefix)
            .fetch_one(&mut *tx)
            .await?;
    // Another process may have fenced while we waited for the lock.
    let seen = observe(cache).await?;
    if matches(&seen, Some(&locked)) {
        return Ok(false);
    }
    let epoch = locked.0;
    let cleared = cache
        .clear()
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable while clearing"))?;
    let next = epoch + 1;
    let mut pipe = redis::pipe();
    // Not durable: an epoch lost in a failover only fences (clears) once more.
    pipe.cmd("SET").arg(keys.epoch()).arg(next).ignore();
    cache
        .run_unchecked::<()>(&pipe, 1)
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable while writing the epoch"))?;
    sqlx::query("update cache_epoch set epoch = $2, redis_run_id = $3 where prefix = $1")
        .bind(&prefix)
        .bind(next)
        .bind(seen.record.join(","))
        .execute(&mut *tx)
        .await?;
    tx.commit().await.context("recording the new epoch")?;
    if let Some(stats) = cache.stats() {
        stats
            .fences
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if locked.1.is_empty() {
        tracing::info!(
            epoch = next,
            cleared,
            "cache epoch started for this prefix (first use, or after writes around the cache)"
        );
    } else {
        tracing::warn!(
            epoch = next,
            cleared,
            servers = %seen.record.join(","),
            "redis did not hold the recorded epoch (restart, failover or flush): cleared the prefix"
        );
    }
    Ok(true)
}

/// Forgets the recorded epoch of `prefix`, so that the next process that uses Redis fences it
/// (clears the prefix) before trusting it. Called whenever chirp writes around the cache: a
/// process running with `CHIRP_CACHE=off`, and `chirp import`.
///
/// # Errors
/// Postgres failed.
pub async fn forget(db: &PgPool, prefix: &str) -> sqlx::Result<()> {
    sqlx::query("delete from cache_epoch where prefix = $1")
        .bind(prefix)
        .execute(db)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(masters: &[&str], record: &[&str], present: Option<&[&str]>) -> Observed {
        Observed {
            redis_epoch: Some(3),
            masters: masters.iter().map(|s| (*s).to_owned()).collect(),
            record: record.iter().map(|s| (*s).to_owned()).collect(),
            present: present.map(|p| p.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    #[test]
    fn a_promoted_replica_is_trusted_and_a_restarted_master_is_not() {
        let recorded = (3, "a=r1,b=r2,c=r3,d=r4".to_owned());
        // Master a died; its replica d (run r4) serves its slots now.
        let failover = seen(
            &["r4", "r2"],
            &["d=r4", "b=r2"],
            Some(&["a", "b", "c", "d"]),
        );
        assert!(matches(&failover, Some(&recorded)));
        // A master came back empty (a new run id).
        let restart = seen(
            &["r9", "r2"],
            &["a=r9", "b=r2"],
            Some(&["a", "b", "c", "d"]),
        );
        assert!(!matches(&restart, Some(&recorded)));
        // Another epoch, or none recorded.
        let mut other = failover;
        other.redis_epoch = Some(4);
        assert!(!matches(&other, Some(&recorded)));
        assert!(!matches(&other, None));
        // The older format: run ids only.
        assert!(matches(
            &seen(&["r1"], &["r1"], None),
            Some(&(3, "r1".to_owned()))
        ));
    }

    #[test]
    fn the_record_keeps_unanswering_nodes_and_drops_departed_ones() {
        // c (a replica) did not answer and keeps its entry; e left the cluster; d answered
        // with a new run id after a full resync.
        let now = seen(
            &["r1", "r2"],
            &["a=r1", "b=r2", "d=r7"],
            Some(&["a", "b", "c", "d"]),
        );
        assert_eq!(
            next_record(&now, "a=r1,b=r2,c=r3,d=r4,e=r5"),
            "a=r1,b=r2,c=r3,d=r7"
        );
        assert_eq!(next_record(&seen(&["r2"], &["r2"], None), "r1"), "r2");
    }
}
