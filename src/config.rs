//! Command line and environment configuration (see the table in README.md and docs/API.md),
//! with the types of its values (rate-limit classes and rates, trusted proxies), so that the
//! configuration depends on no feature: `http::limits` and `http::client_ip` use them.

use std::net::{IpAddr, SocketAddr};

use clap::{Args, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;

use crate::cache::limits::Rate;

/// `chirp`: a Twitter-like API with cache-aside newsfeeds over Postgres and Redis.
#[derive(Debug, Parser)]
#[command(name = "chirp", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub config: Config,
}

/// What the process runs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply migrations, then serve the HTTP API and run the fan-out worker in-process.
    Serve,
    /// Run only the fan-out worker (scale out by starting more of these).
    Worker,
    /// Create the database if missing and apply migrations, then exit.
    Migrate,
    /// Load a SNAP-style follower graph and Twitter v1.1 JSON-lines tweets, and/or SNAP
    /// ego-Twitter circles as lists (plain or .gz).
    Import(ImportArgs),
    /// Post real tweets (Twitter v1.1 JSON lines, plain or .gz) live as imported accounts, at
    /// a steady rate, through the same code path as POST /api/tweets/ (drives the streams).
    Replay(ReplayArgs),
    /// Compare every cached list, object and counter with Postgres and list the differences
    /// (exit status 1 if any); see `chirp::check`.
    CheckCache,
    /// Print the API's OpenAPI 3.1 document (as `GET /api/openapi.json` serves it) and exit;
    /// needs neither Postgres nor Redis.
    Openapi,
}

/// Arguments of `chirp replay` (see `chirp::import::replay`).
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// Tweets as Twitter API v1.1 JSON, one object per line; repeat for several files.
    #[arg(long = "tweets", required = true)]
    pub tweets: Vec<std::path::PathBuf>,
    /// Tweets per second.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Stop after this many tweets (0: the whole file).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
}

/// Arguments of `chirp import` (see `chirp::import`).
#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// Edge list, one `A B` per line: A follows B (e.g. SNAP's twitter_combined.txt.gz).
    #[arg(long, requires = "tweets")]
    pub follows: Option<std::path::PathBuf>,
    /// Tweets as Twitter API v1.1 JSON, one object per line; repeat for several files.
    #[arg(long = "tweets", requires = "follows")]
    pub tweets: Vec<std::path::PathBuf>,
    /// SNAP ego-Twitter circles (`ego<TAB>name<TAB>member…` per line, e.g. circles.txt.gz):
    /// each becomes a list owned by the ego.
    #[arg(long, required_unless_present = "follows")]
    pub circles: Option<std::path::PathBuf>,
    /// Empty every chirp table first (in the same transaction as the import).
    #[arg(long)]
    pub reset: bool,
    /// Write `user_id<TAB>token` bearer tokens for a sample of imported accounts to this file.
    #[arg(long)]
    pub tokens_out: Option<std::path::PathBuf>,
    /// How many accounts get a token with --tokens-out (a seeded random sample of the accounts
    /// that follow someone).
    #[arg(long, default_value_t = 2000)]
    pub tokens: usize,
}

/// Whether Redis is used at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheMode {
    /// Cache-aside reads and write-through list updates in Redis.
    On,
    /// Serve everything from Postgres (the benchmark baseline); Redis is never contacted.
    Off,
}

/// Every setting, as a flag with an environment variable.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Postgres URL; the database is created if missing.
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/chirp"
    )]
    pub database_url: String,

    /// A Postgres streaming replica for reads that are never cached (followers, followings,
    /// comments), used only while it keeps up; see `chirp::replica`. Unset: everything reads
    /// the primary.
    #[arg(long, global = true, env = "DATABASE_REPLICA_URL")]
    pub database_replica_url: Option<String>,

    /// Redis URL.
    #[arg(
        long,
        global = true,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379/0"
    )]
    pub redis_url: String,

    /// Redis Cluster seed nodes, comma-separated (`redis://h1:7000,redis://h2:7001`); when set,
    /// chirp speaks to the cluster and ignores `REDIS_URL` (see docs/cluster.md).
    #[arg(
        long,
        global = true,
        env = "CHIRP_REDIS_CLUSTER",
        value_delimiter = ','
    )]
    pub redis_cluster: Vec<String>,

    /// Replicas that must acknowledge each cache write of a committed change (`WAIT`) before
    /// its outbox row is deleted, so a failover can not lose it. Default: 1 with
    /// `CHIRP_REDIS_CLUSTER`, 0 with a single Redis.
    #[arg(long, global = true, env = "CHIRP_REDIS_WAIT_REPLICAS",
          value_parser = clap::value_parser!(u32).range(0..=16))]
    pub redis_wait_replicas: Option<u32>,

    /// HTTP listen address.
    #[arg(
        long,
        global = true,
        env = "CHIRP_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,

    /// Prefix of every Redis key, so several deployments or tests can share one Redis; may not
    /// contain `{ } : * ? [ ] \` (checked when the cache is built).
    #[arg(
        long,
        global = true,
        env = "CHIRP_REDIS_PREFIX",
        default_value = "chirp"
    )]
    pub redis_prefix: String,

    /// Length cap (entries) of each cached Redis list (newsfeeds, user tweets).
    #[arg(long, global = true, env = "CHIRP_CACHE_LIST_LIMIT", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub cache_list_limit: u32,

    /// Background loads per process that grow a cold list to `CHIRP_CACHE_LIST_LIMIT` entries
    /// after its first page was answered from a page-sized load (0: a cold list keeps its
    /// first, page-sized window and grows only with new entries; older pages read Postgres).
    #[arg(long, global = true, env = "CHIRP_CACHE_EXTENSIONS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(0..=64))]
    pub cache_extensions: u32,

    /// TTL in seconds of cached lists and objects.
    #[arg(long, global = true, env = "CHIRP_CACHE_TTL_SECS", default_value_t = 604_800,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub cache_ttl_secs: u64,

    /// Seconds a process keeps a bearer token it has seen in memory (0: off). Revocation stays
    /// immediate across processes (see `cache::tokens`); this bounds only what a process that
    /// missed a revocation while frozen could still accept.
    #[arg(long, global = true, env = "CHIRP_TOKEN_CACHE_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub token_cache_secs: u64,

    /// Milliseconds of a process's lease on its memory (near caches and tokens; see
    /// `cache::lease`): memory answers only while a heartbeat heard on the pub/sub subscription
    /// less than this long ago says every eviction published before it arrived. Heartbeats go
    /// every third of it; a write waits at most this plus 50 ms for a process that neither
    /// acknowledges its eviction nor lets its lease run out. Shorter: faster writes under a
    /// stalled process; longer: fewer lapses on a busy one.
    #[arg(long, global = true, env = "CHIRP_NEAR_LEASE_MS", default_value_t = crate::cache::lease::DEFAULT_LENGTH_MS,
          value_parser = clap::value_parser!(u64).range(30..=10_000))]
    pub near_lease_ms: u64,

    /// Seconds a process keeps a tweet or user object it read from Redis in its own memory (its
    /// near cache; 0: off). A delete or profile change reaches every process before it
    /// answers; this bounds what a process that missed it (frozen, cut off) could still show.
    #[arg(long, global = true, env = "CHIRP_OBJECT_CACHE_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub object_cache_secs: u64,

    /// How many values (tweet and user objects, about 0.5 KB each; tweet counters, about 60
    /// bytes; timeline heads, about 0.2 KB; small liked sets) each process keeps in its near
    /// cache at most; 0 turns it off. `/healthz` counts the values it `missed`: a warm server
    /// that misses more than a few per hundred needs more.
    #[arg(long, global = true, env = "CHIRP_NEAR_CAPACITY", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub near_capacity: u64,

    /// Followers per fan-out batch (one set-based insert per batch).
    #[arg(long, global = true, env = "CHIRP_FANOUT_BATCH_SIZE", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub fanout_batch_size: u32,

    /// Parts a fan-out of more than one batch is cut into, to run side by side on the job
    /// runners (each part at least one batch and at most 8; a bigger account gets more parts).
    /// 1 runs fan-outs of up to 8 batches in one job.
    #[arg(long, global = true, env = "CHIRP_FANOUT_PARTS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub fanout_parts: u32,

    /// Fan-out jobs of small accounts (at most one batch of followers) one runner takes at
    /// once and writes in one transaction (see `newsfeeds::fanout_batch`); 1 runs each job
    /// alone.
    #[arg(long, global = true, env = "CHIRP_FANOUT_BATCH_JOBS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub fanout_batch_jobs: u32,

    /// Hybrid timelines: an author with more followers than this is not fanned out; readers
    /// pull the author's tweets into their newsfeed at read time (see `hybrid`).
    #[arg(
        long,
        global = true,
        env = "CHIRP_FANOUT_PULL_ABOVE",
        default_value_t = 10_000
    )]
    pub fanout_pull_above: u64,

    /// Hysteresis of the hybrid timelines: a pulled author is fanned out again only once its
    /// followers drop below this (default: 90% of `CHIRP_FANOUT_PULL_ABOVE`).
    #[arg(long, global = true, env = "CHIRP_FANOUT_PULL_BELOW")]
    pub fanout_pull_below: Option<u64>,

    /// How long (ms) an author who crossed `CHIRP_FANOUT_PULL_ABOVE` stays fanned out before its
    /// tweets are pulled: every process re-reads the set of pulled authors at least twice in
    /// this time, so none reads a newsfeed without a pulled tweet it shows later.
    #[arg(long, global = true, env = "CHIRP_FANOUT_PULL_SETTLE_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub fanout_pull_settle_ms: u64,

    /// Compose back-pressure: while the oldest fan-out job no runner has taken yet waited
    /// longer than this many ms, `POST /api/tweets/` answers 503 with `Retry-After` instead
    /// of accepting a tweet its followers would see late (see `jobs::Backlog`); 0 turns it
    /// off.
    #[arg(long, global = true, env = "CHIRP_FANOUT_MAX_WAIT_MS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub fanout_max_wait_ms: u64,

    /// `off` serves everything from Postgres (baseline for benchmarks).
    #[arg(long, global = true, env = "CHIRP_CACHE", value_enum, default_value_t = CacheMode::On)]
    pub cache: CacheMode,

    /// Timeout in milliseconds of one Redis round trip; past it the request falls back to Postgres.
    #[arg(
        long,
        global = true,
        env = "CHIRP_REDIS_TIMEOUT_MS",
        default_value_t = 200
    )]
    pub redis_timeout_ms: u64,

    /// Concurrent job runners in each worker (in `serve` and in `worker`); 0 in `serve` leaves
    /// every job to separate `chirp worker` processes (a `worker` runs at least one).
    #[arg(long, global = true, env = "CHIRP_WORKERS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(0..=64))]
    pub workers: u32,

    /// Origins allowed to call the API from a browser (CORS), comma-separated, e.g.
    /// `https://app.example.com,http://localhost:5173`; none by default (no CORS headers).
    #[arg(long, global = true, env = "CHIRP_CORS_ORIGINS", value_delimiter = ',',
          value_parser = parse_origin)]
    pub cors_origins: Vec<String>,

    /// Rate limits: `on` (the defaults of docs/API.md), `off`, or rules like
    /// `auth=3/s;tweet=1/s,5/m;write=10/s;read=50/s` (classes not named keep their defaults).
    #[arg(long, global = true, env = "CHIRP_RATE_LIMITS", default_value = "on",
          value_parser = RateLimits::parse)]
    pub rate_limits: RateLimits,

    /// Milliseconds a connection may take to send a request's head, counted from when it
    /// starts waiting for one (so also how long a keep-alive connection may sit idle); past it
    /// the connection is closed (slowloris clients hold nothing for long).
    #[arg(long, global = true, env = "CHIRP_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub header_read_timeout_ms: u64,

    /// Proxies (load balancers) whose `Forwarded`/`X-Forwarded-For` headers name the client,
    /// comma-separated addresses or CIDR networks (`10.0.0.0/8,::1`); none by default (the TCP
    /// peer is the client). Rate limits count per client, so behind a proxy set this.
    #[arg(long, global = true, env = "CHIRP_TRUSTED_PROXIES", default_value = "",
          value_parser = TrustedProxies::parse)]
    pub trusted_proxies: TrustedProxies,

    /// The header the trusted proxies write the client's address in: `x-forwarded-for`
    /// (HAProxy, nginx, AWS ALB) or `forwarded` (RFC 7239). Only this one is read: a proxy
    /// passes the other through as the client sent it.
    #[arg(long, global = true, env = "CHIRP_FORWARDED_HEADER", value_enum,
          default_value_t = ForwardedHeader::XForwardedFor)]
    pub forwarded_header: ForwardedHeader,

    /// Where photos and avatars are stored: a local directory, or `s3://bucket[/prefix]` for an
    /// S3-compatible store (configured by the usual `AWS_*` variables).
    #[arg(
        long,
        global = true,
        env = "CHIRP_MEDIA_STORE",
        default_value = ".local/media"
    )]
    pub media_store: String,

    /// Absolute URL prefix of media URLs (e.g. `https://api.example.com`); unset, they are
    /// root-relative (`/media/...`).
    #[arg(long, global = true, env = "CHIRP_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Messages of each active chat channel that Redis keeps (the cleanup trims to this).
    #[arg(long, global = true, env = "CHIRP_CHAT_BACKLOG", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub chat_backlog: u32,

    /// A chat channel without a message for this many seconds leaves Redis (cleanup).
    #[arg(long, global = true, env = "CHIRP_CHAT_IDLE_SECS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub chat_idle_secs: u64,

    /// Most concurrent streams (`/api/streaming/...`) of one user, across processes; one more
    /// is a 429.
    #[arg(long, global = true, env = "CHIRP_STREAMS_PER_USER", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub streams_per_user: u32,

    /// Events a stream may have queued for its client; a client that lets more pile up is
    /// sent FALLING_BEHIND and disconnected. Bounds a stream's memory.
    #[arg(long, global = true, env = "CHIRP_STREAM_BUFFER", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub stream_buffer: u32,

    /// Seconds between a stream's heartbeat comments (at most 15).
    #[arg(long, global = true, env = "CHIRP_STREAM_HEARTBEAT_SECS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=15))]
    pub stream_heartbeat_secs: u64,

    /// Maximum Postgres connections of this process; unset, [`Config::db_pool_size`] sizes the
    /// pool from this machine's cores.
    #[arg(long, global = true, env = "CHIRP_DB_MAX_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(2..=1_000))]
    pub db_max_connections: Option<u32>,
}

/// An origin for CORS: `http(s)://host[:port]`, usable as a header value.
fn parse_origin(raw: &str) -> Result<String, String> {
    let origin = raw.trim().trim_end_matches('/');
    let valid = (origin.starts_with("http://") || origin.starts_with("https://"))
        && axum::http::HeaderValue::from_str(origin).is_ok()
        && !origin["https://".len().min(origin.len())..].contains('/');
    if valid {
        Ok(origin.to_owned())
    } else {
        Err(format!(
            "{raw:?} is not an origin like https://app.example.com"
        ))
    }
}

impl Config {
    /// The Postgres pool's size (connections of this process; the replica's pool is as large):
    /// `CHIRP_DB_MAX_CONNECTIONS` if set, else HikariCP's rule of thumb ("About Pool Sizing":
    /// two connections per core and one more), counted in this machine's cores, plus what the
    /// background work holds: the job listener's connection and one per job runner
    /// (`CHIRP_WORKERS`). 8 on a 2-core machine with the default 2 runners, 20 on 8 cores.
    ///
    /// More connections than the cores can run make a burst slower, not faster: on 2 cores a
    /// burst of returning readers' first pages was served 19 % faster with 8 than with 20, each
    /// costing Postgres less CPU (decision 0040).
    pub fn db_pool_size(&self) -> u32 {
        self.db_max_connections.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
            let cores = u32::try_from(cores).unwrap_or(u32::MAX).min(256);
            2 * cores + 1 + 1 + self.workers
        })
    }

    /// Defaults for everything, as if no flag or variable were set (used by tests and tools).
    pub fn defaults() -> Self {
        // An empty argument list can not fail to parse: every field has a default.
        match Cli::try_parse_from(["chirp", "migrate"]) {
            Ok(cli) => cli.config,
            Err(e) => unreachable!("defaults must parse: {e}"),
        }
    }
}

/// What a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Signup and login, per client IP.
    Auth,
    /// Posting a tweet.
    Tweet,
    /// Every other write (likes, comments, follows, ...).
    Write,
    /// Reads.
    Read,
    /// Failed authentications (a malformed, unknown or revoked bearer token), per client IP;
    /// over it, a token neither the process's memory nor Redis holds is refused before any
    /// Postgres lookup (`http::limits::standing`).
    Failed,
    /// Failed logins per username, from any address (a password guesser spread over many);
    /// over it, that username's logins are refused before the password is hashed
    /// (`http::limits::login_refused`).
    Login,
}

impl Class {
    const ALL: [Class; 6] = [
        Class::Auth,
        Class::Tweet,
        Class::Write,
        Class::Read,
        Class::Failed,
        Class::Login,
    ];

    /// The class's name in `CHIRP_RATE_LIMITS` and in the limiter's Redis keys.
    pub fn name(self) -> &'static str {
        match self {
            Class::Auth => "auth",
            Class::Tweet => "tweet",
            Class::Write => "write",
            Class::Read => "read",
            Class::Failed => "failed",
            Class::Login => "login",
        }
    }
}

/// The configured limits (`CHIRP_RATE_LIMITS`): per class, the rates a request must fit in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimits {
    rules: Vec<(Class, Vec<Rate>)>,
}

impl RateLimits {
    /// The defaults of docs/API.md: auth 3/s, tweet 1/s and 5/min, write 10/s, read 50/s,
    /// failed authentications 10/s and 100/min, failed logins of one username 5/min and 30/h.
    pub fn defaults() -> Self {
        let per = |count, secs: u64| Rate {
            count,
            period_us: secs * 1_000_000,
        };
        RateLimits {
            rules: vec![
                (Class::Auth, vec![per(3, 1)]),
                (Class::Tweet, vec![per(1, 1), per(5, 60)]),
                (Class::Write, vec![per(10, 1)]),
                (Class::Read, vec![per(50, 1)]),
                (Class::Failed, vec![per(10, 1), per(100, 60)]),
                (Class::Login, vec![per(5, 60), per(30, 3600)]),
            ],
        }
    }

    /// No limits.
    pub fn off() -> Self {
        RateLimits { rules: Vec::new() }
    }

    /// Parses `on`, `off`, or `class=N/unit[,N/unit];...` (unit `s`, `m` or `h`; classes
    /// `auth`, `tweet`, `write`, `read`, `failed`, `login`; a class not named keeps its default, `class=off`
    /// lifts it).
    ///
    /// # Errors
    /// A message naming what did not parse.
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw.trim() {
            "on" | "" => return Ok(Self::defaults()),
            "off" => return Ok(Self::off()),
            _ => {}
        }
        let mut limits = Self::defaults();
        for rule in raw.split(';').map(str::trim).filter(|r| !r.is_empty()) {
            let (name, rates) = rule
                .split_once('=')
                .ok_or_else(|| format!("{rule:?}: expected class=N/unit"))?;
            let class = Class::ALL
                .into_iter()
                .find(|c| c.name() == name.trim())
                .ok_or_else(|| {
                    format!("{name:?}: expected auth, tweet, write, read, failed or login")
                })?;
            let rates = if rates.trim() == "off" {
                Vec::new()
            } else {
                rates
                    .split(',')
                    .map(|r| parse_rate(r.trim()))
                    .collect::<Result<Vec<_>, _>>()?
            };
            limits.rules.retain(|(c, _)| *c != class);
            if !rates.is_empty() {
                limits.rules.push((class, rates));
            }
        }
        Ok(limits)
    }

    /// The rates of `class`, if it is limited.
    pub fn rates(&self, class: Class) -> Option<&[Rate]> {
        self.rules
            .iter()
            .find(|(c, _)| *c == class)
            .map(|(_, r)| r.as_slice())
    }

    /// Whether any limit is on.
    pub fn enabled(&self) -> bool {
        !self.rules.is_empty()
    }
}

fn parse_rate(raw: &str) -> Result<Rate, String> {
    let (count, unit) = raw
        .split_once('/')
        .ok_or_else(|| format!("{raw:?}: expected N/s, N/m or N/h"))?;
    let count: u32 = count
        .trim()
        .parse()
        .ok()
        .filter(|c| *c > 0)
        .ok_or_else(|| format!("{raw:?}: expected a positive count"))?;
    let secs = match unit.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("{raw:?}: the unit is s, m or h")),
    };
    Ok(Rate {
        count,
        period_us: secs * 1_000_000,
    })
}

/// The proxies whose forwarding headers are believed: addresses or CIDR networks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses a comma-separated list of addresses (`10.0.0.5`, `::1`) and networks
    /// (`10.0.0.0/8`, `fd00::/8`); empty trusts nobody.
    ///
    /// # Errors
    /// A message naming the entry that is neither.
    pub fn parse(raw: &str) -> Result<Self, String> {
        raw.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|entry| {
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("{entry:?}: expected an IP address or a CIDR network"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(TrustedProxies)
    }

    /// Whether `ip` is one of the proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&ip))
    }
}

/// The header a trusted proxy writes the client's address in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, …` (HAProxy `option forwardfor`, nginx, AWS ALB).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_is_sized_from_the_cores_unless_set() {
        let mut config = Config::defaults();
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        assert_eq!(config.db_pool_size() as usize, 2 * cores + 2 + 2);
        config.workers = 5;
        assert_eq!(config.db_pool_size() as usize, 2 * cores + 2 + 5);
        config.db_max_connections = Some(3);
        assert_eq!(config.db_pool_size(), 3);
        let one = Cli::try_parse_from(["chirp", "--db-max-connections", "1", "migrate"]);
        assert!(
            one.is_err(),
            "a pool of one connection is refused (the listener holds one)"
        );
    }

    #[test]
    fn limits_parse_from_the_configuration_syntax() {
        assert_eq!(RateLimits::parse("on"), Ok(RateLimits::defaults()));
        assert!(!RateLimits::parse("off").unwrap().enabled());
        let custom = RateLimits::parse("tweet=2/s,10/m; read=off").unwrap();
        assert_eq!(custom.rates(Class::Tweet).map(<[Rate]>::len), Some(2));
        assert_eq!(custom.rates(Class::Read), None);
        assert_eq!(
            custom.rates(Class::Auth),
            RateLimits::defaults().rates(Class::Auth)
        );
        assert!(RateLimits::parse("tweet=0/s").is_err());
        assert!(RateLimits::parse("nope=1/s").is_err());
        assert!(RateLimits::parse("read=5/d").is_err());
    }
}
