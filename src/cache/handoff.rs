//! Hand-offs through Postgres, and the lease that proves this process hears them.
//!
//! A write whose own cache step failed (its process lost Redis) can not repair Redis or evict
//! the other processes' memory itself. It `NOTIFY`s [`CHANNEL`] with its outbox row's id and
//! waits until the row is gone or one lease bound has passed ([`super::Cache`]'s `hand_off`);
//! every `chirp serve` and `chirp worker` process listens ([`listen`]) and applies the row at
//! once ([`super::outbox::relay_one`]: repairs, then evictions everywhere).
//!
//! **Why the writer may answer after one lease bound even if nobody applied its row.** A
//! process that listens uses Redis and its memory only while it holds its *hand-off lease*
//! ([`HandOffs::hearing`]), a [`Lease`] like the one of [`super::lease`] whose heartbeats travel
//! the hand-off path: every [`Lease::period`] the process `NOTIFY`s an *echo* on a channel of
//! its own (`chirp_echo_{id}`), and its listener hears it on the connection that hears
//! hand-offs. Postgres delivers one listener's notifications in the order their transactions
//! committed, so hearing an echo sent at local time `t` proves that every hand-off committed
//! before `t` has been received. The echo renews the lease until `t + length` only once every
//! hand-off received before it is *settled*: applied, gone from the table, or given up on by
//! marking Redis down (the monitor's recovery then relays every row before Redis is used
//! again). A writer whose `NOTIFY` committed at `N` answers at `N + length + MARGIN` at the
//! latest; a process holding its lease then holds it by an echo sent after `N`, so it has
//! seen the row settled. (The argument of Gray & Cheriton's leases, SOSP 1989, with Postgres's
//! notification order in place of Redis's message order.)
//!
//! **What sqlx would hide.** `PgListener` reconnects by itself when its connection drops, and
//! what was sent meanwhile is lost. Here a lost connection, one on which none of this process's
//! echoes arrived for [`lease::SILENCE`] lengths (half-open), or one whose `LISTEN` was not
//! answered within them, is replaced: the lease
//! is dropped, the new connection listens, then Redis is marked down so that a recovery that
//! starts after the `LISTEN` relays what the missed notifications named.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::watch;

use super::Cache;
use super::lease::{self, Lease};

/// The Postgres `NOTIFY` channel on which a writer whose own cache step failed hands its outbox
/// row (payload: the row's id) to every process's listener, which applies it at once.
pub const CHANNEL: &str = "chirp_outbox";

/// Handed-off rows one process applies at once: each holds a Postgres connection while it
/// waits for Redis.
const AT_ONCE: usize = 2;

/// Hand-offs one process keeps waiting for [`AT_ONCE`]'s permits; one more marks Redis down
/// instead (its recovery relays them all).
const QUEUE: usize = 256;

/// Echoes remembered while hand-offs received before them are unsettled (the newest are kept:
/// they grant the most).
const DEFERRED: usize = 64;

/// How often a handed-off row that this process could not apply is looked for in the table
/// (another process may apply it).
const POLL: Duration = Duration::from_millis(10);

/// This process's side of hand-offs: its lease, and which received hand-offs are settled.
/// Lives in the [`Cache`].
#[derive(Debug)]
pub struct HandOffs {
    lease: Lease,
    /// Set once [`listen`] runs in this process: only then does the use of Redis and memory
    /// depend on the lease (a process that does not listen, a test's or `chirp import`'s,
    /// serves no other client).
    watched: AtomicBool,
    settlement: Mutex<Settlement>,
}

impl HandOffs {
    /// A lease of `length` (`CHIRP_NEAR_LEASE_MS`, as the memory's lease), held by nobody yet.
    pub fn new(length: Duration) -> Self {
        HandOffs {
            lease: Lease::new(length),
            watched: AtomicBool::new(false),
            settlement: Mutex::new(Settlement::default()),
        }
    }

    /// Whether this process may use Redis and its memory as far as hand-offs go: it does not
    /// listen, or it holds its hand-off lease (see the module docs).
    pub fn hearing(&self) -> bool {
        !self.watched.load(Ordering::Acquire) || self.lease.held()
    }

    /// Whether [`listen`] runs in this process.
    pub fn listening(&self) -> bool {
        self.watched.load(Ordering::Acquire)
    }

    /// The hand-off lease (for `/healthz`).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    fn settlement(&self) -> std::sync::MutexGuard<'_, Settlement> {
        self.settlement.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One of this process's echoes was heard: renews the lease now, or once the hand-offs
    /// received before it are settled.
    fn echo(&self, payload: String) {
        let grant = self.settlement().heard(payload);
        if let Some(payload) = grant {
            self.lease.heard(&payload);
        }
    }

    /// Ticket `ticket`'s hand-off is settled: grants the newest echo it held back.
    fn settle(&self, ticket: u64) {
        let grant = self.settlement().settle(ticket);
        if let Some(payload) = grant {
            self.lease.heard(&payload);
        }
    }
}

/// Which hand-offs received (numbered from 1 in the order the listener heard them) are
/// settled, and the echoes heard while some were not. An echo may renew the lease once every
/// hand-off received before it is settled.
#[derive(Debug, Default)]
struct Settlement {
    received: u64,
    /// Every ticket up to this one is settled.
    settled: u64,
    /// Tickets above `settled` settled out of order.
    done: BTreeSet<u64>,
    /// Echoes held back: (hand-offs received when heard, payload).
    deferred: VecDeque<(u64, String)>,
}

impl Settlement {
    /// A hand-off was received; returns its ticket.
    fn receive(&mut self) -> u64 {
        self.received += 1;
        self.received
    }

    /// An echo was heard; returns it if it may renew the lease now.
    fn heard(&mut self, payload: String) -> Option<String> {
        if self.settled == self.received {
            self.deferred.clear();
            return Some(payload);
        }
        self.deferred.push_back((self.received, payload));
        while self.deferred.len() > DEFERRED {
            self.deferred.pop_front();
        }
        None
    }

    /// `ticket` is settled; returns the newest held-back echo that may now renew the lease.
    fn settle(&mut self, ticket: u64) -> Option<String> {
        if ticket > self.settled {
            self.done.insert(ticket);
        }
        while self.done.remove(&(self.settled + 1)) {
            self.settled += 1;
        }
        let mut grant = None;
        while let Some((upto, _)) = self.deferred.front()
            && *upto <= self.settled
        {
            grant = self.deferred.pop_front().map(|(_, p)| p);
        }
        grant
    }

    fn waiting(&self) -> usize {
        usize::try_from(self.received - self.settled).unwrap_or(usize::MAX) - self.done.len()
    }
}

/// Listens for hand-offs until `shutdown` (in the monitor of every `chirp serve` and `chirp
/// worker`): applies each handed-off row, and keeps this process's hand-off lease (see the
/// module docs). From its start, this process uses Redis and memory only while the lease is
/// held.
pub async fn listen(cache: Cache, db: PgPool, mut shutdown: watch::Receiver<bool>) {
    let Some(hand_offs) = cache.hand_offs() else {
        return;
    };
    hand_offs.watched.store(true, Ordering::Release);
    let options = (*db.connect_options()).clone();
    tokio::spawn(send_echoes(
        hand_offs.clone(),
        options.clone(),
        shutdown.clone(),
    ));
    loop {
        tokio::select! {
            result = listen_once(&cache, &db, &hand_offs, &options) => {
                tracing::debug!(error = %result, "hand-off listener lost; listening again");
            }
            _ = shutdown.changed() => {
                hand_offs.lease.drop_lease();
                return;
            }
        }
        hand_offs.lease.drop_lease();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// One connection's worth of [`listen`]: returns why it ended.
async fn listen_once(
    cache: &Cache,
    db: &PgPool,
    hand_offs: &Arc<HandOffs>,
    options: &PgConnectOptions,
) -> anyhow::Error {
    // A connection of its own, not one of the pool's (a listener holds it for good), and no
    // silent reconnection (it would lose what was sent meanwhile).
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options.clone());
    let echoes = echo_channel(&hand_offs.lease);
    let silence = hand_offs.lease.length() * lease::SILENCE;
    // Bounded: a connection that goes half-open before its LISTEN is answered would hold this
    // task for good (the history checker's half-open listener found it).
    let started = tokio::time::timeout(silence, async {
        let mut listener = PgListener::connect_with(&own).await?;
        listener.eager_reconnect(false);
        listener.listen_all([CHANNEL, echoes.as_str()]).await?;
        Ok::<_, sqlx::Error>(listener)
    });
    let mut listener = match started.await {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return e.into(),
        Err(_) => return anyhow::anyhow!("no answer to LISTEN within {silence:?}"),
    };
    // Hand-offs sent before the LISTEN were not heard: Redis is used again only after a
    // recovery that starts now has relayed every row.
    cache.require_recovery("the hand-off listener (re)started");
    let permits = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    loop {
        // Dropping `try_recv` midway loses the connection's state: only done when it goes.
        let note = tokio::select! {
            note = listener.try_recv() => match note {
                Ok(Some(note)) => note,
                Ok(None) => return anyhow::anyhow!("connection lost"),
                Err(e) => return e.into(),
            },
            // No message at all, not even an echo (one every period): half-open.
            _ = tokio::time::sleep(silence) => {
                return anyhow::anyhow!("none of this process's echoes arrived within {silence:?}");
            }
        };
        if note.channel() == echoes {
            hand_offs.echo(note.payload().to_owned());
            continue;
        }
        let Ok(id) = note.payload().parse::<i64>() else {
            continue;
        };
        let ticket = hand_offs.settlement().receive();
        if !cache.marked_up() || hand_offs.settlement().waiting() > QUEUE {
            // Not applied here: a recovery that starts from now relays it (it is committed)
            // before Redis is used again, and one under way may not have seen it.
            cache.require_recovery("a hand-off was not taken");
            hand_offs.settle(ticket);
            continue;
        }
        tokio::spawn(take(
            cache.clone(),
            db.clone(),
            hand_offs.clone(),
            permits.clone(),
            id,
            ticket,
        ));
    }
}

/// Applies handed-off row `id` ([`super::outbox::relay_one`]), or waits for another process
/// to; if it is still there after one lease bound, marks Redis down (the recovery relays it
/// before Redis is used again). Then settles `ticket`.
async fn take(
    cache: Cache,
    db: PgPool,
    hand_offs: Arc<HandOffs>,
    permits: Arc<tokio::sync::Semaphore>,
    id: i64,
    ticket: u64,
) {
    let deadline = Instant::now() + hand_offs.lease.bound();
    let applied = match permits.acquire().await {
        Ok(_permit) => super::outbox::relay_one(&cache, &db, id).await,
        Err(_) => false, // never closed
    };
    let mut gone = applied;
    while !gone && Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        gone = matches!(
            sqlx::query_scalar::<_, bool>(
                "select not exists (select 1 from cache_outbox where id = $1)"
            )
            .bind(id)
            .fetch_one(&db)
            .await,
            Ok(true)
        );
    }
    if !gone {
        cache.require_recovery("a handed-off outbox row could not be applied");
    }
    hand_offs.settle(ticket);
}

fn echo_channel(lease: &Lease) -> String {
    format!("chirp_echo_{}", lease.id())
}

/// Sends this process's echo every [`Lease::period`] until `shutdown`, on a connection of its
/// own (a busy pool must not delay it) that does not wait for its commit to be flushed (an
/// echo needs no durability).
async fn send_echoes(
    hand_offs: Arc<HandOffs>,
    options: PgConnectOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    let channel = echo_channel(&hand_offs.lease);
    let period = hand_offs.lease.period();
    let mut conn: Option<PgConnection> = None;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if conn.is_none() {
            conn = connect_for_echoes(&options, period).await;
        }
        let Some(c) = conn.as_mut() else { continue };
        let payload = hand_offs.lease.sending();
        let sent = tokio::time::timeout(
            hand_offs.lease.length(),
            sqlx::query("select pg_notify($1, $2)")
                .bind(&channel)
                .bind(payload)
                .execute(&mut *c),
        )
        .await;
        if !matches!(sent, Ok(Ok(_))) {
            conn = None; // a new connection next time (a failed or half-open one)
        }
    }
}

async fn connect_for_echoes(options: &PgConnectOptions, timeout: Duration) -> Option<PgConnection> {
    let connect = async {
        let mut conn = PgConnection::connect_with(options).await.ok()?;
        sqlx::query("set synchronous_commit = off")
            .execute(&mut conn)
            .await
            .ok()?;
        Some(conn)
    };
    tokio::time::timeout(timeout * 3, connect)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::MarkUp;
    use crate::config::{CacheMode, Config};

    #[test]
    fn an_echo_renews_only_once_every_hand_off_received_before_it_is_settled() {
        let mut s = Settlement::default();
        assert_eq!(
            s.heard("e1".into()).as_deref(),
            Some("e1"),
            "nothing pending"
        );
        let (one, two) = (s.receive(), s.receive());
        assert_eq!(s.heard("e2".into()), None, "two hand-offs before it");
        let three = s.receive();
        assert_eq!(s.heard("e3".into()), None);
        assert_eq!(s.settle(two), None, "one is not settled");
        assert_eq!(s.waiting(), 2);
        assert_eq!(
            s.settle(one).as_deref(),
            Some("e2"),
            "the hand-offs before e2 are settled, not the one before e3"
        );
        assert_eq!(s.heard("e4".into()), None, "three is still waiting");
        assert_eq!(s.settle(three).as_deref(), Some("e4"), "the newest echo");
        assert_eq!(s.waiting(), 0);
        assert_eq!(s.heard("e5".into()).as_deref(), Some("e5"));
        // A ticket settled twice (given up, then applied) changes nothing.
        assert_eq!(s.settle(one), None);
        assert_eq!(s.waiting(), 0);
    }

    #[tokio::test]
    async fn a_recovery_does_not_mark_redis_up_once_it_was_marked_down_since_it_began() {
        let mut config = Config::defaults();
        config.cache = CacheMode::On;
        config.redis_cluster.clear();
        let cache = Cache::new(&config).expect("a lazy cache");
        assert!(!cache.marked_up(), "down until a first recovery");
        let began = cache.downs();
        assert_eq!(cache.mark_up(began), MarkUp::CameBack);
        assert_eq!(cache.mark_up(began), MarkUp::AlreadyUp);
        assert!(cache.available(), "no listener: no hand-off lease needed");
        // A recovery begins; a hand-off it may have missed arrives; it must not mark Redis up.
        let began = cache.downs();
        cache.require_recovery("a hand-off was not taken");
        assert!(!cache.available());
        assert_eq!(cache.mark_up(began), MarkUp::Stale);
        assert!(!cache.marked_up());
        assert_eq!(cache.mark_up(cache.downs()), MarkUp::CameBack);
        // A listening process also needs its hand-off lease, which nobody has granted yet.
        let hand_offs = cache.hand_offs().expect("cache on");
        hand_offs
            .watched
            .store(true, std::sync::atomic::Ordering::Release);
        assert!(cache.marked_up() && !cache.available());
    }
}
