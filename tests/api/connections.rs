//! Connections over real TCP (`chirp::http::serve`): slow and idle clients are cut off, and a
//! stream whose client stopped reading does not keep its connection after its session ends.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chirp::http::serve::{Limits, SEND_BUFFER_BYTES};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::helpers::TestApp;

/// Serves `app` on a free local port with `header_read_timeout`.
async fn serve(app: &TestApp, header_read_timeout: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(chirp::http::serve::serve(
        listener,
        app.app.clone(),
        Limits {
            header_read_timeout,
        },
        std::future::pending(),
    ));
    addr
}

/// Reads until the server closes the connection (EOF or reset); false if it is still open
/// after `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn slow_half_sent_and_idle_connections_are_closed(db: PgPool) {
    let app = TestApp::new(db).await;
    let timeout = Duration::from_millis(500);
    let addr = serve(&app, timeout).await;

    // Sends nothing at all.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // Slowloris: a request head that never ends, one header line at a time.
    let mut trickling = TcpStream::connect(addr).await.unwrap();
    trickling
        .write_all(b"GET /livez HTTP/1.1\r\nHost: chirp\r\n")
        .await
        .unwrap();
    let (mut trickle_read, mut trickle_write) = trickling.into_split();
    let trickle = tokio::spawn(async move {
        for i in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if trickle_write
                .write_all(format!("X-Slow-{i}: yes\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    });
    // A keep-alive connection that made one request and then idles.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /livez HTTP/1.1\r\nHost: chirp\r\n\r\n")
        .await
        .unwrap();
    let mut head = vec![0u8; 1024];
    let n = idle.read(&mut head).await.unwrap();
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"),
        "the idle connection's request was answered"
    );

    let started = Instant::now();
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await,
        "a connection that sends nothing is closed"
    );
    let mut buf = vec![0u8; 1024];
    let trickle_closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match trickle_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok();
    assert!(
        trickle_closed,
        "a request head trickled line by line is cut off"
    );
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "an idle keep-alive connection is closed"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "all within a few timeouts: {:?}",
        started.elapsed()
    );
    trickle.abort();

    // A client that sends its request in time is served as before.
    let mut ok = TcpStream::connect(addr).await.unwrap();
    ok.write_all(b"GET /livez HTTP/1.1\r\nHost: chirp\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    ok.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// The server-side state (`/proc/net/tcp` `st`, hex) and send queue (bytes) of the connection
/// from `client` to `server`, if the socket still exists.
fn server_socket(server: SocketAddr, client: SocketAddr) -> Option<(u8, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, remote, state, queues) = (fields[1], fields[2], fields[3], fields[4]);
        if port(local)? != server.port() || port(remote)? != client.port() {
            return None;
        }
        let tx = u64::from_str_radix(queues.split(':').next()?, 16).ok()?;
        Some((u8::from_str_radix(state, 16).ok()?, tx))
    })
}

const TCP_ESTABLISHED: u8 = 1;

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_stream_whose_client_stopped_reading_loses_its_connection_when_it_ends(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.stream_heartbeat_secs = 1;
        c.stream_buffer = 5;
    })
    .await;
    let addr = serve(&app, Duration::from_secs(10)).await;
    let (me, token) = app.quick_user("poster").await;

    // A client with a tiny receive window that never reads.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stuck = socket.connect(addr).await.unwrap();
    let client = stuck.local_addr().unwrap();
    stuck
        .write_all(
            format!(
                "GET /api/streaming/statuses/sample/?percent=100 HTTP/1.1\r\nHost: chirp\r\n\
                 Authorization: Bearer {token}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    crate::helpers::eventually("the stream is open", async || {
        app.state.streams.counts().1 == 1
    })
    .await;

    // Matching tweets, about 2 KB each on the wire, until the session gives the client up.
    let new = chirp::tweets::NewTweet {
        content: "x".repeat(280),
        photo_urls: (0..9)
            .map(|i| format!("/media/photos/{i}/{}", "p".repeat(150)))
            .collect(),
        ..Default::default()
    };
    let mut most_queued = 0;
    let started = Instant::now();
    while app.state.streams.counts().1 > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the stuck client was never cut off"
        );
        for _ in 0..20 {
            chirp::tweets::create(
                &app.state.db,
                &app.state.cache,
                &app.state.pull,
                me,
                &new,
                || (),
            )
            .await
            .unwrap();
        }
        if let Some((_, queued)) = server_socket(addr, client) {
            most_queued = most_queued.max(queued);
        }
    }
    // Its session ended (the hub let it go); within a heartbeat or two its connection is gone
    // too, although the client still has not read a byte.
    let ended = Instant::now();
    let mut state = server_socket(addr, client);
    while state.is_some_and(|(st, _)| st == TCP_ESTABLISHED) {
        assert!(
            ended.elapsed() < Duration::from_secs(5),
            "the server kept the stuck connection: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        state = server_socket(addr, client);
    }
    assert!(
        most_queued <= 2 * SEND_BUFFER_BYTES as u64 + 64 * 1024,
        "the kernel held {most_queued} bytes for one stuck client"
    );
    drop(stuck);
}
