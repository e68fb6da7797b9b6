//! One open stream ([`Session`]): what it sends next, from its hub's queue, its catch-ups
//! from Postgres and its heartbeats, and how it ends.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

use crate::http::serve::ConnectionHandle;
use crate::state::AppState;
use crate::streams::{self, Cursor, Ended, Event, Registration};

use super::{DELETES_KEPT, Format, Lease, load_pull_follows};

/// Where a tweet event of a `streaming/user` stream comes from ([`Session::tweet`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Pub/sub: skipped if delivered already.
    Live,
    /// A catch-up of the newsfeed after the cursor's base ([`Catch::Newsfeed`]).
    CatchUp,
    /// An earlier token's catch-up ([`Catch::Legacy`]).
    Legacy,
}

/// What a `streaming/user` stream reads from Postgres before its next live event.
pub(super) enum Catch {
    /// The newsfeed after the cursor's base, to its end: a resume, or a settle
    /// ([`crate::streams`] module docs).
    Newsfeed,
    /// What a token of the earlier version missed ([`streams::legacy_catch_up`]) up to the
    /// cursor's base (a settle follows for the rest), after `after` (`(arrived_at µs, id)` of
    /// the last row read).
    Legacy {
        base: i64,
        floor_us: i64,
        skip: Vec<i64>,
        after: Option<(i64, i64)>,
    },
}

/// One open stream: what it sends next.
pub(super) struct Session {
    pub(super) state: AppState,
    pub(super) user_id: i64,
    pub(super) registration: Registration,
    pub(super) rx: mpsc::Receiver<Event>,
    pub(super) format: Format,
    pub(super) heartbeat: tokio::time::Interval,
    /// The heartbeat period; a client that takes no chunk for two of them is cut off.
    pub(super) every: Duration,
    pub(super) stop: watch::Receiver<bool>,
    /// `streaming/user` only.
    pub(super) cursor: Option<Cursor>,
    pub(super) catch_up: Option<Catch>,
    pub(super) pending: VecDeque<Bytes>,
    /// The newest deleted tweet ids (at most [`DELETES_KEPT`]).
    pub(super) deleted: VecDeque<i64>,
    pub(super) lease: Lease,
    /// Closed a heartbeat period after the session ends ([`Session::drop`]).
    pub(super) connection: ConnectionHandle,
    pub(super) done: bool,
}

impl Session {
    /// Runs the stream: each chunk goes to the body queue `chunks`. When the client takes no
    /// chunk while the hub ends the stream, the server stops, or two heartbeat periods pass,
    /// the last word (warning or disconnect) goes to `trailer`, which the body sends after
    /// what is queued, and the session ends: its hub registration and lease go with it.
    pub(super) async fn pump(
        mut self,
        chunks: mpsc::Sender<Bytes>,
        trailer: oneshot::Sender<Bytes>,
    ) {
        loop {
            let next = tokio::select! {
                next = self.next() => next,
                // The client went away while nothing was to be sent.
                () = chunks.closed() => return,
            };
            let Some(chunk) = next else { return };
            let client = self.registration.client.clone();
            let stalled = tokio::time::sleep(self.every * 2);
            tokio::select! {
                biased;
                sent = chunks.send(chunk) => {
                    if sent.is_err() {
                        return; // the client went away
                    }
                    continue;
                }
                () = client.wake.notified() => {
                    let why = client.ended().unwrap_or(Ended::FallingBehind);
                    self.end(why);
                }
                _ = self.stop.changed() => self.disconnect(
                    "SHUTDOWN",
                    "The server is shutting down; reconnect shortly.",
                ),
                () = stalled => {
                    self.state.streams.stats.fell_behind.fetch_add(1, Ordering::Relaxed);
                    self.end(Ended::FallingBehind);
                }
            }
            // The client is not reading: only the last word is kept for it.
            if let Some(last) = self.pending.pop_back() {
                let _ = trailer.send(last);
            }
            return;
        }
    }

    /// The next chunk to write; `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some(chunk);
            }
            if self.done {
                return None;
            }
            if let Some(why) = self.registration.client.ended() {
                self.end(why);
                continue;
            }
            if *self.stop.borrow() {
                self.disconnect(
                    "SHUTDOWN",
                    "The server is shutting down; reconnect shortly.",
                );
                continue;
            }
            if self.cursor.as_ref().is_some_and(Cursor::full) {
                self.catch_up.get_or_insert(Catch::Newsfeed);
            }
            if self.catch_up.is_some() {
                self.catch_up_page().await;
                continue;
            }
            let client = self.registration.client.clone();
            tokio::select! {
                biased;
                _ = self.stop.changed() => {}
                () = client.wake.notified() => {}
                // Before the events: ready once a period, so it is never starved by them.
                _ = self.heartbeat.tick() => self.heartbeat().await,
                event = self.rx.recv() => match event {
                    Some(event) => self.event(event).await,
                    None => self.done = true,
                },
            }
        }
    }

    /// Reads and queues the next page of [`Session::catch_up`].
    async fn catch_up_page(&mut self) {
        let (Some(catch), Some(cursor)) = (&mut self.catch_up, &self.cursor) else {
            self.catch_up = None;
            return;
        };
        let (db, cache, user_id) = (&self.state.db, &self.state.cache, self.user_id);
        let read = match catch {
            Catch::Newsfeed => match self.state.pull_authors.current(db).await {
                Ok(authors) => {
                    let whose = (user_id, authors.as_slice());
                    streams::catch_up_page(db, cache, whose, cursor.base_at_us(), |id, at| {
                        cursor.seen(id, at)
                    })
                    .await
                    .map(|page| (page.tweets, page.last, page.more))
                }
                Err(e) => Err(e),
            },
            Catch::Legacy {
                base,
                floor_us,
                skip,
                after,
            } => {
                let page =
                    streams::legacy_catch_up(db, cache, user_id, (*base, *floor_us, skip), *after)
                        .await;
                page.map(|(tweets, next)| {
                    *after = next;
                    (tweets, None, next.is_some())
                })
            }
        };
        let (source, legacy) = match catch {
            Catch::Newsfeed => (Source::CatchUp, false),
            Catch::Legacy { .. } => (Source::Legacy, true),
        };
        match read {
            Ok((tweets, last, more)) => {
                let Some(hidden) = self.hidden().await else {
                    return;
                };
                for (tweet, id, at) in tweets {
                    let tweet_id = tweet.id;
                    let hides = hidden.hides(tweet.user.id)
                        || (tweet.retweeted_tweet.as_ref())
                            .is_some_and(|o| hidden.hides(o.user.id));
                    let Ok(json) = serde_json::to_string(&serde_json::json!({
                        "event": "tweet",
                        "tweet": tweet,
                    })) else {
                        continue;
                    };
                    self.tweet(tweet_id, &json, Some((id, at)), source, hides);
                }
                if let Some(cursor) = &mut self.cursor {
                    if let Some((id, at)) = last {
                        cursor.settle(id, at);
                    }
                    if !more && !legacy {
                        cursor.caught_up();
                    }
                }
                if !more {
                    // After an earlier token's rows, the rows after the base.
                    self.catch_up = legacy.then_some(Catch::Newsfeed);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "stream catch-up failed");
                self.disconnect(
                    "UNAVAILABLE",
                    "Reading the newsfeed failed; reconnect with Last-Event-ID.",
                );
            }
        }
    }

    /// Whom this stream's user must not see ([`crate::blocks`]: read for each event or page,
    /// from this process's memory when warm, so a mute holds from the moment it answers);
    /// `None` if that could not be read (the stream then ends: it can not tell).
    async fn hidden(&mut self) -> Option<std::sync::Arc<crate::blocks::Hidden>> {
        let (db, cache) = (&self.state.db, &self.state.cache);
        match crate::blocks::hidden(db, cache, Some(self.user_id)).await {
            Ok(hidden) => Some(hidden),
            Err(e) => {
                tracing::error!(error = %e, "reading a stream's hidden set failed");
                self.disconnect("UNAVAILABLE", "Reading your mutes failed; reconnect.");
                None
            }
        }
    }

    async fn event(&mut self, event: Event) {
        match event {
            Event::Tweet {
                tweet_id,
                author,
                retweeted_author,
                data,
                row,
            } => {
                if let Some(hidden) = self.hidden().await {
                    // A retweet of a hidden account's tweet too (API.md, "Blocks and mutes").
                    let hides =
                        hidden.hides(author) || retweeted_author.is_some_and(|a| hidden.hides(a));
                    self.tweet(tweet_id, &data, row, Source::Live, hides);
                }
            }
            Event::Delete {
                tweet_id,
                author,
                data,
            } => {
                if self.deleted.len() == DELETES_KEPT {
                    self.deleted.pop_front();
                }
                self.deleted.push_back(tweet_id);
                // A hidden account's delete names it: not sent either.
                if let Some(hidden) = self.hidden().await
                    && !hidden.hides(author)
                {
                    self.frame("delete", None, &data);
                }
            }
            // The edited tweet, in place of what was sent before: no cursor of its own (a
            // resumed stream reads the rows, which show the text as it is then).
            Event::Edit {
                tweet_id,
                author,
                data,
            } => {
                if !self.deleted.contains(&tweet_id)
                    && let Some(hidden) = self.hidden().await
                    && !hidden.hides(author)
                {
                    self.frame("edit", None, &data);
                }
            }
        }
    }

    /// A tweet event. On `streaming/user` it carries `row` = (newsfeed row id, entry time µs),
    /// is placed in the cursor as `source` says, and its `id:` is the resume token; elsewhere
    /// `id:` is the tweet id. A `hidden` one (its author is hidden from this user) moves the
    /// cursor as if sent but is not written.
    fn tweet(
        &mut self,
        tweet_id: i64,
        data: &str,
        row: Option<(i64, i64)>,
        source: Source,
        hidden: bool,
    ) {
        if self.deleted.contains(&tweet_id) {
            return; // its delete came first
        }
        let id = match (&mut self.cursor, row) {
            (Some(cursor), Some((id, at))) => match source {
                Source::Live if cursor.seen(id, at) => return,
                Source::Live => {
                    cursor.advance(id, at);
                    Some(cursor.token())
                }
                // Read in newsfeed order: every row before it was sent or seen, so the token
                // made here is exact, and the cursor does not grow.
                Source::CatchUp => {
                    cursor.settle(id, at);
                    Some(cursor.token())
                }
                // Committed before the stream opened: at or below the base. Without a token
                // of its own (a client keeps the one it resumed with until the catch-up is
                // over), so a reconnect in the middle loses none of the rest.
                Source::Legacy if at > cursor.base_at_us() => return,
                Source::Legacy => None,
            },
            _ => Some(tweet_id.to_string()),
        };
        if !hidden {
            self.frame("tweet", id.as_deref(), data);
        }
    }

    fn frame(&mut self, kind: &str, id: Option<&str>, data: &str) {
        let chunk = match self.format {
            // A user stream's NDJSON line carries its resume token as "id".
            Format::Ndjson => match (id, &self.cursor) {
                (Some(id), Some(_)) if data.ends_with('}') => {
                    format!("{},\"id\":\"{id}\"}}\n", &data[..data.len() - 1])
                }
                _ => format!("{data}\n"),
            },
            Format::Sse => match id {
                Some(id) => format!("event: {kind}\nid: {id}\ndata: {data}\n\n"),
                None => format!("event: {kind}\ndata: {data}\n\n"),
            },
        };
        self.pending.push_back(Bytes::from(chunk));
    }

    fn end(&mut self, why: Ended) {
        match why {
            Ended::FallingBehind => {
                let data = r#"{"event":"warning","code":"FALLING_BEHIND","message":"The stream's queue is full: this client reads too slowly. Disconnecting."}"#;
                self.frame("warning", None, data);
                self.done = true;
            }
            Ended::Unavailable => self.disconnect(
                "UNAVAILABLE",
                "Redis pub/sub went away; reconnect (with Last-Event-ID on streaming/user).",
            ),
        }
    }

    fn disconnect(&mut self, code: &str, message: &str) {
        let data = serde_json::json!({"event": "disconnect", "code": code, "message": message});
        self.frame("disconnect", None, &data.to_string());
        self.done = true;
    }

    /// A heartbeat renews the stream's lease, and settles a `streaming/user` cursor (see the
    /// [`crate::streams`] module docs): an idle stream's settle is one empty read of the primary
    /// key (and, while pull sources exist, of the reader's friendships with them and their
    /// pulled tweets' index). It also reads again which pull sources the user follows.
    async fn heartbeat(&mut self) {
        if self.cursor.is_some() {
            self.catch_up.get_or_insert(Catch::Newsfeed);
            // Follows and pull sources that changed since they were read last.
            match load_pull_follows(&self.state, self.user_id).await {
                Ok((_, follows)) => self.registration.client.set_pull_follows(follows),
                Err(e) => tracing::warn!(error = %e, "reading a stream's pull sources failed"),
            }
        }
        let renewed = self
            .state
            .cache
            .stream_lease(
                self.lease.user_id,
                &self.lease.id,
                usize::MAX,
                self.lease.duration,
                true,
            )
            .await;
        if renewed.is_err() {
            tracing::debug!("renewing a stream lease failed");
        }
        self.pending
            .push_back(Bytes::from_static(match self.format {
                Format::Sse => b":\n\n",
                Format::Ndjson => b"\n",
            }));
    }
}

impl Drop for Session {
    /// The response says `Connection: close`, so a client that reads to the end closes the
    /// connection; one that stopped reading has a heartbeat period to take the last word, then
    /// its connection is closed under it (else hyper would keep it open, trying to write).
    fn drop(&mut self) {
        self.connection.close_after(self.every);
        tracing::debug!(user_id = self.user_id, "stream closed");
    }
}
