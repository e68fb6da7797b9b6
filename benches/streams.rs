//! Load client for chirp's streams (issue 8), run by `scripts/bench-streams` against a release
//! `chirp serve`. Plain tokio TCP and HTTP/1.1 (chunked SSE decoded here), so thousands of
//! streams cost the client little CPU and the latencies measured are the server's.
//!
//! ```text
//! cargo bench --bench streams -- latency   ADDR TOKENS N POSTS
//! cargo bench --bench streams -- idle      ADDR TOKENS N HOLD_SECS
//! cargo bench --bench streams -- filter    ADDR TOKENS CLIENTS PHRASES_FILE SECS
//! cargo bench --bench streams -- reconnect ADDR TOKENS RECONNECTS
//! ```
//! `TOKENS` is `user_id<TAB>token` per line (from `chirp import --tokens-out`). Each mode prints
//! one `RESULT key=value …` line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One request on its own connection (`Connection: close`): `(status, body)`.
async fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> Result<(u16, String), Error> {
    let mut s = TcpStream::connect(addr).await?;
    let auth = if token.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {token}\r\n")
    };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Ok((status, body.to_owned()))
}

/// A stream's events, decoded from the chunked body.
struct Events {
    s: TcpStream,
    raw: Vec<u8>,
    data: Vec<u8>,
    head_done: bool,
}

/// One SSE frame: `(event kind, id, data)`; comments give an empty kind.
type Frame = (String, Option<String>, String);

/// What each stream's reader calls with `(client index, frame, arrival time)`.
type OnFrame = Arc<dyn Fn(usize, &Frame, Instant) + Send + Sync>;

impl Events {
    async fn open(addr: &str, path: &str, token: &str, last: Option<&str>) -> Result<Self, Error> {
        let mut s = TcpStream::connect(addr).await?;
        let last = last
            .map(|l| format!("Last-Event-ID: {l}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n{last}\r\n"
        );
        s.write_all(head.as_bytes()).await?;
        Ok(Events {
            s,
            raw: Vec::new(),
            data: Vec::new(),
            head_done: false,
        })
    }

    /// Moves whole chunks from `raw` to `data`.
    fn dechunk(&mut self) -> Result<(), Error> {
        if !self.head_done {
            let Some(end) = find(&self.raw, b"\r\n\r\n") else {
                return Ok(());
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).to_string();
            if !head.starts_with("HTTP/1.1 200") {
                return Err(
                    format!("stream refused: {}", head.lines().next().unwrap_or("")).into(),
                );
            }
            self.raw.drain(..end + 4);
            self.head_done = true;
        }
        loop {
            let Some(line_end) = find(&self.raw, b"\r\n") else {
                return Ok(());
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&self.raw[..line_end])?.trim(), 16)?;
            if size == 0 {
                return Err("stream ended".into());
            }
            if self.raw.len() < line_end + 2 + size + 2 {
                return Ok(());
            }
            self.data
                .extend_from_slice(&self.raw[line_end + 2..line_end + 2 + size]);
            self.raw.drain(..line_end + 2 + size + 2);
        }
    }

    /// The next frame (comments included).
    async fn next(&mut self) -> Result<Frame, Error> {
        loop {
            if let Some(end) = find(&self.data, b"\n\n") {
                let frame = String::from_utf8_lossy(&self.data[..end]).to_string();
                self.data.drain(..end + 2);
                let (mut kind, mut id, mut data) = (String::new(), None, String::new());
                for line in frame.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        kind = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = v.to_owned();
                    }
                }
                return Ok((kind, id, data));
            }
            let mut buf = [0u8; 16384];
            let n = self.s.read(&mut buf).await?;
            if n == 0 {
                return Err("connection closed".into());
            }
            self.raw.extend_from_slice(&buf[..n]);
            self.dechunk()?;
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn tokens(path: &str) -> Result<Vec<(i64, String)>, Error> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (id, token) = l.split_once('\t')?;
            Some((id.parse().ok()?, token.trim().to_owned()))
        })
        .collect())
}

/// The `n`-quantile of sorted `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

/// Signs up a fresh poster and returns `(id, token)`.
async fn poster(addr: &str, tag: &str) -> Result<(i64, String), Error> {
    let name = format!("bp{tag}{}", std::process::id());
    let body = format!(
        r#"{{"username":"{name}","email":"{name}@bench.invalid","password":"correct horse battery"}}"#
    );
    let (status, res) = request(addr, "POST", "/api/accounts/signup/", "", &body).await?;
    if status != 201 {
        return Err(format!("signup: {status} {res}").into());
    }
    let v: serde_json::Value = serde_json::from_str(&res)?;
    let id = v["user"]["id"].as_i64().ok_or("no id")?;
    let token = v["token"].as_str().ok_or("no token")?.to_owned();
    Ok((id, token))
}

/// Opens `n` streams of `path`, one per token (round robin), each read by its own task that
/// calls `on_frame(client, frame, at)`; returns when all have their `:ok`.
async fn open_all(
    addr: &str,
    toks: &[(i64, String)],
    n: usize,
    path: &str,
    on_frame: OnFrame,
) -> Result<Arc<AtomicUsize>, Error> {
    let open = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    for i in 0..n {
        let (addr, path) = (addr.to_owned(), path.to_owned());
        let token = toks[i % toks.len()].1.clone();
        let (open, failed, on_frame) = (open.clone(), failed.clone(), on_frame.clone());
        tokio::spawn(async move {
            let mut ev = match Events::open(&addr, &path, &token, None).await {
                Ok(ev) => ev,
                Err(_) => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            let mut first = true;
            while let Ok(frame) = ev.next().await {
                if first {
                    open.fetch_add(1, Ordering::Relaxed);
                    first = false;
                }
                on_frame(i, &frame, Instant::now());
            }
            if first {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        });
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while open.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        return Err(format!("{failed} of {n} streams failed to open").into());
    }
    Ok(open)
}

async fn latency(addr: &str, toks: &[(i64, String)], n: usize, posts: usize) -> Result<(), Error> {
    let (poster_id, poster_token) = poster(addr, "lat").await?;
    for (_, token) in toks.iter().take(n) {
        let (status, body) = request(
            addr,
            "POST",
            &format!("/api/friendships/{poster_id}/follow/"),
            token,
            "{}",
        )
        .await?;
        if status != 201 {
            return Err(format!("follow: {status} {body}").into());
        }
    }
    let tag = format!("bench-lat-{}", std::process::id());
    let arrivals: Arc<std::sync::Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let on_frame = {
        let (arrivals, marker) = (arrivals.clone(), format!("{tag} "));
        Arc::new(move |_: usize, f: &Frame, at: Instant| {
            if f.0 != "tweet" {
                return;
            }
            let seq = f.2.split(&marker).nth(1).and_then(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<usize>().ok()
            });
            if let (Some(seq), Ok(mut a)) = (seq, arrivals.lock()) {
                a.push((seq, at));
            }
        })
    };
    open_all(addr, toks, n, "/api/streaming/user/", on_frame).await?;
    let mut returned = Vec::with_capacity(posts);
    for i in 0..posts {
        let body = format!(r#"{{"content":"{tag} {i} live"}}"#);
        let (status, res) = request(addr, "POST", "/api/tweets/", &poster_token, &body).await?;
        if status != 201 {
            return Err(format!("post: {status} {res}").into());
        }
        returned.push(Instant::now());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let arrivals = arrivals.lock().map_err(|_| "poisoned")?.clone();
    let mut ms: Vec<f64> = arrivals
        .iter()
        .map(|(seq, at)| {
            let sent = returned.get(*seq).copied().unwrap_or(*at);
            if *at >= sent {
                at.duration_since(sent).as_secs_f64() * 1000.0
            } else {
                0.0
            }
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "RESULT mode=latency clients={n} posts={posts} events={} expected={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
        ms.len(),
        n * posts,
        quantile(&ms, 0.5),
        quantile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}

async fn idle(addr: &str, toks: &[(i64, String)], n: usize, hold: u64) -> Result<(), Error> {
    let beats = Arc::new(AtomicUsize::new(0));
    let on_frame = {
        let beats = beats.clone();
        Arc::new(move |_: usize, f: &Frame, _: Instant| {
            if f.0.is_empty() {
                beats.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let started = Instant::now();
    let open = open_all(addr, toks, n, "/api/streaming/user/", on_frame).await?;
    println!(
        "READY open={} in {:.1}s",
        open.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(hold)).await;
    println!(
        "RESULT mode=idle streams={} comments={}",
        open.load(Ordering::Relaxed),
        beats.load(Ordering::Relaxed)
    );
    Ok(())
}

async fn filter(
    addr: &str,
    toks: &[(i64, String)],
    clients: usize,
    phrases: &str,
    secs: u64,
) -> Result<(), Error> {
    let track: Vec<String> = std::fs::read_to_string(phrases)?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.replace(' ', "%20"))
        .collect();
    let path = format!("/api/streaming/statuses/filter/?track={}", track.join(","));
    let events = Arc::new(AtomicUsize::new(0));
    let on_frame = {
        let events = events.clone();
        Arc::new(move |_: usize, f: &Frame, _: Instant| {
            if f.0 == "tweet" {
                events.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    open_all(addr, toks, clients, &path, on_frame).await?;
    println!("READY filters={clients} phrases={}", track.len());
    let start = Instant::now();
    let before = events.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let got = events.load(Ordering::Relaxed) - before;
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "RESULT mode=filter clients={clients} phrases={} events={got} seconds={elapsed:.1} events_per_s={:.1} per_client_per_s={:.1}",
        track.len(),
        got as f64 / elapsed,
        got as f64 / elapsed / clients as f64
    );
    Ok(())
}

async fn reconnect(addr: &str, toks: &[(i64, String)], total: usize) -> Result<(), Error> {
    let (_, token) = toks.first().ok_or("no tokens")?.clone();
    let tag = format!("bench-rc-{}", std::process::id());
    let posted: Arc<Mutex<Vec<i64>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poster = {
        let (addr, token, tag, posted, done) = (
            addr.to_owned(),
            token.clone(),
            tag.clone(),
            posted.clone(),
            done.clone(),
        );
        tokio::spawn(async move {
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                let body = format!(r#"{{"content":"{tag} {i}"}}"#);
                if let Ok((201, res)) = request(&addr, "POST", "/api/tweets/", &token, &body).await
                    && let Ok(v) = serde_json::from_str::<serde_json::Value>(&res)
                    && let Some(id) = v["id"].as_i64()
                {
                    posted.lock().await.push(id);
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let mut received: Vec<i64> = Vec::new();
    let mut last: Option<String> = None;
    let mut reconnects = 0;
    let mut refused = 0;
    let started = Instant::now();
    let tweet_id = |data: &str| -> Option<i64> {
        let v: serde_json::Value = serde_json::from_str(data).ok()?;
        if v["tweet"]["content"].as_str()?.starts_with(&tag) {
            v["tweet"]["id"].as_i64()
        } else {
            None
        }
    };
    while reconnects < total {
        let mut ev = match Events::open(addr, "/api/streaming/user/", &token, last.as_deref()).await
        {
            Ok(ev) => ev,
            Err(_) => {
                refused += 1;
                continue;
            }
        };
        // Read 1 to 6 tweet events, then drop the connection.
        let want = 1 + reconnects % 6;
        let mut got = 0;
        while got < want {
            match tokio::time::timeout(Duration::from_secs(5), ev.next()).await {
                Ok(Ok((kind, id, data))) if kind == "tweet" => {
                    if let Some(t) = tweet_id(&data) {
                        received.push(t);
                    }
                    last = id;
                    got += 1;
                }
                Ok(Ok(_)) => {}
                _ => {
                    refused += 1;
                    break;
                }
            }
        }
        reconnects += 1;
    }
    done.store(true, Ordering::Relaxed);
    let _ = poster.await;
    // A last connection drains what was posted after the last drop: until every posted tweet
    // has arrived, or nothing came for 10 s; then 1 s more, for anything sent twice.
    let posted = posted.lock().await.clone();
    if let Ok(mut ev) = Events::open(addr, "/api/streaming/user/", &token, last.as_deref()).await {
        let mut missing: std::collections::HashSet<i64> = posted.iter().copied().collect();
        for id in &received {
            missing.remove(id);
        }
        let mut quiet = Duration::from_secs(10);
        while let Ok(Ok((kind, _, data))) = tokio::time::timeout(quiet, ev.next()).await {
            if kind == "tweet"
                && let Some(t) = tweet_id(&data)
            {
                missing.remove(&t);
                received.push(t);
            }
            if missing.is_empty() {
                quiet = Duration::from_secs(1);
            }
        }
    }
    let unique: std::collections::HashSet<i64> = received.iter().copied().collect();
    let lost = posted.iter().filter(|id| !unique.contains(id)).count();
    let duplicated = received.len() - unique.len();
    println!(
        "RESULT mode=reconnect reconnects={reconnects} refused_or_stalled={refused} posted={} received={} lost={lost} duplicated={duplicated} seconds={:.1}",
        posted.len(),
        received.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let num = |i: usize| arg(i).parse::<usize>().unwrap_or(0);
    if args.is_empty() {
        eprintln!("usage: see benches/streams.rs");
        return Ok(());
    }
    let (addr, toks) = (arg(1), tokens(&arg(2))?);
    if toks.is_empty() {
        return Err("no tokens".into());
    }
    match arg(0).as_str() {
        "latency" => latency(&addr, &toks, num(3), num(4)).await,
        "idle" => idle(&addr, &toks, num(3), num(4) as u64).await,
        "filter" => filter(&addr, &toks, num(3), &arg(4), num(5) as u64).await,
        "reconnect" => reconnect(&addr, &toks, num(3)).await,
        other => Err(format!("unknown mode {other}").into()),
    }
}
