//! The lease on a process's memory (its near caches: tokens, objects, counters, liked sets,
//! timeline heads), after Gray & Cheriton's leases (SOSP 1989) and the invalidation discipline
//! of Facebook's memcache and TAO: a process answers from memory only while it holds a lease of
//! [`Lease::length`] (`CHIRP_NEAR_LEASE_MS`), and a writer answers only once every process that
//! may hold one has acknowledged its eviction or has provably lost its lease.
//!
//! **Heartbeats travel the path evictions travel.** Every [`Lease::period`] a process runs
//! [`super::scripts::HEARTBEAT`]: it registers itself in the registry of each topic it listens
//! on (`{p}:{bus}:live:{topic}`, a sorted set of process ids scored by the registration's expiry
//! in ms of Redis's clock, `length` + [`MARGIN`] ahead) and publishes `"{id} {seq}"` on
//! `{p}:{bus}:beat:{id}`, in one script. Redis delivers one connection's messages in the order their
//! `PUBLISH`es ran, so a process that hears its own heartbeat sent at local time `t` has heard
//! every eviction published before it ran: it holds the lease until `t + length`. A heartbeat
//! that is not heard (a stalled, half-open or broken subscription, a frozen process) renews
//! nothing, and the lease runs out by itself; a subscriber that hears none of its own for
//! [`SILENCE`] drops the connection and subscribes again.
//!
//! **A lapse forgets everything.** A lease granted again after it ran out (or after a new
//! subscription) starts a new *term*: the near caches forget what they held, and lookups that
//! began in an older term store nothing. So an eviction that a process could not hear while it
//! had no lease (published while Redis was unreachable for it, or while its subscription was
//! down) can not leave an old value in its memory once the lease is back.
//!
//! **The writer's side** ([`super::near`]): the script that publishes an eviction also reads,
//! at that instant, every registration that has not expired. The writer waits until each of
//! those processes has acknowledged, or its registration has expired (then its lease has too:
//! a lease is never longer than the registration made when its heartbeat was sent). A process
//! that registers after the eviction ran can only gain a lease by hearing a heartbeat published
//! after the eviction, so it heard the eviction first. The wait is bounded by
//! `length + MARGIN` whatever happens to the others: no "wait 500 ms, then answer anyway".
//!
//! Clocks: a lease is measured on the process's own monotonic clock from before its heartbeat
//! was sent, a registration on Redis's clock from when the script ran (later), and the writer
//! measures the registration's remaining time from when the publish's answer arrived (later
//! still). [`MARGIN`] covers clock-rate differences and, on a cluster failover, the offset
//! between the old and the new `{bus}` master's clocks (NTP keeps them within milliseconds).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How much longer a registration lasts than the lease it backs (see the module docs).
pub const MARGIN: Duration = Duration::from_millis(50);

/// The default lease length, in ms (`CHIRP_NEAR_LEASE_MS`).
pub const DEFAULT_LENGTH_MS: u64 = 300;

/// The longest a writer waits for a process that neither acknowledges nor lets its lease run
/// out when it knows no lease length of its own: the default length and the margin.
pub const DEFAULT_BOUND: Duration =
    Duration::from_millis(DEFAULT_LENGTH_MS + MARGIN.as_millis() as u64);

/// A subscriber that has heard none of its own heartbeats for this many lease lengths drops
/// its connection and subscribes again (a half-open connection is never noticed otherwise: a
/// subscriber only reads).
pub const SILENCE: u32 = 4;

/// Heartbeats in flight, at most (older ones are forgotten: they would grant nothing newer).
const IN_FLIGHT: usize = 64;

/// One process's lease; see the module docs. Shared by every near cache of the process (it
/// lives in its [`super::pubsub::Subscriber`]).
#[derive(Debug)]
pub struct Lease {
    /// This process's id in the registries and acknowledgement sets (random).
    id: u64,
    length: Duration,
    /// The origin of the `AtomicU64` instants below (ns since it).
    base: Instant,
    /// Until when memory may answer (ns since `base`; 0: no lease).
    until: AtomicU64,
    /// Bumped each time a lease is granted with none held before (after a lapse or a new
    /// subscription): the near caches forget what they held.
    term: AtomicU64,
    /// When this process last heard one of its own heartbeats (ns since `base`).
    heard_at: AtomicU64,
    /// The next heartbeat's sequence number.
    next: AtomicU64,
    /// Heartbeats sent and not yet heard: (sequence number, local send time).
    sent: Mutex<VecDeque<(u64, Instant)>>,
}

impl Lease {
    /// A lease of `length` for a process with a random id; held by nobody until a heartbeat is
    /// heard.
    pub fn new(length: Duration) -> Self {
        Lease {
            id: rand::random::<u64>() >> 1,
            length: length.max(Duration::from_millis(30)),
            base: Instant::now(),
            until: AtomicU64::new(0),
            term: AtomicU64::new(0),
            heard_at: AtomicU64::new(0),
            next: AtomicU64::new(1),
            sent: Mutex::new(VecDeque::new()),
        }
    }

    /// This process's id (registries, acknowledgement sets).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How long a heard heartbeat lets memory answer.
    pub fn length(&self) -> Duration {
        self.length
    }

    /// How often heartbeats are sent: a third of the length, so two may be lost or late before
    /// the lease runs out.
    pub fn period(&self) -> Duration {
        self.length / 3
    }

    /// The longest a writer waits for a process that does not acknowledge: its registration,
    /// at most `length + MARGIN` ahead.
    pub fn bound(&self) -> Duration {
        self.length + MARGIN
    }

    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether memory may answer now.
    pub fn held(&self) -> bool {
        self.ns(Instant::now()) < self.until.load(Ordering::Acquire)
    }

    /// The current term (see the module docs).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// How long it is until the lease runs out (zero if not held); for `/healthz`.
    pub fn remaining(&self) -> Duration {
        let until = self.until.load(Ordering::Acquire);
        Duration::from_nanos(until.saturating_sub(self.ns(Instant::now())))
    }

    fn sent(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, Instant)>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a heartbeat about to be sent; returns its payload `"{id} {seq}"`.
    pub fn sending(&self) -> String {
        let seq = self.next.fetch_add(1, Ordering::AcqRel);
        let mut sent = self.sent();
        sent.push_back((seq, Instant::now()));
        while sent.len() > IN_FLIGHT {
            sent.pop_front();
        }
        format!("{} {seq}", self.id)
    }

    /// A heartbeat heard on the subscription (any process's: only this process's own renew
    /// its lease). Heartbeats older than the one heard are dropped: they were lost, and the
    /// newer one grants more.
    pub fn heard(&self, payload: &str) {
        let mut words = payload.split(' ');
        let (Some(Ok(id)), Some(Ok(seq))) = (
            words.next().map(str::parse::<u64>),
            words.next().map(str::parse::<u64>),
        ) else {
            return;
        };
        if id != self.id {
            return;
        }
        let at = {
            let mut sent = self.sent();
            let mut at = None;
            while let Some(&(s, t)) = sent.front() {
                if s > seq {
                    break;
                }
                sent.pop_front();
                if s == seq {
                    at = Some(t);
                }
            }
            at
        };
        let Some(at) = at else { return };
        let now = self.ns(Instant::now());
        self.heard_at.store(now, Ordering::Release);
        let until = self.ns(at + self.length);
        let before = self.until.fetch_max(until, Ordering::AcqRel);
        if before <= now && until > now {
            // Granted with none held: a new term, whose first use forgets all memory held.
            self.term.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Drops the lease (the subscription broke, was replaced or stopped): heartbeats in
    /// flight grant nothing, and the next lease starts a new term.
    pub fn drop_lease(&self) {
        self.sent().clear();
        self.until.store(0, Ordering::Release);
        self.term.fetch_add(1, Ordering::AcqRel);
    }

    /// Starts the silence clock of a new subscription.
    pub fn subscribed_now(&self) {
        self.heard_at
            .store(self.ns(Instant::now()), Ordering::Release);
    }

    /// Whether the subscription has been silent (none of this process's own heartbeats heard)
    /// for [`SILENCE`] lengths: the caller drops the connection.
    pub fn silent(&self) -> bool {
        let heard = self.heard_at.load(Ordering::Acquire);
        let silence = u64::try_from((self.length * SILENCE).as_nanos()).unwrap_or(u64::MAX);
        self.ns(Instant::now()).saturating_sub(heard) > silence
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_own_heartbeat_heard_grants_a_lease_from_when_it_was_sent_and_a_lapse_starts_a_term()
    {
        let lease = Lease::new(Duration::from_millis(60));
        assert!(!lease.held());
        let first = lease.sending();
        let other = format!("{} 1", lease.id() + 1);
        lease.heard(&other);
        assert!(!lease.held(), "another process's heartbeat grants nothing");
        let term = lease.term();
        lease.heard(&first);
        assert!(lease.held());
        assert_eq!(lease.term(), term + 1, "granted with none held: a new term");
        let (second, third) = (lease.sending(), lease.sending());
        lease.heard(&third);
        lease.heard(&second);
        assert_eq!(lease.term(), term + 1, "renewed while held: the same term");
        assert!(lease.remaining() <= Duration::from_millis(60));
        std::thread::sleep(Duration::from_millis(70));
        assert!(
            !lease.held(),
            "no heartbeat heard for a length: the lease ran out"
        );
        let fourth = lease.sending();
        lease.heard(&fourth);
        assert!(lease.held());
        assert_eq!(lease.term(), term + 2, "a lapse starts a new term");
        let fifth = lease.sending();
        lease.drop_lease();
        assert!(!lease.held());
        lease.heard(&fifth);
        assert!(
            !lease.held(),
            "a heartbeat sent before the drop grants nothing"
        );
    }
}
