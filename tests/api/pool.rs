//! The Postgres pool's liveness checks (`chirp::db::pool_options`): a connection used moments
//! ago is handed out as it is, one that lay idle is checked first and replaced if it died.

use std::time::Duration;

use chirp::db::{ALIVE_BYPASS, pool_options};
use sqlx::PgPool;

/// When the backend `pid` last changed state: Postgres reports it idle again after every
/// round trip, a bare `Sync` (sqlx's ping) included.
async fn state_change(db: &PgPool, pid: i32) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("select state_change from pg_stat_activity where pid = $1")
        .bind(pid)
        .fetch_one(db)
        .await
        .expect("pg_stat_activity")
}

/// A pool of one connection to `db`'s database with chirp's settings, and its backend's pid.
async fn one_connection(db: &PgPool) -> (PgPool, i32) {
    let pool = pool_options(1)
        .connect_with((*db.connect_options()).clone())
        .await
        .expect("pool");
    let pid = sqlx::query_scalar("select pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("pid");
    (pool, pid)
}

/// Decision 0034: sqlx pinged every connection it handed out (`test_before_acquire`), one
/// more round trip for each query outside a transaction; a returning reader's first page made
/// three. A connection idle for less than [`ALIVE_BYPASS`] now goes out without one.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_connection_used_moments_ago_is_handed_out_without_a_round_trip(db: PgPool) {
    let (pool, pid) = one_connection(&db).await;
    // sqlx pings a connection it takes back (a task spawned on release): wait until it is idle.
    for _ in 0..200 {
        if pool.num_idle() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(pool.num_idle(), 1, "the connection was taken back");
    let before = state_change(&db, pid).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let conn = pool.acquire().await.expect("acquire");
    assert_eq!(
        state_change(&db, pid).await,
        before,
        "the connection made a round trip before it was handed out"
    );
    drop(conn);
}

/// The check kept: a connection that died while it lay idle for [`ALIVE_BYPASS`] or longer is
/// found dead before it is handed out, and the query runs on a new one.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_connection_that_died_while_idle_is_replaced_before_a_query_uses_it(db: PgPool) {
    let (pool, pid) = one_connection(&db).await;
    let killed: bool = sqlx::query_scalar("select pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&db)
        .await
        .expect("terminate");
    assert!(killed);
    tokio::time::sleep(ALIVE_BYPASS + Duration::from_millis(100)).await;
    let other: i32 = sqlx::query_scalar("select pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("a query after the connection died while idle");
    assert_ne!(other, pid);
}

/// A request never holds one pooled connection while it waits for another: with every request
/// sharing one connection, adding a list member (which read whether the user exists on a second
/// connection while its transaction held the first) answers instead of waiting out the pool's
/// acquire timeout and failing. A smaller pool (decision 0040) makes such a wait likelier, and
/// at any size as many concurrent requests of one kind as the pool has connections would each
/// hold one and all wait out the timeout.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_request_never_waits_for_a_second_connection_while_it_holds_one(db: PgPool) {
    let pool = pool_options(1)
        .acquire_timeout(Duration::from_secs(3))
        .connect_with((*db.connect_options()).clone())
        .await
        .expect("pool");
    let app = crate::helpers::TestApp::new(pool).await;
    let (_, owner) = app.quick_user("pool_owner").await;
    let (member, _) = app.quick_user("pool_member").await;
    let list = app.new_list(&owner, "pool").await;
    let added = app.add_to_list(&owner, list, member).await;
    assert_eq!(added["user"]["id"].as_i64(), Some(member), "{added}");
}
