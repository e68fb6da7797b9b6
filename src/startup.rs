//! Building and running the processes: `serve`, `worker`, `migrate`.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

use crate::cache::{epoch, outbox};
use crate::config::{CacheMode, Cli, Command, Config};
use crate::http;
use crate::state::AppState;
use crate::{chat, db};

/// How long a shutdown waits for open connections (a stream whose client stopped reading)
/// before it closes them.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The API server: a bound listener and its state.
pub struct Application {
    listener: TcpListener,
    state: AppState,
}

impl Application {
    /// Creates the database if missing, migrates it, and binds `CHIRP_LISTEN` (port 0 picks a
    /// free port).
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let db = db::migrate(&config).await?;
        forget_epoch_if_off(&db, &config).await?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let state = AppState::new(db, config)?;
        Ok(Application { listener, state })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` resolves, with the fan-out worker and the cache monitor running
    /// in-process; in-flight requests and jobs finish before it returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let state = self.state;
        let (stop, stopped) = watch::channel(false);
        let monitor = tokio::spawn(outbox::monitor(
            state.cache.clone(),
            state.db.clone(),
            stopped.clone(),
        ));
        let cleanup = tokio::spawn(chat::cleanup_loop(state.chat.clone(), stopped.clone()));
        let replica = tokio::spawn(crate::replica::monitor(
            state.replica.clone(),
            state.db.clone(),
            stopped.clone(),
        ));
        let backlog = tokio::spawn(
            state
                .backlog
                .clone()
                .watch(state.db.clone(), stopped.clone()),
        );
        let worker = tokio::spawn(
            state
                .worker
                .clone()
                .run(state.config.workers as usize, stopped),
        );
        if state.config.workers > 0 {
            // Wake-ups from writers in other processes (the `jobs` topic).
            state
                .subscriber
                .start(&state.cache, &state.shutdown.subscribe());
        }
        tracing::info!(addr = %self.listener.local_addr()?, cache = ?state.config.cache, "chirp serving");
        let shutdown_chat = state.shutdown.clone();
        let cache = state.cache.clone();
        let limits = http::serve::Limits {
            header_read_timeout: std::time::Duration::from_millis(
                state.config.header_read_timeout_ms,
            ),
        };
        let app = http::app(state);
        let (signaled, mut on_signal) = watch::channel(false);
        let serve = http::serve::serve(self.listener, app, limits, async move {
            shutdown.await;
            tracing::info!("shutting down: finishing requests and jobs");
            let _ = stop.send(true);
            let _ = shutdown_chat.send(true);
            let _ = signaled.send(true);
        });
        // Streams end at the signal, but a client that stopped reading keeps its connection
        // (and graceful shutdown) open: past the grace period, the rest are closed.
        let grace = async move {
            if on_signal.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        tokio::select! {
            served = serve => served.context("serving HTTP")?,
            () = grace => tracing::warn!(
                ?SHUTDOWN_GRACE,
                "connections still open after the grace period; closing them"
            ),
        }
        let _ = worker.await;
        let _ = monitor.await;
        let _ = cleanup.await;
        let _ = replica.await;
        let _ = backlog.await;
        forget_applied_rows(&cache).await;
        Ok(())
    }
}

/// Runs only the job worker (and the cache monitor) until `shutdown`.
pub async fn run_worker(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let db = db::migrate(&config).await?;
    forget_epoch_if_off(&db, &config).await?;
    let state = AppState::new(db, config)?;
    let (stop, stopped) = watch::channel(false);
    let monitor = tokio::spawn(outbox::monitor(
        state.cache.clone(),
        state.db.clone(),
        stopped.clone(),
    ));
    let cleanup = tokio::spawn(chat::cleanup_loop(state.chat.clone(), stopped.clone()));
    let worker = tokio::spawn(
        state
            .worker
            .clone()
            .run(state.config.workers.max(1) as usize, stopped),
    );
    // Wake-ups from writers in other processes (the `jobs` topic).
    state
        .subscriber
        .start(&state.cache, &state.shutdown.subscribe());
    tracing::info!(
        runners = state.config.workers.max(1),
        "chirp worker running"
    );
    shutdown.await;
    tracing::info!("shutting down: finishing jobs");
    let _ = stop.send(true);
    let _ = state.shutdown.send(true);
    let _ = worker.await;
    let _ = monitor.await;
    let _ = cleanup.await;
    forget_applied_rows(&state.cache).await;
    Ok(())
}

/// At shutdown, after the last write: the deletes of its applied outbox rows, for at most a
/// second (a row left behind is relayed by another process, harmlessly, only later).
async fn forget_applied_rows(cache: &crate::cache::Cache) {
    let waited = tokio::time::timeout(std::time::Duration::from_secs(1), cache.forgotten());
    if waited.await.is_err() {
        tracing::warn!("applied outbox rows left for the relay at shutdown");
    }
}

/// With `CHIRP_CACHE=off` this process writes around Redis: make the next process that uses
/// Redis clear it first (see `cache::epoch`).
pub async fn forget_epoch_if_off(db: &sqlx::PgPool, config: &Config) -> anyhow::Result<()> {
    if config.cache == CacheMode::Off {
        epoch::forget(db, &config.redis_prefix)
            .await
            .context("forgetting the cache epoch")?;
    }
    Ok(())
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

/// The `chirp` command.
pub async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Migrate => {
            db::migrate(&cli.config).await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Command::Serve => {
            Application::build(cli.config)
                .await?
                .run(shutdown_signal())
                .await
        }
        Command::Openapi => {
            println!("{}", crate::http::openapi::document().to_pretty_json()?);
            Ok(())
        }
        Command::Worker => run_worker(cli.config, shutdown_signal()).await,
        Command::Replay(args) => {
            if !(args.rate > 0.0 && args.rate.is_finite()) {
                anyhow::bail!("--rate must be a positive number of tweets per second");
            }
            let db = db::migrate(&cli.config).await?;
            let cache = crate::cache::Cache::new(&cli.config)?;
            if cache.enabled() {
                crate::cache::outbox::recover(&cache, &db).await;
            }
            let pull = crate::hybrid::PullPolicy::from_config(&cli.config);
            let done = crate::import::replay::run(&db, &cache, &pull, &args).await?;
            println!("{done}");
            Ok(())
        }
        Command::CheckCache => {
            let db = db::migrate(&cli.config).await?;
            let cache = crate::cache::Cache::new(&cli.config)?;
            let report = crate::check::run(&db, &cache).await?;
            println!("{report}");
            if !report.differences.is_empty() {
                anyhow::bail!("the cache differs from Postgres");
            }
            Ok(())
        }
        Command::Import(args) => {
            let db = db::migrate(&cli.config).await?;
            let summary = crate::import::run(&db, &args).await?;
            println!("{summary}");
            // The import wrote around the cache: whatever Redis holds for this deployment is
            // cleared by the next process that uses it, and now if Redis answers.
            epoch::forget(&db, &cli.config.redis_prefix)
                .await
                .context("forgetting the cache epoch")?;
            match crate::cache::Cache::new(&cli.config)?.clear().await {
                Ok(n) => println!(
                    "cache: {n} keys under '{}' dropped",
                    cli.config.redis_prefix
                ),
                Err(_) => println!(
                    "cache: Redis not reachable; the next chirp process clears '{}:*' first",
                    cli.config.redis_prefix
                ),
            }
            Ok(())
        }
    }
}
