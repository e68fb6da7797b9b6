//! Redis pub/sub across processes: publish after a commit, and one subscriber connection per
//! process and topic that hands each message to an in-process callback. Chat's messages are
//! wake-up hints ("something changed, look in Postgres"): a lost one costs latency, never
//! correctness, because waiters also poll Postgres while the subscriber is down. The streams'
//! messages carry the events ([`crate::streams`]): a broken subscription ends every stream, and
//! clients resume from Postgres.
//!
//! Every channel of a prefix shares the hash tag `{bus}` (`{p}:{bus}:{topic}`). A cluster
//! delivers a `PUBLISH` to the subscribers of every node, but counts only those on the node it
//! was sent to: chirp sends each to the master of the `{bus}` slot, and each process subscribes
//! there, so [`Cache::publish_counted`] counts every process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;

use crate::cache::{Cache, CacheUnavailable};

impl Cache {
    /// The pub/sub channel of `topic`: `{p}:{bus}:{topic}`.
    pub fn topic(&self, topic: &str) -> Option<String> {
        Some(format!("{}:{{bus}}:{topic}", self.keys()?.prefix()))
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

    /// Publishes `message` on `topic` and returns how many subscriber connections received it
    /// (for [`super::tokens`], which waits for each to acknowledge).
    ///
    /// # Errors
    /// Redis is off, down or failed.
    pub async fn publish_counted(
        &self,
        topic: &str,
        message: &str,
    ) -> Result<u64, CacheUnavailable> {
        let channel = self.topic(topic).ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("PUBLISH").arg(channel).arg(message);
        let (receivers,): (u64,) = self.run_unchecked(&pipe, 1).await?;
        Ok(receivers)
    }

    /// Starts a subscriber of `topics` on one connection: every message goes to
    /// `on_message(topic, payload)`; `subscribed` is true while the subscription stands, and
    /// `on_lost` runs each time a standing subscription breaks (messages published until it
    /// stands again are lost). It reconnects every second while Redis is down, and ends when
    /// `stop` turns true. `None` with the cache off. Use [`Subscriber`] (one per process).
    fn spawn_subscriber(
        &self,
        topics: &[&'static str],
        subscribed: Arc<AtomicBool>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        on_message: impl Fn(&str, &str) + Send + Sync + 'static,
        on_lost: impl Fn() + Send + Sync + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let cache = self.clone();
        let channels: Vec<(String, &'static str)> = topics
            .iter()
            .map(|t| Some((self.topic(t)?, *t)))
            .collect::<Option<_>>()?;
        Some(tokio::spawn(async move {
            loop {
                if *stop.borrow() {
                    return;
                }
                let client = match channels.first() {
                    Some((channel, _)) => cache.subscriber_client(channel).await,
                    None => None,
                };
                let pubsub = match client {
                    Some(client) => client.get_async_pubsub().await.ok(),
                    None => None,
                };
                if let Some(mut pubsub) = pubsub {
                    let names: Vec<&str> = channels.iter().map(|(c, _)| c.as_str()).collect();
                    if pubsub.subscribe(&names).await.is_ok() {
                        subscribed.store(true, Ordering::Release);
                        let mut messages = pubsub.on_message();
                        loop {
                            tokio::select! {
                                msg = messages.next() => match msg {
                                    Some(msg) => {
                                        let topic = channels
                                            .iter()
                                            .find(|(c, _)| c == msg.get_channel_name())
                                            .map(|(_, t)| *t);
                                        if let (Some(topic), Ok(text)) =
                                            (topic, msg.get_payload::<String>())
                                        {
                                            on_message(topic, &text);
                                        }
                                    }
                                    None => break,
                                },
                                _ = stop.changed() => return,
                            }
                        }
                        subscribed.store(false, Ordering::Release);
                        // A broken subscription is also what a Redis restart (maybe from an
                        // older snapshot) or a failover looks like from here, and the data
                        // connection reconnects without a word: Redis is not used again until
                        // the monitor has verified its epoch (`outbox::recover`), so no read
                        // serves what an older snapshot held in the second before the next check.
                        cache.mark_down(&"the pub/sub subscription broke");
                        on_lost();
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

/// What a topic's messages go to.
struct Route {
    topic: &'static str,
    on_message: Box<dyn Fn(&str) + Send + Sync>,
    on_lost: Box<dyn Fn() + Send + Sync>,
}

/// This process's one pub/sub subscription, shared by every feature that listens (chat's
/// wake-ups, the streams' events): one connection, whatever the number of clients. Features
/// add their topic with [`Subscriber::route`] when the state is built; the connection opens
/// the first time one of them needs it ([`Subscriber::start`]).
#[derive(Default)]
pub struct Subscriber {
    routes: std::sync::RwLock<Vec<Route>>,
    started: AtomicBool,
    subscribed: Arc<AtomicBool>,
}

impl Subscriber {
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

    /// Whether the subscription stands (messages published now reach this process).
    pub fn subscribed(&self) -> bool {
        self.subscribed.load(Ordering::Acquire)
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
        let (on_message, on_lost) = (Arc::downgrade(self), Arc::downgrade(self));
        let spawned = cache.spawn_subscriber(
            &topics,
            self.subscribed.clone(),
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
