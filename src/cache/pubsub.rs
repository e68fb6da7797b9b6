//! Redis pub/sub across processes: publish after a commit, and one subscriber connection per
//! process and topic that hands each message to an in-process callback. Chat's messages are
//! wake-up hints ("something changed, look in Postgres"): a lost one costs latency, never
//! correctness, because waiters also poll Postgres while the subscriber is down. The streams'
//! messages carry the events ([`crate::streams`]): a broken subscription ends every stream, and
//! clients resume from Postgres.
//!
//! The near caches' evictions ride the same subscription, with the heartbeats of the process's
//! lease ([`super::lease`]); a writer waits for the processes in a registry, not for the
//! receivers `PUBLISH` counts (on a cluster it counts one node's subscribers only).
//!
//! Every channel of a prefix shares the hash tag `{bus}` (`{p}:{bus}:{topic}`), and so do the
//! registries (`{p}:{bus}:live:{topic}`): the scripts that publish also read or write them.
//! Each process subscribes on the master that serves the `{bus}` slot when it connects; a
//! cluster delivers a `PUBLISH` to the subscribers of every node, so one that stays on a demoted
//! master still hears evictions and heartbeats, and one whose node is gone hears no heartbeat
//! and subscribes again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;

use crate::cache::lease::{self, Lease};
use crate::cache::{Cache, CacheUnavailable};

impl Cache {
    /// The pub/sub channel of `topic`: `{p}:{bus}:{topic}`.
    pub fn topic(&self, topic: &str) -> Option<String> {
        Some(self.keys()?.topic(topic))
    }

    /// A client for a subscriber connection: the one server, or the cluster master that serves
    /// the `{bus}` slot now.
    async fn subscriber_client(&self, channel: &str) -> Option<redis::Client> {
        let inner = self.inner.as_ref()?;
        match &inner.backend {
            super::Backend::Single { client, .. } => Some(client.clone()),
            super::Backend::Cluster { .. } => {
                let mut session = self.session(false).await.ok()?;
                let lookup = async {
                    let slot = session.slot_of(channel).await.ok()??;
                    let masters = session.masters().await.ok()??;
                    masters.into_iter().find(|m| m.serves(slot))
                };
                let master = tokio::time::timeout(inner.timeout * 5, lookup)
                    .await
                    .ok()??;
                let route = (inner.subscriber_route.lock())
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                if let Some((_, via)) = route.filter(|(at, _)| *at == master.addr) {
                    return redis::Client::open(via).ok();
                }
                let (host, port) = master.addr;
                redis::Client::open(format!("redis://{host}:{port}/")).ok()
            }
        }
    }

    /// Publishes `message` on `topic` (best effort: the caller has committed already).
    ///
    /// # Errors
    /// Redis is off, down or failed.
    pub async fn publish(&self, topic: &str, message: &str) -> Result<(), CacheUnavailable> {
        let channel = self.topic(topic).ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("PUBLISH").arg(channel).arg(message).ignore();
        self.run::<()>(&pipe).await
    }

    /// `{p}:{bus}:live:{topic}`: the registry of the processes that may hold a lease on their
    /// memory of `topic`'s values ([`super::lease`]).
    pub fn registry(&self, topic: &str) -> Option<String> {
        Some(self.keys()?.registry(topic))
    }

    /// Sends one heartbeat of `lease` ([`super::scripts::HEARTBEAT`]): registers the process in
    /// `registries` and publishes `payload` on `channel`.
    async fn heartbeat(
        &self,
        registries: &[String],
        lease: &Lease,
        channel: &str,
        payload: &str,
    ) -> Result<(), CacheUnavailable> {
        let ahead = u64::try_from(lease.bound().as_millis()).unwrap_or(u64::MAX);
        let mut invocation = super::scripts::HEARTBEAT.prepare_invoke();
        for registry in registries {
            invocation.key(registry);
        }
        if registries.is_empty() {
            // The script needs a key to be routed by (the `{bus}` slot); it writes none.
            invocation.key(channel);
        }
        invocation
            .arg(lease.id())
            .arg(ahead)
            .arg(channel)
            .arg(payload)
            .arg(registries.len());
        let mut pipe = redis::pipe();
        pipe.invoke_script(&invocation).ignore();
        self.run_unchecked::<()>(&pipe, 1).await
    }

    /// Publishes the eviction `payload` on `topic` and reads the registrations of `topic`'s
    /// registry that have not expired, at the same instant ([`super::scripts::PUBLISH_EVICTION`]).
    ///
    /// # Errors
    /// Redis is off or did not answer (the health flag is not consulted: a writer whose Redis
    /// is marked down still tries).
    pub async fn publish_eviction(
        &self,
        topic: &str,
        payload: &str,
    ) -> Result<Published, CacheUnavailable> {
        let channel = self.topic(topic).ok_or(CacheUnavailable)?;
        let registry = self.registry(topic).ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.invoke_script(
            super::scripts::PUBLISH_EVICTION
                .key(registry)
                .arg(channel)
                .arg(payload),
        );
        let ((receivers, now, live),): ((u64, i64, Vec<String>),) =
            self.run_unchecked(&pipe, 1).await?;
        let live = live
            .chunks_exact(2)
            .filter_map(|pair| {
                let id = pair[0].parse::<u64>().ok()?;
                let expiry = pair[1].parse::<f64>().ok()? as i64;
                let left = u64::try_from(expiry.saturating_sub(now)).ok()?;
                Some((id, Duration::from_millis(left)))
            })
            .collect();
        Ok(Published { receivers, live })
    }

    /// Starts a subscriber of `topics` on one connection: every message goes to
    /// `on_message(topic, payload)`; `subscribed` is true while the subscription stands, and
    /// `on_lost` runs each time a standing subscription breaks or ends (messages published
    /// until it stands again are lost). It also sends `lease`'s heartbeats and hears them
    /// ([`super::lease`]); a subscription on which none is heard for [`lease::SILENCE`] lease
    /// lengths (half-open, stalled) is dropped and opened again. It reconnects every second
    /// while Redis is down, and ends when `stop` turns true. `None` with the cache off. Use
    /// [`Subscriber`] (one per process).
    fn spawn_subscriber(
        &self,
        topics: &[&'static str],
        registries: Vec<String>,
        shared: Arc<Shared>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        on_message: impl Fn(&str, &str) + Send + Sync + 'static,
        on_lost: impl Fn() + Send + Sync + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let cache = self.clone();
        let channels: Vec<(String, &'static str)> = topics
            .iter()
            .map(|t| Some((self.topic(t)?, *t)))
            .collect::<Option<_>>()?;
        // Each process's heartbeats on a channel of its own: no process hears the others'.
        let beat = self.topic(&format!("{BEAT}:{}", shared.lease.id()))?;
        let registries = Arc::new(registries);
        Some(tokio::spawn(async move {
            let lost = |why: &str| {
                shared.subscribed.store(false, Ordering::Release);
                cache.set_subscribed(false);
                shared.lease.drop_lease();
                tracing::debug!(why, "pub/sub subscription lost; memory not trusted");
                on_lost();
            };
            loop {
                if *stop.borrow() {
                    return;
                }
                let client = cache.subscriber_client(&beat).await;
                let pubsub = match client {
                    Some(client) => client.get_async_pubsub().await.ok(),
                    None => None,
                };
                if let Some(mut pubsub) = pubsub {
                    let mut names: Vec<&str> = channels.iter().map(|(c, _)| c.as_str()).collect();
                    names.push(&beat);
                    if pubsub.subscribe(&names).await.is_ok() {
                        shared.subscribed.store(true, Ordering::Release);
                        cache.set_subscribed(true);
                        shared.lease.subscribed_now();
                        let mut messages = pubsub.on_message();
                        let mut tick = tokio::time::interval(shared.lease.period());
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        let silent = loop {
                            tokio::select! {
                                msg = messages.next() => match msg {
                                    Some(msg) => {
                                        let Ok(text) = msg.get_payload::<String>() else {
                                            continue;
                                        };
                                        let channel = msg.get_channel_name();
                                        if channel == beat {
                                            shared.lease.heard(&text);
                                        } else if let Some((_, topic)) =
                                            channels.iter().find(|(c, _)| c == channel)
                                        {
                                            on_message(topic, &text);
                                        }
                                    }
                                    None => break false,
                                },
                                _ = tick.tick() => {
                                    if shared.lease.silent() {
                                        break true;
                                    }
                                    send_heartbeat(&cache, &shared, &registries, &beat);
                                }
                                _ = stop.changed() => {
                                    // In-flight requests and jobs of a stopping process read
                                    // their memory no longer: no eviction reaches it now.
                                    shared.subscribed.store(false, Ordering::Release);
                                    shared.lease.drop_lease();
                                    return;
                                }
                            }
                        };
                        if silent {
                            tracing::warn!(
                                "no heartbeat heard on the pub/sub subscription for {:?}; \
                                 dropping it (half-open or stalled) and subscribing again",
                                shared.lease.length() * lease::SILENCE
                            );
                        }
                        lost(if silent { "silent" } else { "broke" });
                        // A broken subscription is also what a Redis restart (maybe from an
                        // older snapshot) or a failover looks like from here, and the data
                        // connection reconnects without a word: Redis is not used again until
                        // the monitor has verified its epoch (`outbox::recover`), so no read
                        // serves what an older snapshot held in the second before the next check.
                        cache.mark_down(&"the pub/sub subscription broke");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => return,
                }
            }
        }))
    }
}

/// What [`Cache::publish_eviction`] found when the eviction was published.
#[derive(Debug)]
pub struct Published {
    /// The subscriber connections `PUBLISH` counted (on a cluster, of one node only).
    pub receivers: u64,
    /// Every process registered then, with how long its registration had left (so its lease at
    /// most).
    pub live: Vec<(u64, Duration)>,
}

/// The topic of heartbeats: `{p}:{bus}:beat:{process id}`, payload `"{process id} {sequence
/// number}"`.
const BEAT: &str = "beat";

/// Sends a heartbeat in a task of its own (the subscriber keeps reading meanwhile), unless the
/// previous one is still on its way (a slow Redis gets one at a time).
fn send_heartbeat(cache: &Cache, shared: &Arc<Shared>, registries: &Arc<Vec<String>>, beat: &str) {
    if shared.beating.swap(true, Ordering::AcqRel) {
        return;
    }
    let payload = shared.lease.sending();
    let (cache, shared, registries, beat) = (
        cache.clone(),
        shared.clone(),
        registries.clone(),
        beat.to_owned(),
    );
    tokio::spawn(async move {
        if cache
            .heartbeat(&registries, &shared.lease, &beat, &payload)
            .await
            .is_err()
        {
            tracing::debug!("heartbeat not sent (redis unavailable)");
        }
        shared.beating.store(false, Ordering::Release);
    });
}

/// What a topic's messages go to.
struct Route {
    topic: &'static str,
    on_message: Box<dyn Fn(&str) + Send + Sync>,
    on_lost: Box<dyn Fn() + Send + Sync>,
}

/// What the subscriber task shares with the process: whether the subscription stands, the
/// lease, whether a heartbeat is on its way.
#[derive(Debug)]
struct Shared {
    subscribed: AtomicBool,
    lease: Lease,
    beating: AtomicBool,
}

/// This process's one pub/sub subscription, shared by every feature that listens (chat's
/// wake-ups, the streams' events, the near caches' evictions): one connection, whatever the
/// number of clients, carrying also the heartbeats of the process's [`Lease`]. Features add
/// their topic with [`Subscriber::route`] when the state is built; the connection opens the
/// first time one of them needs it ([`Subscriber::start`]).
pub struct Subscriber {
    routes: std::sync::RwLock<Vec<Route>>,
    /// Topics whose values this process keeps in memory on its lease (it registers in their
    /// registries).
    leased: std::sync::RwLock<Vec<&'static str>>,
    started: AtomicBool,
    shared: Arc<Shared>,
}

impl Default for Subscriber {
    fn default() -> Self {
        Subscriber::new(Duration::from_millis(lease::DEFAULT_LENGTH_MS))
    }
}

impl Subscriber {
    /// A subscriber whose process holds leases of `lease` (`CHIRP_NEAR_LEASE_MS`).
    pub fn new(lease: Duration) -> Self {
        Subscriber {
            routes: std::sync::RwLock::default(),
            leased: std::sync::RwLock::default(),
            started: AtomicBool::new(false),
            shared: Arc::new(Shared {
                subscribed: AtomicBool::new(false),
                lease: Lease::new(lease),
                beating: AtomicBool::new(false),
            }),
        }
    }

    /// Sends the messages of `topic` to `on_message`, and calls `on_lost` each time the
    /// subscription breaks. Routes added after [`Subscriber::start`] are not subscribed.
    pub fn route(
        &self,
        topic: &'static str,
        on_message: impl Fn(&str) + Send + Sync + 'static,
        on_lost: impl Fn() + Send + Sync + 'static,
    ) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        routes.push(Route {
            topic,
            on_message: Box::new(on_message),
            on_lost: Box::new(on_lost),
        });
    }

    /// Registers this process, while its subscription stands, in the registry of `topic`
    /// (a near cache's evictions: writers wait for its acknowledgement or its lease). Call
    /// before [`Subscriber::start`].
    pub fn lease_topic(&self, topic: &'static str) {
        let mut leased = self.leased.write().unwrap_or_else(|p| p.into_inner());
        if !leased.contains(&topic) {
            leased.push(topic);
        }
    }

    /// Whether the subscription stands (messages published now reach this process).
    pub fn subscribed(&self) -> bool {
        self.shared.subscribed.load(Ordering::Acquire)
    }

    /// This process's lease on its memory.
    pub fn lease(&self) -> &Lease {
        &self.shared.lease
    }

    /// Opens the subscription the first time it is called (it lives until `stop`); false
    /// with the cache off.
    pub fn start(
        self: &Arc<Self>,
        cache: &Cache,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        if self.started.swap(true, Ordering::AcqRel) {
            return true;
        }
        let topics: Vec<&'static str> = {
            let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
            routes.iter().map(|r| r.topic).collect()
        };
        let registries: Option<Vec<String>> = {
            let leased = self.leased.read().unwrap_or_else(|p| p.into_inner());
            leased.iter().map(|t| cache.registry(t)).collect()
        };
        let (on_message, on_lost) = (Arc::downgrade(self), Arc::downgrade(self));
        let spawned = cache.spawn_subscriber(
            &topics,
            registries.unwrap_or_default(),
            self.shared.clone(),
            stop.clone(),
            move |topic, payload| {
                if let Some(me) = on_message.upgrade() {
                    let routes = me.routes.read().unwrap_or_else(|p| p.into_inner());
                    for r in routes.iter().filter(|r| r.topic == topic) {
                        (r.on_message)(payload);
                    }
                }
            },
            move || {
                if let Some(me) = on_lost.upgrade() {
                    let routes = me.routes.read().unwrap_or_else(|p| p.into_inner());
                    for r in routes.iter() {
                        (r.on_lost)();
                    }
                }
            },
        );
        if spawned.is_none() {
            self.started.store(false, Ordering::Release);
        }
        spawned.is_some()
    }
}
