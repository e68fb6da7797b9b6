//! A pipeline of many owners on a cluster: one pipeline per master (or per slot), the replies
//! put back in order.

use std::collections::HashMap;

use futures_util::future::try_join_all;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Arg, Cmd, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

use super::retry::{AGAIN_AFTER, Next, command, next_after, redirect_of, resendable};
use super::topology::{SlotMap, placement, routing_key};
use super::{ShortMasters, Wait, acknowledged, check_acks};

pub(super) fn redirected(value: &Value) -> bool {
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
pub(super) struct Split {
    /// The replies, in the pipeline's order.
    pub(super) values: Vec<Value>,
    /// Whether the map proved out of date.
    pub(super) stale: bool,
    /// Masters whose replicas did not acknowledge in time.
    pub(super) short: Vec<(String, u16)>,
}

/// Runs `pipeline` on a cluster, one pipeline per master of `slots` (see the module docs); a
/// master that `short` holds gets no `WAIT` and is reported short at once.
pub(super) async fn split_per_master(
    conn: &ClusterConnection,
    slots: &SlotMap,
    pipeline: &Pipeline,
    wait: Option<Wait>,
    short: Option<&ShortMasters>,
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
            let master = slots.masters[m].clone();
            // Fell short a moment ago: the write stands on the master alone without waiting.
            let skip = wait.is_some() && short.is_some_and(|s| s.is_short(&master));
            let wait = wait.filter(|_| !skip);
            if let Some(w) = wait {
                sub.cmd("WAIT").arg(w.replicas).arg(w.timeout_ms);
            }
            let count = origins.len() + usize::from(wait.is_some());
            async move {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: master.0.clone(),
                    port: master.1,
                };
                match conn.route_pipeline(sub, 0, count, route).await {
                    Ok(mut values) => {
                        let fell_short = match wait {
                            Some(w) => {
                                let acked = acknowledged(values.pop(), w);
                                if let Some(s) = short {
                                    s.note(&master, acked);
                                }
                                !acked
                            }
                            None => skip,
                        };
                        if skip && let Some(s) = short {
                            s.skipped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        let short = fell_short.then_some(master);
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
pub(super) async fn split(
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
}
