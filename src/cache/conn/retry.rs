//! What goes again after a failure on a cluster, and where: nothing that could run twice
//! (see the module docs of [`super`]).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

use super::placement;

/// Sends one command on a cluster; a failure goes again once where [`next_after`] allows.
pub(super) async fn command(conn: &ClusterConnection, cmd: &Cmd) -> RedisResult<Value> {
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
        Next::To { host, port, ask } if keyed => {
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
        Next::Later | Next::OneByOne | Next::To { .. } => {
            tokio::time::sleep(AGAIN_AFTER).await;
            c.req_packed_command(cmd).await
        }
    }
}

/// How long a send waits before it goes again routed by slot (`TRYAGAIN` during a slot's
/// migration, a connection redis-rs is re-establishing).
pub(super) const AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Sends an atomic pipeline (MULTI/EXEC, its keys in one slot) on a cluster. A transaction a
/// master refused with a redirect ran none of it (`EXECABORT`): it goes again once to the node
/// the redirect names, after `ASKING` for an `ASK` (which holds for a whole transaction).
pub(super) async fn atomic(
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
    // Every queued command refused alike: the same redirect to the same node.
    let target = e.clone().into_server_errors().and_then(|errors| {
        let mut each = errors.iter().map(|(_, s)| {
            let addr = s.details()?.split_ascii_whitespace().nth(1)?;
            Some((s.kind()?, parse_addr(addr)?))
        });
        let first = each.next()??;
        let redirect = matches!(first.0, ServerErrorKind::Moved | ServerErrorKind::Ask);
        (redirect && each.all(|other| other.as_ref() == Some(&first))).then_some(first)
    });
    let Some((kind, (host, port))) = target else {
        return Err(e);
    };
    let ask = kind == ServerErrorKind::Ask;
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
pub(super) enum Next {
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
pub(super) fn next_after(e: &RedisError, resendable: bool, one_slot: bool, single: bool) -> Next {
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
pub(super) fn redirect_of(e: &RedisError) -> Option<(String, u16)> {
    parse_addr(e.redirect_node()?.0)
}

/// `host:port` as a redirect names a node.
fn parse_addr(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// The hashes of [`crate::cache::scripts::once_only`].
static ONCE_ONLY: LazyLock<Vec<String>> = LazyLock::new(|| {
    crate::cache::scripts::once_only()
        .iter()
        .map(|s| s.get_hash().to_owned())
        .collect()
});

/// Whether `cmd` may be sent again when its first send's outcome is unknown: a read, or a
/// write whose second run leaves what the first left (`SET`, `DEL`, `EXPIRE`, a trim, and
/// every script but [`crate::cache::scripts::once_only`]). `PUBLISH` and anything unknown are not.
pub(super) fn resendable(cmd: &Cmd) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        gcra.arg(crate::cache::scripts::GCRA.get_hash())
            .arg(1)
            .arg("k");
        let mut fill = redis::cmd("EVALSHA");
        fill.arg(crate::cache::scripts::FILL.get_hash())
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
}
