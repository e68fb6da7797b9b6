//! Load client for chirp's abuse limits (issue 37), run by `scripts/bench-abuse` against a
//! release `chirp serve`. Plain tokio TCP and HTTP/1.1, one connection per request, so the
//! figures are the server's.
//!
//! ```text
//! cargo bench --bench abuse -- logins    ADDR N USERNAME PASSWORD
//! cargo bench --bench abuse -- tokens    ADDR N
//! cargo bench --bench abuse -- slowloris ADDR SOCKETS SECS
//! ```
//! `logins` sends N logins at once (each from its own `X-Forwarded-For` address, for a chirp
//! that trusts 127.0.0.1) and reports the answers and their latency; `tokens` sends N requests
//! with random well-formed bearer tokens, 32 at a time; `slowloris` holds SOCKETS connections
//! that trickle a never-ending request head while one client reads `/livez` in a loop, and
//! reports `/livez`'s latency and how many of the sockets the server had closed by the end.
//! Each mode prints one `RESULT key=value …` line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One request on its own connection (`Connection: close`): its status (0 if the connection
/// failed) and latency in ms.
async fn request(addr: &str, head: String) -> (u16, f64) {
    let started = Instant::now();
    let status = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(head.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw);
        text.split(' ').nth(1)?.parse::<u16>().ok()
    }
    .await
    .unwrap_or(0);
    (status, started.elapsed().as_secs_f64() * 1000.0)
}

/// `n p50 p99 max` of latencies in ms (nearest rank).
fn percentiles(mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    let rank = |q: usize| ms[((q * ms.len()).div_ceil(100)).clamp(1, ms.len()) - 1];
    if ms.is_empty() {
        return "n=0".into();
    }
    format!(
        "n={} p50_ms={:.1} p99_ms={:.1} max_ms={:.1}",
        ms.len(),
        rank(50),
        rank(99),
        ms[ms.len() - 1]
    )
}

fn statuses(answers: &[(u16, f64)]) -> String {
    let mut by: BTreeMap<u16, usize> = BTreeMap::new();
    for (status, _) in answers {
        *by.entry(*status).or_default() += 1;
    }
    by.iter()
        .map(|(s, n)| format!("s{s}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn logins(addr: &str, n: usize, username: &str, password: &str) -> Result<(), Error> {
    let body = format!(r#"{{"username":"{username}","password":"{password}"}}"#);
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let head = format!(
                "POST /api/accounts/login/ HTTP/1.1\r\nHost: {addr}\r\n\
                 X-Forwarded-For: 10.{}.{}.{}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                (i >> 16) & 255,
                (i >> 8) & 255,
                i & 255,
                body.len()
            );
            let addr = addr.to_owned();
            tokio::spawn(async move { request(&addr, head).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(n);
    for task in tasks {
        answers.push(task.await?);
    }
    let ok: Vec<f64> = answers
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, ms)| *ms)
        .collect();
    println!(
        "RESULT mode=logins {} all_{} ok_{}",
        statuses(&answers),
        percentiles(answers.iter().map(|a| a.1).collect()),
        percentiles(ok)
    );
    Ok(())
}

async fn tokens(addr: &str, n: usize) -> Result<(), Error> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let started = Instant::now();
    let mut answers = Vec::with_capacity(n);
    let mut left = n;
    while left > 0 {
        let batch = left.min(32);
        left -= batch;
        let tasks: Vec<_> = (0..batch)
            .map(|_| {
                let token: String = (0..43)
                    .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
                    .collect();
                let head = format!(
                    "GET /api/newsfeeds/ HTTP/1.1\r\nHost: {addr}\r\n\
                     Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
                );
                let addr = addr.to_owned();
                tokio::spawn(async move { request(&addr, head).await })
            })
            .collect();
        for task in tasks {
            answers.push(task.await?);
        }
    }
    println!(
        "RESULT mode=tokens {} secs={:.1} {}",
        statuses(&answers),
        started.elapsed().as_secs_f64(),
        percentiles(answers.iter().map(|a| a.1).collect())
    );
    Ok(())
}

async fn slowloris(addr: &str, sockets: usize, secs: u64) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let holders: Vec<_> = (0..sockets)
        .map(|i| {
            let addr = addr.to_owned();
            tokio::spawn(async move {
                // true: the server closed it before the end.
                let Ok(mut s) = TcpStream::connect(&addr).await else {
                    return true;
                };
                if s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
                    .await
                    .is_err()
                {
                    return true;
                }
                let mut line = 0;
                while Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    line += 1;
                    if s.write_all(format!("X-Slow-{i}-{line}: 1\r\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return true;
                    }
                    let mut buf = [0u8; 512];
                    // A 408 or EOF from the server ends it.
                    if let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await
                    {
                        let _ = n;
                        return true;
                    }
                }
                false
            })
        })
        .collect();
    let mut probes = Vec::new();
    let mut failed = 0;
    while Instant::now() < deadline {
        let head = format!("GET /livez HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let (status, ms) = request(addr, head).await;
        if status == 200 {
            probes.push(ms);
        } else {
            failed += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut closed = 0;
    for holder in holders {
        if holder.await? {
            closed += 1;
        }
    }
    println!(
        "RESULT mode=slowloris sockets={sockets} closed_by_server={closed} livez_failed={failed} livez_{}",
        percentiles(probes)
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
    match arg(0).as_str() {
        "logins" => logins(&arg(1), num(2), &arg(3), &arg(4)).await,
        "tokens" => tokens(&arg(1), num(2)).await,
        "slowloris" => slowloris(&arg(1), num(2), num(3) as u64).await,
        _ => {
            eprintln!("usage: see benches/abuse.rs");
            Ok(())
        }
    }
}
