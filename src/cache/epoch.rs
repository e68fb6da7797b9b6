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
//! committed change waited for it (`WAIT`, see [`super::conn`]); a write it did not acknowledge
//! stands on its master alone only after the master's replicas were taken out of the record
//! ([`distrust_replicas`]), so promoting one of them fences. A replica that does not answer is
//! not needed. The recorded set follows the topology: answering nodes update their entries,
//! nodes that left the cluster lose theirs, silent ones keep theirs. A replica taken out of the
//! record (`{node id}=!{n}`, a mark) comes back only once the check sees its replication offset
//! at or past the offset its master had when the check began (after reading the record), and
//! the record is rewritten only if nobody marked it meanwhile (compare-and-set): so every write
//! that stood on the master alone is on the replica before it is trusted again. On a mismatch one
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

/// `recorded`: the record read before asking Redis (its marks decide which replicas may come
/// back, see the module docs).
async fn observe(cache: &Cache, recorded: Option<&str>) -> anyhow::Result<Observed> {
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
    let marked = marks(recorded.unwrap_or(""));
    let mut offsets: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    let timeout = std::time::Duration::from_secs(1);
    // Masters first: a marked replica must have reached the offset its master has now.
    let (first, then): (Vec<_>, Vec<_>) = nodes.iter().partition(|n| n.master);
    for node in first.into_iter().chain(then) {
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
        if node.master {
            offsets.insert(&node.id, info.offset);
            record.push(format!("{}={}", node.id, info.run_id));
        } else if info.link_up {
            let caught_up = || {
                node.replica_of
                    .as_deref()
                    .and_then(|m| offsets.get(m))
                    .is_some_and(|&at| info.offset >= at)
            };
            if !marked.contains(node.id.as_str()) || caught_up() {
                record.push(format!("{}={}", node.id, info.run_id));
            }
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
    /// The replication offset: a master's (`master_repl_offset`), or how far a replica has
    /// processed its master's stream (`slave_repl_offset`); bytes.
    offset: i64,
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
            offset: field("slave_repl_offset:")
                .or_else(|| field("master_repl_offset:"))
                .and_then(|o| o.parse().ok())
                .unwrap_or(0),
        })
    }
}

/// The run ids in a recorded set (`"{node}={run_id}"` or `"{run_id}"` entries; marks,
/// `"{node}=!{n}"`, name none).
fn run_ids_of(recorded: &str) -> HashSet<&str> {
    recorded
        .split(',')
        .map(|e| e.rsplit_once('=').map_or(e, |(_, id)| id))
        .filter(|id| !id.is_empty() && !id.starts_with('!'))
        .collect()
}

/// The node ids a recorded set marks as out of the record (`"{node}=!{n}"`).
fn marks(recorded: &str) -> HashSet<&str> {
    recorded
        .split(',')
        .filter_map(|e| e.split_once('='))
        .filter(|(_, id)| id.starts_with('!'))
        .map(|(node, _)| node)
        .collect()
}

/// `recorded` with each of `replicas` marked out of it: `"{node}=!{n}"`, `n` one more than the
/// node's last mark, so that every marking changes the record (a check that read it before
/// then fails its compare-and-set).
fn mark(recorded: &str, replicas: &[String]) -> String {
    let mut entries: std::collections::BTreeMap<String, String> = entries_of(recorded)
        .map(|(node, id)| (node.to_owned(), id.to_owned()))
        .collect();
    for node in replicas {
        let n = entries
            .get(node)
            .and_then(|id| id.strip_prefix('!'))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        entries.insert(node.clone(), format!("!{}", n + 1));
    }
    join_record(
        entries
            .iter()
            .map(|(node, id)| (node.as_str(), id.as_str())),
    )
}

/// A recorded set's entries (`(node, id)`; node `""` for a bare run id, the older format).
fn entries_of(recorded: &str) -> impl Iterator<Item = (&str, &str)> {
    recorded
        .split(',')
        .filter(|e| !e.is_empty())
        .map(|e| e.split_once('=').unwrap_or(("", e)))
}

/// A recorded set from its entries (see [`entries_of`]), in their order.
fn join_record<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    entries
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

/// Takes the replicas of `masters` (`host`, `port`: cluster masters on which a durable write
/// stands without their replicas' acknowledgement, see [`super::conn`]) out of the recorded
/// set, so that a failover to one of them fences (clears) instead of trusting a copy that may
/// lack the write; the epoch check brings each back once it has caught up (see the module
/// docs). A master without replicas needs nothing; a single server neither (its record
/// names no replica).
///
/// # Errors
/// A node named is no longer a master (a failover may already have lost the write: the caller
/// keeps the outbox row for the relay), or Redis or Postgres could not be asked.
pub async fn distrust_replicas(
    cache: &Cache,
    db: &PgPool,
    masters: &[(String, u16)],
) -> anyhow::Result<()> {
    if masters.is_empty() {
        return Ok(());
    }
    let keys = cache.keys().ok_or(CacheUnavailable)?;
    let mut session = cache
        .session(false)
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable"))?;
    let Some(nodes) = session.nodes().await.context("CLUSTER NODES")? else {
        return Ok(());
    };
    let mut replicas = Vec::new();
    for addr in masters {
        let master = nodes
            .iter()
            .find(|n| n.addr == *addr && n.master)
            .with_context(|| format!("{addr:?} is no longer a master"))?;
        replicas.extend(
            nodes
                .iter()
                .filter(|n| n.replica_of.as_deref() == Some(master.id.as_str()))
                .map(|n| n.id.clone()),
        );
    }
    if replicas.is_empty() {
        return Ok(());
    }
    let mut tx = db.begin().await.context("marking replicas")?;
    let recorded: Option<String> =
        sqlx::query_scalar("select redis_run_id from cache_epoch where prefix = $1 for update")
            .bind(keys.prefix())
            .fetch_optional(&mut *tx)
            .await?;
    // No record: nothing is trusted, the next check fences.
    let Some(recorded) = recorded else {
        return Ok(());
    };
    let next = mark(&recorded, &replicas);
    sqlx::query("update cache_epoch set redis_run_id = $2 where prefix = $1")
        .bind(keys.prefix())
        .bind(&next)
        .execute(&mut *tx)
        .await?;
    tx.commit().await.context("marking replicas")?;
    if let Some(stats) = cache.stats() {
        stats
            .replicas_distrusted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    tracing::debug!(
        ?masters,
        ?replicas,
        "replicas out of the epoch's record until they catch up"
    );
    Ok(())
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
    join_record(entries.into_iter())
}

/// The set to record after a fence: what answered now, and the marks of replicas still in the
/// cluster that did not come back (the clear's deletions reach them as late as the writes they
/// lacked).
fn fenced_record(seen: &Observed, recorded: &str) -> String {
    let answered: HashSet<&str> = seen
        .record
        .iter()
        .filter_map(|e| e.split_once('=').map(|(node, _)| node))
        .collect();
    let kept = recorded
        .split(',')
        .filter(|e| {
            e.split_once('=').is_some_and(|(node, id)| {
                id.starts_with('!')
                    && !answered.contains(node)
                    && seen.present.as_ref().is_some_and(|p| p.contains(node))
            })
        })
        .map(str::to_owned);
    seen.record
        .iter()
        .cloned()
        .chain(kept)
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
    // The record first: its marks are judged by offsets read after it (see the module docs).
    let rec = recorded(db, keys.prefix()).await?;
    let seen = observe(cache, rec.as_ref().map(|(_, r)| r.as_str())).await?;
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
        // Only over the record read above: a replica marked since stays marked.
        let changed = sqlx::query(
            "update cache_epoch set redis_run_id = $3
             where prefix = $1 and epoch = $2 and redis_run_id = $4",
        )
        .bind(keys.prefix())
        .bind(epoch)
        .bind(next)
        .bind(run_ids)
        .execute(db)
        .await?
        .rows_affected();
        if changed > 0 {
            tracing::info!(servers = %next, "redis topology changed; epoch kept");
        }
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
    let seen = observe(cache, Some(&locked.1)).await?;
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
        .bind(fenced_record(&seen, &locked.1))
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
    fn a_marked_replica_names_no_run_id_until_it_is_recorded_again() {
        let recorded = "a=r1,d=r4";
        let once = mark(recorded, &["d".to_owned(), "e".to_owned()]);
        assert_eq!(once, "a=r1,d=!1,e=!1");
        assert_eq!(marks(&once), HashSet::from(["d", "e"]));
        // Every marking changes the record (a concurrent check's compare-and-set fails).
        assert_eq!(mark(&once, &["d".to_owned()]), "a=r1,d=!2,e=!1");
        // Master a died; its replica d, marked, serves its slots now: fenced.
        let failover = seen(&["r4"], &["d=r4"], Some(&["a", "d"]));
        assert!(!matches(&failover, Some(&(3, once.clone()))));
        assert!(matches(&failover, Some(&(3, recorded.to_owned()))));
        // A check that saw d catch up records it again; one that did not keeps the mark.
        let caught_up = seen(&["r1"], &["a=r1", "d=r4"], Some(&["a", "d"]));
        assert_eq!(next_record(&caught_up, &once), "a=r1,d=r4");
        let behind = seen(&["r1"], &["a=r1"], Some(&["a", "d"]));
        assert_eq!(next_record(&behind, &once), "a=r1,d=!1");
        // A fence keeps the marks of replicas that did not come back.
        assert_eq!(fenced_record(&behind, &once), "a=r1,d=!1");
        assert_eq!(fenced_record(&caught_up, &once), "a=r1,d=r4");
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
