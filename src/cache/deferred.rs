//! Cache fills a request defers to its next round trip to Redis (issue 42, decision 0037).
//!
//! A returning user's first request reads its token and the user's hidden set from Postgres in
//! one statement (decision 0030) and caches both. Sent on its own, that fill is a round trip
//! before the handler's first read, and a round trip is most of what a first touch costs (two
//! processes woken on two cores: BENCHMARKS.md rounds 32 and 40). [`Cache::deferring`] runs
//! the rest of the request with the fill *pending*: the first pipeline the request sends
//! through [`Cache::run`] takes the fill's commands along after its own (their replies
//! ignored), and a fill that no read took is sent on its own once the handler is done, before
//! the answer. The read side's [`super::piggyback`] does the same for what a page reads.
//!
//! Only fills are deferred: best-effort writes of what Postgres said, each guarded as if sent
//! alone (`SET NX` of a token against its revocation's tombstone, versioned writes), whose loss
//! costs a later miss, never a wrong answer. A read that fails loses its fill with it, as the
//! fill's own round trip failing would; what a fill does once Redis holds it (hold the value
//! in this process's memory, which must never hold what Redis does not) runs only then.
//!
//! The pending fill lives in a task-local of the request's task: a task the request spawns
//! sends its own pipelines without it, and a pipeline that is a `MULTI` transaction never
//! carries it (on a cluster a transaction is one slot's; the fill's keys are others').

use std::cell::RefCell;
use std::future::Future;

use redis::Pipeline;

use super::Cache;

/// A cache fill waiting for the request's next round trip ([`Cache::deferring`]): its commands
/// (all replies ignored) and what to do once Redis holds them.
pub struct Deferred {
    pipe: Pipeline,
    then: Box<dyn FnOnce(&Cache) + Send>,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("commands", &self.pipe.len())
            .finish_non_exhaustive()
    }
}

tokio::task_local! {
    /// The request's pending fill ([`Cache::deferring`]).
    static PENDING: RefCell<Option<Deferred>>;
}

impl Deferred {
    /// A fill of `pipe`'s commands; `then` runs once Redis answered them.
    pub(super) fn new(pipe: Pipeline, then: impl FnOnce(&Cache) + Send + 'static) -> Self {
        Deferred {
            pipe,
            then: Box::new(then),
        }
    }

    /// The request's pending fill, taken, if it has one and `pipe` may carry it: not empty
    /// (an empty pipeline makes no round trip) and not a transaction.
    pub(super) fn take_for(pipe: &Pipeline) -> Option<Deferred> {
        if pipe.is_empty() || pipe.is_transaction() {
            return None;
        }
        PENDING
            .try_with(|pending| pending.borrow_mut().take())
            .ok()
            .flatten()
    }

    /// `pipe` with this fill's commands after its own, their replies ignored: the caller
    /// decodes exactly the replies it asked for.
    pub(super) fn appended_to(&self, pipe: &Pipeline) -> Pipeline {
        let mut with = pipe.clone();
        for cmd in self.pipe.cmd_iter() {
            with.add_command(cmd.clone()).ignore();
        }
        with
    }

    /// Redis answered the fill's commands: runs what follows them.
    pub(super) fn done(self, cache: &Cache) {
        (self.then)(cache);
    }

    /// Sends the fill in a round trip of its own, now (best effort: a failure loses it).
    pub async fn send(self, cache: &Cache) {
        if cache.run::<()>(&self.pipe).await.is_ok() {
            self.done(cache);
        }
    }
}

impl Cache {
    /// Drops the current request's pending fill unsent, if it has one: for a request whose
    /// own write makes the fill untrue, a logout of the token the fill would cache
    /// ([`crate::accounts::logout`]). Outside [`Cache::deferring`], does nothing.
    pub fn discard_deferred(&self) {
        let _ = PENDING.try_with(|pending| pending.borrow_mut().take());
    }

    /// Runs `request` with `fill` pending (see the module docs): its first pipeline through
    /// [`Cache::run`] carries the fill; if none did, the fill is sent when `request` is done,
    /// before its output is returned. With no fill, just runs `request`.
    pub async fn deferring<F: Future>(&self, fill: Option<Deferred>, request: F) -> F::Output {
        let Some(fill) = fill else {
            return request.await;
        };
        let (output, left) = PENDING
            .scope(RefCell::new(Some(fill)), async {
                let output = request.await;
                (output, PENDING.with(|pending| pending.borrow_mut().take()))
            })
            .await;
        if let Some(fill) = left {
            fill.send(self).await;
        }
        output
    }
}
