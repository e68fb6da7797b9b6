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

/// A connection pool sized by `CHIRP_DB_MAX_CONNECTIONS`.
pub async fn connect(config: &Config) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(config.db_max_connections)
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
