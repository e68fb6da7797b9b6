//! Redis pub/sub across processes: publish after a commit, and one subscriber connection per
//! process and topic that hands each message to an in-process callback. Chat's messages are
//! wake-up hints ("something changed, look in Postgres"): a lost one costs latency, never
//! correctness, because waiters also poll Postgres while the subscriber is down. The streams'
//! messages carry the events ([`crate::streams`]): a broken subscription ends every stream, and
//! clients resume from Postgres.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;

use crate::cache::{Cache, CacheUnavailable};

impl Cache {
    /// The pub/sub channel of `topic`: `{p}:{topic}`.
    fn topic(&self, topic: &str) -> Option<String> {
        Some(format!("{}:{topic}", self.keys()?.prefix()))
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

    /// Starts this process's subscriber of `topic`: every message goes to `on_message`;
    /// `subscribed` is true while the subscription stands, and `on_lost` runs each time a
    /// standing subscription breaks (messages published until it stands again are lost). It
    /// reconnects every second while Redis is down, and ends when `stop` turns true. `None`
    /// with the cache off.
    pub fn spawn_subscriber(
        &self,
        topic: &str,
        subscribed: Arc<AtomicBool>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        on_message: impl Fn(&str) + Send + Sync + 'static,
        on_lost: impl Fn() + Send + Sync + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let client = self.inner.as_ref()?.client.clone();
        let channel = self.topic(topic)?;
        Some(tokio::spawn(async move {
            loop {
                if *stop.borrow() {
                    return;
                }
                if let Ok(mut pubsub) = client.get_async_pubsub().await
                    && pubsub.subscribe(&channel).await.is_ok()
                {
                    subscribed.store(true, Ordering::Release);
                    let mut messages = pubsub.on_message();
                    loop {
                        tokio::select! {
                            msg = messages.next() => match msg {
                                Some(msg) => {
                                    if let Ok(text) = msg.get_payload::<String>() {
                                        on_message(&text);
                                    }
                                }
                                None => break,
                            },
                            _ = stop.changed() => return,
                        }
                    }
                    subscribed.store(false, Ordering::Release);
                    on_lost();
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => return,
                }
            }
        }))
    }
}
