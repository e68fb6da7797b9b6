//! Postgres helpers shared by the features: connecting, migrating, error classification.

use std::time::Duration;

use anyhow::Context;
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

use crate::config::Config;

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Creates the database named in `DATABASE_URL` if it is missing, then applies migrations.
pub async fn migrate(config: &Config) -> anyhow::Result<PgPool> {
    let url = config.database_url.as_str();
    if !Postgres::database_exists(url)
        .await
        .context("connecting to Postgres at DATABASE_URL")?
    {
        tracing::info!("creating database");
        Postgres::create_database(url)
            .await
            .context("creating the database")?;
    }
    let db = connect(config).await?;
    MIGRATOR.run(&db).await.context("applying migrations")?;
    Ok(db)
}

/// A connection idle for less than this is handed out without a liveness round trip
/// ([`pool_options`]); HikariCP's `aliveBypassWindowMs` (500 ms by default) is the same rule.
pub const ALIVE_BYPASS: Duration = Duration::from_millis(500);

/// Pool settings shared by the primary's and the replica's pools: `max` connections, and a
/// liveness check (sqlx's ping: a `Sync` and its `ReadyForQuery`, one round trip) before a
/// connection is handed out only if it lay idle for [`ALIVE_BYPASS`] or longer (sqlx's
/// documented `before_acquire` example; its issue 1743). By default sqlx pings every
/// connection it hands out (`test_before_acquire`): one more round trip on the answer's path
/// for every query outside a transaction, three on a returning reader's first page (its
/// token, its page, its liked set; decision 0034). sqlx still pings each connection it takes
/// back (after the answer) and drops one that fails, so a connection whose socket died is
/// not handed out again; one that died while idle for less than [`ALIVE_BYPASS`] fails its
/// next statement, as a statement on a connection that dies while in use does.
pub fn pool_options(max: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for < ALIVE_BYPASS {
                    return Ok(true);
                }
                Ok(sqlx::Connection::ping(conn).await.is_ok())
            })
        })
}

/// A connection pool of [`Config::db_pool_size`] connections ([`pool_options`]).
pub async fn connect(config: &Config) -> anyhow::Result<PgPool> {
    pool_options(config.db_pool_size())
        .acquire_timeout(Duration::from_secs(5))
        .connect(&config.database_url)
        .await
        .context("connecting to Postgres at DATABASE_URL")
}

/// Whether `e` is a unique violation of `constraint`.
pub fn violates(e: &sqlx::Error, constraint: &str) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.constraint() == Some(constraint))
}

/// Runs `insert` with fresh unique timestamps until it does not collide with a row another
/// process stamped in the same microsecond (see `crate::time`): a unique violation of any of
/// `constraints` is retried. Gives up after 8 tries.
pub async fn with_unique_timestamp<T, F, Fut>(
    constraints: &[&str],
    mut insert: F,
) -> sqlx::Result<T>
where
    F: FnMut(crate::time::Timestamp) -> Fut,
    Fut: Future<Output = sqlx::Result<T>>,
{
    let mut tries = 0;
    loop {
        match insert(crate::time::next_timestamp()).await {
            Err(e) if tries < 8 && constraints.iter().any(|c| violates(&e, c)) => tries += 1,
            other => return other,
        }
    }
}
