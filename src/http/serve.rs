//! The HTTP server loop: hyper's HTTP/1 connections with the limits `axum::serve` leaves off.
//!
//! axum 0.8's `serve` builds hyper without a timer, which turns off hyper's header-read
//! timeout: a client that sends half a request (slowloris) or nothing at all held its socket
//! forever. Here every connection has:
//!
//! - a **header-read timeout** (`CHIRP_HEADER_READ_TIMEOUT_MS`): the time a request's head may
//!   take to arrive, counted from when the connection starts waiting for it, so it also closes
//!   a keep-alive connection idle between requests;
//! - a **send buffer cap** ([`SEND_BUFFER_BYTES`]) and `TCP_USER_TIMEOUT`
//!   ([`USER_TIMEOUT`]): what a client that stopped reading pins in the kernel is bounded, and
//!   a peer that stops acknowledging is dropped by the kernel;
//! - a [`ConnectionHandle`] in each request's extensions, by which a response can have its
//!   connection closed: a stream whose session ended closes its connection even if the client
//!   never reads the end (hyper alone would keep trying to write it).
//!
//! Shutdown is hyper-util's graceful shutdown: no new connections, each open one finishes its
//! request in flight and closes.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_http::normalize_path::NormalizePath;

/// The kernel send buffer of each connection, bytes: what a client that stopped reading can
/// pin per connection (Linux doubles it for bookkeeping; autotuning would go to 4 MiB).
pub const SEND_BUFFER_BYTES: usize = 256 * 1024;
/// How long sent data may stay unacknowledged before the kernel drops the connection.
pub const USER_TIMEOUT: Duration = Duration::from_secs(30);

/// A way for a response to close its connection ([`ConnectionHandle::close_after`]). Requests
/// served in-process (tests driving the router directly) get a handle that closes nothing.
#[derive(Debug, Clone, Default)]
pub struct ConnectionHandle {
    close: Arc<Notify>,
    /// The grace before the close, ms.
    grace_ms: Arc<AtomicU64>,
}

impl ConnectionHandle {
    /// Closes the connection `grace` from now, whatever it is doing then (a client still
    /// reading the end of a response has that long to take it). A response that ends sooner
    /// with `Connection: close` closes it sooner.
    pub fn close_after(&self, grace: Duration) {
        let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        self.grace_ms.store(ms, Ordering::Release);
        self.close.notify_one();
    }

    /// Resolves once [`close_after`](Self::close_after) was called and its grace has passed.
    async fn closed(&self) {
        self.close.notified().await;
        let grace = Duration::from_millis(self.grace_ms.load(Ordering::Acquire));
        tokio::time::sleep(grace).await;
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ConnectionHandle {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<ConnectionHandle>()
            .cloned()
            .unwrap_or_default())
    }
}

/// The per-connection limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Header-read (and keep-alive idle) timeout.
    pub header_read_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then shuts down gracefully: returns
/// once every connection has closed (the caller bounds that wait). Each request carries its
/// peer's `ConnectInfo<SocketAddr>` and its [`ConnectionHandle`].
///
/// # Errors
/// None today (accept errors such as running out of file descriptors are logged and retried
/// after a pause, as `axum::serve` does).
pub async fn serve(
    listener: TcpListener,
    app: NormalizePath<Router>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        configure(&stream);
        let handle = ConnectionHandle::default();
        let on_request = handle.clone();
        let service = app
            .clone()
            .map_request(move |req: axum::http::Request<Incoming>| {
                let mut req = req.map(Body::new);
                req.extensions_mut().insert(ConnectInfo(peer));
                req.extensions_mut().insert(on_request.clone());
                req
            });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            tokio::select! {
                served = conn => {
                    if let Err(e) = served {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                }
                () = handle.closed() => tracing::debug!(%peer, "connection closed by its response"),
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Sets the accepted socket's options (best effort: a socket that refuses one still works).
fn configure(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(stream);
    let _ = socket.set_send_buffer_size(SEND_BUFFER_BYTES);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    let _ = socket.set_tcp_user_timeout(Some(USER_TIMEOUT));
}
