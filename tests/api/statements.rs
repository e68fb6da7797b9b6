//! A proxy in front of Postgres that counts the statements a pool's connections send: one for
//! each `Bind` (an extended-protocol execution, what sqlx sends for a query with arguments or a
//! prepared one) and each simple `Query`. Not a ping: sqlx's is a bare `Sync`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Counts the statements sent through it ([`Statements::count`]).
pub struct Statements {
    count: Arc<AtomicUsize>,
}

impl Statements {
    /// A proxy to the Postgres `db` connects to, and a pool of `db`'s database through it
    /// (up to 8 connections).
    pub async fn start(db: &PgPool) -> (Self, PgPool) {
        let options = (*db.connect_options()).clone();
        let target = format!("{}:{}", options.get_host(), options.get_port());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, counted.clone()));
            }
        });
        // In the clear, so that the messages can be read.
        let through = options
            .host("127.0.0.1")
            .port(port)
            .ssl_mode(sqlx::postgres::PgSslMode::Disable);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect_lazy_with(through);
        (Statements { count }, pool)
    }

    /// Statements sent so far.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

async fn relay(client: TcpStream, server: TcpStream, count: Arc<AtomicUsize>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut frames = Frames::default();
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            count.fetch_add(frames.statements_in(&buf[..n]), Ordering::SeqCst);
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// The frontend's messages, split as they arrive: untyped ones until the startup message
/// (an `SSLRequest` may come first), then each a type byte and a length that counts itself.
#[derive(Default)]
struct Frames {
    started: bool,
    pending: Vec<u8>,
}

impl Frames {
    /// How many `Bind` and `Query` messages `bytes` completes.
    fn statements_in(&mut self, bytes: &[u8]) -> usize {
        self.pending.extend_from_slice(bytes);
        let mut statements = 0;
        loop {
            let (header, typed) = if self.started { (5, true) } else { (4, false) };
            if self.pending.len() < header {
                return statements;
            }
            let at = usize::from(typed);
            let len = u32::from_be_bytes(self.pending[at..at + 4].try_into().expect("4 bytes"));
            let total = at + len as usize;
            if self.pending.len() < total {
                return statements;
            }
            if typed {
                statements += usize::from(matches!(self.pending[0], b'B' | b'Q'));
            } else {
                // An SSLRequest (refused by the server: the startup message follows) or a
                // GSSENCRequest, else the startup message itself.
                let code = u32::from_be_bytes(self.pending[4..8].try_into().expect("4 bytes"));
                self.started = !matches!(code, 80_877_103 | 80_877_104);
            }
            self.pending.drain(..total);
        }
    }
}
