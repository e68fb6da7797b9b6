//! Fan-out-on-write through the durable job table.

use chirp::jobs::Job;
use chirp::timeline::Timeline;
use sqlx::PgPool;

use crate::helpers::{
    TestApp, cached_feed_tweets, eventually, member_tweet, rows_scanned, tweet_ids, two_processes,
};

async fn followers(app: &TestApp, star: i64, n: usize) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    for i in 0..n {
        let (id, token) = app.signup(&format!("fan{i}")).await;
        app.follow(&token, star).await;
        out.push((id, token));
    }
    app.drain().await;
    out
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_reaches_more_followers_than_one_batch(db: PgPool) {
    // One part: this test is about the batches of one job.
    let app = TestApp::with(db, |c| {
        c.fanout_batch_size = 3;
        c.fanout_parts = 1;
    })
    .await;
    let (star, ts) = app.signup("star").await;
    let fans = followers(&app, star, 10).await;
    // Four fans have cached (empty) newsfeeds.
    for (_, token) in &fans[..4] {
        assert_eq!(
            tweet_ids(&app.get("/api/newsfeeds/", Some(token)).await.body),
            Vec::<i64>::new()
        );
    }
    let id = app.tweet(&ts, "to everyone").await["id"].as_i64().unwrap();
    assert_eq!(app.drain().await, 1, "one fan-out job");
    let rows: i64 = sqlx::query_scalar("select count(*) from newsfeeds where tweet_id = $1")
        .bind(id)
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(rows, 11, "10 followers and the author");
    for (i, (fan, token)) in fans.iter().enumerate() {
        let cached = app.cached_members(Timeline::Newsfeed(*fan)).await;
        if i < 4 {
            let members = cached.expect("still cached");
            assert_eq!(member_tweet(&members[0]), id, "{members:?}");
        } else {
            assert_eq!(
                cached, None,
                "no partial list is created for uncached feeds"
            );
        }
        assert_eq!(
            tweet_ids(&app.get("/api/newsfeeds/", Some(token)).await.body),
            vec![id]
        );
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_crashed_workers_job_is_reclaimed_and_finished_without_duplicates(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.fanout_batch_size = 2;
        c.fanout_parts = 1;
    })
    .await;
    let (star, ts) = app.signup("star").await;
    let fans = followers(&app, star, 5).await;
    for (_, token) in &fans {
        app.get("/api/newsfeeds/", Some(token)).await; // cache every feed
    }
    let id = app.tweet(&ts, "survives a crash").await["id"]
        .as_i64()
        .unwrap();

    // A worker claims the job, commits its first batch, and dies before recording progress or
    // updating Redis: the rows exist, the cached lists lack them, the lease is held.
    let (claim, job) = app.state.worker.claim().await.unwrap().expect("job");
    assert!(matches!(job, Ok(Job::Fanout { .. })), "{job:?}");
    sqlx::query(
        "insert into newsfeeds (user_id, tweet_id, created_at)
         select f.from_user_id, t.id, t.created_at from tweets t
         join (select from_user_id from friendships where to_user_id = $2 order by created_at limit 2) f on true
         where t.id = $1",
    )
    .bind(id)
    .bind(star)
    .execute(app.db())
    .await
    .unwrap();

    // While the lease holds, nobody else takes the job.
    assert_eq!(app.drain().await, 0);
    sqlx::query("update jobs set locked_until = now() - interval '1 second' where id = $1")
        .bind(claim.id)
        .execute(app.db())
        .await
        .unwrap();
    assert_eq!(app.drain().await, 1, "the expired lease is re-claimed");

    let (rows, distinct): (i64, i64) = sqlx::query_as(
        "select count(*), count(distinct user_id) from newsfeeds where tweet_id = $1",
    )
    .bind(id)
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!((rows, distinct), (6, 6));
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(jobs, 0);
    for (fan, token) in &fans {
        let members = app
            .cached_members(Timeline::Newsfeed(*fan))
            .await
            .expect("cached");
        let hits = members.iter().filter(|m| member_tweet(m) == id).count();
        assert_eq!(hits, 1, "exactly one cached entry: {members:?}");
        assert_eq!(
            tweet_ids(&app.get("/api/newsfeeds/", Some(token)).await.body),
            vec![id]
        );
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_failing_job_is_retried_later_and_parked_after_too_many_attempts(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, _) = app.signup("alice").await;
    sqlx::query("insert into jobs (kind, follower_id, followee_id) values ('backfill', $1, $1)")
        .bind(alice)
        .execute(app.db())
        .await
        .unwrap();
    // A job that errors: the table it reads is gone.
    sqlx::query("alter table friendships rename to friendships_gone")
        .execute(app.db())
        .await
        .unwrap();
    assert_eq!(app.drain().await, 1);
    let (attempts, error, later): (i32, Option<String>, bool) =
        sqlx::query_as("select attempts, last_error, run_after > now() from jobs")
            .fetch_one(app.db())
            .await
            .unwrap();
    assert_eq!(attempts, 1);
    assert!(error.unwrap().contains("friendships"));
    assert!(later, "backed off");
    sqlx::query("update jobs set attempts = $1, run_after = now()")
        .bind(chirp::jobs::MAX_ATTEMPTS)
        .execute(app.db())
        .await
        .unwrap();
    assert_eq!(app.drain().await, 1);
    let parked: bool = sqlx::query_scalar("select failed_at is not null from jobs")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert!(parked);
    sqlx::query("update jobs set run_after = now()")
        .execute(app.db())
        .await
        .unwrap();
    assert_eq!(app.drain().await, 0, "a parked job is not run again");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_job_row_that_does_not_parse_is_parked_at_once(db: PgPool) {
    let app = TestApp::new(db).await;
    sqlx::query("insert into jobs (kind) values ('backfill')")
        .execute(app.db())
        .await
        .unwrap();
    assert_eq!(app.drain().await, 1);
    let (attempts, error, parked): (i32, Option<String>, bool) =
        sqlx::query_as("select attempts, last_error, failed_at is not null from jobs")
            .fetch_one(app.db())
            .await
            .unwrap();
    assert_eq!(attempts, 1);
    assert!(error.unwrap().contains("without its users"));
    assert!(parked);
    assert_eq!(app.drain().await, 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_write_wakes_other_workers_through_redis_and_never_notifies_inside_its_transaction(
    db: PgPool,
) {
    use futures_util::StreamExt;
    let app = TestApp::new(db.clone()).await;
    let (_, token) = app.signup("poster").await;
    let mut pubsub = app.subscribe(chirp::jobs::TOPIC).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db).await.unwrap();
    listener.listen(chirp::jobs::CHANNEL).await.unwrap();

    app.tweet(&token, "wake up").await;
    let heard = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        pubsub.on_message().next(),
    )
    .await;
    assert!(matches!(heard, Ok(Some(_))), "no wake-up on the jobs topic");
    // Postgres serialises the commits of notifying transactions: none is sent.
    let notified =
        tokio::time::timeout(std::time::Duration::from_millis(300), listener.recv()).await;
    assert!(notified.is_err(), "a pg_notify was sent: {notified:?}");
}

/// A write wakes its own process's runners once, in-process; its announcement on the `jobs`
/// topic wakes the other processes' runners and not its own again (before, every post made a
/// second runner of its own process claim in vain, beside the post's answer).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_announcement_wakes_the_other_processes_and_not_its_own_twice(db: PgPool) {
    use std::time::Duration;
    let (a, b) = two_processes(db).await;
    for app in [&a, &b] {
        let stop = app.state.shutdown.subscribe();
        app.state.subscriber.start(&app.state.cache, &stop);
    }
    let (wa, wb) = (a.state.worker.wake.clone(), b.state.worker.wake.clone());
    let heard = async |wake: &std::sync::Arc<tokio::sync::Notify>, ms: u64| {
        tokio::time::timeout(Duration::from_millis(ms), wake.notified())
            .await
            .is_ok()
    };
    // Both subscribed: an announcement of a process without runners (`chirp replay`) wakes both.
    eventually("both processes subscribed", async || {
        chirp::jobs::wake_others(&a.state.cache, a.db(), "").await;
        heard(&wa, 200).await && heard(&wb, 200).await
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    while heard(&wa, 50).await || heard(&wb, 50).await {} // stale wake-ups of earlier tries

    a.state.worker.announce();
    assert!(
        heard(&wa, 1000).await,
        "the announcing process's runners were not woken"
    );
    assert!(
        heard(&wb, 5000).await,
        "the other process's runners were not woken"
    );
    assert!(
        !heard(&wa, 300).await,
        "its own announcement came back and woke its runners a second time"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn without_redis_a_write_wakes_other_workers_with_a_notify_after_its_commit(db: PgPool) {
    let app = TestApp::with(db.clone(), |c| c.cache = chirp::config::CacheMode::Off).await;
    let (_, token) = app.signup("poster").await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db).await.unwrap();
    listener.listen(chirp::jobs::CHANNEL).await.unwrap();
    app.tweet(&token, "wake up").await;
    let notified = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv()).await;
    assert!(matches!(notified, Ok(Ok(_))), "{notified:?}");
}

/// The part jobs queued for `tweet`: `(progress, until_at)`, in order.
async fn parts_of(
    app: &TestApp,
    tweet: i64,
) -> Vec<(
    Option<chrono::DateTime<chrono::Utc>>,
    chrono::DateTime<chrono::Utc>,
)> {
    sqlx::query_as(
        "select progress, until_at from jobs where kind = 'fanout_part' and tweet_id = $1
         order by until_at",
    )
    .bind(tweet)
    .fetch_all(app.db())
    .await
    .unwrap()
}

/// Which followers have a newsfeed row of `tweet`, as `(user, rows)`.
async fn rows_per_reader(app: &TestApp, tweet: i64) -> Vec<(i64, i64)> {
    sqlx::query_as(
        "select user_id, count(*) from newsfeeds where tweet_id = $1 group by 1 order by 1",
    )
    .bind(tweet)
    .fetch_all(app.db())
    .await
    .unwrap()
}

/// A star with `fans` followers, the first `cached` of whom have cached (empty) newsfeeds, and
/// the star's tweet, whose fan-out job is then run once (by one runner): `(star, fans, tweet)`.
async fn star_posts_and_one_runner_starts(
    app: &TestApp,
    fans: usize,
    cached: usize,
) -> (i64, Vec<(i64, String)>, i64) {
    let (star, ts) = app.signup("star").await;
    let fans = followers(app, star, fans).await;
    for (_, token) in &fans[..cached] {
        app.get("/api/newsfeeds/", Some(token)).await;
    }
    let id = app.tweet(&ts, "to everyone").await["id"].as_i64().unwrap();
    assert!(app.state.worker.run_one().await.unwrap());
    (star, fans, id)
}

/// Every follower and the star have one row of `tweet`; every fan's newsfeed shows it, and the
/// cached ones hold it.
async fn every_fan_has_it_once(app: &TestApp, fans: &[(i64, String)], tweet: i64) {
    let rows = rows_per_reader(app, tweet).await;
    assert_eq!(rows.len(), fans.len() + 1, "every follower and the author");
    assert!(rows.iter().all(|(_, n)| *n == 1), "each once: {rows:?}");
    for (fan, token) in fans {
        if let Some(members) = app.cached_members(Timeline::Newsfeed(*fan)).await {
            assert_eq!(member_tweet(&members[0]), tweet, "{members:?}");
        }
        assert_eq!(
            tweet_ids(&app.get("/api/newsfeeds/", Some(token)).await.body),
            vec![tweet]
        );
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_fan_out_of_two_batches_is_shared_by_two_runners_and_the_job_runs_the_last_part(
    db: PgPool,
) {
    // Batches of 3, two parts (the default): 10 followers are two parts of 5.
    let app = TestApp::with(db, |c| c.fanout_batch_size = 3).await;
    assert_eq!(app.state.config.fanout_parts, 2);
    // The tweet's job queues the first part and runs the second itself.
    let (star, fans, id) = star_posts_and_one_runner_starts(&app, 10, 4).await;
    let parts = parts_of(&app, id).await;
    assert_eq!(parts.len(), 1, "{parts:?}");
    assert_eq!(parts[0].0, None, "the part starts at the first follower");
    let fifth: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "select created_at from friendships where to_user_id = $1 order by created_at
         offset 4 limit 1",
    )
    .bind(star)
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(parts[0].1, fifth, "and ends at the fifth");
    let done: Vec<i64> = rows_per_reader(&app, id)
        .await
        .into_iter()
        .map(|(user, _)| user)
        .collect();
    let mut second_half: Vec<i64> = fans[5..].iter().map(|(f, _)| *f).collect();
    second_half.push(star);
    second_half.sort_unstable();
    assert_eq!(
        done, second_half,
        "the job wrote the last five and the author"
    );

    // A second runner takes the part.
    assert_eq!(app.drain().await, 1);
    for (fan, _) in &fans[..4] {
        let members = app.cached_members(Timeline::Newsfeed(*fan)).await;
        assert!(members.is_some(), "still cached, before any read");
    }
    every_fan_has_it_once(&app, &fans, id).await;
    let left: i64 = sqlx::query_scalar("select count(*) from jobs")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(left, 0, "both jobs are done");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_fan_out_part_ends_its_job_in_the_commit_of_its_last_batch(db: PgPool) {
    // Batches of 3, 12 followers: two parts of 6, each exactly two full batches, so the part
    // knows its last batch by its end, not by a short batch.
    let app = TestApp::with(db, |c| c.fanout_batch_size = 3).await;
    let (_, fans, id) = star_posts_and_one_runner_starts(&app, 12, 3).await;
    assert_eq!(parts_of(&app, id).await.len(), 1);
    // Run the part's body alone, without the runner's delete after it.
    let worker = &app.state.worker;
    let (claim, job) = worker.claim().await.unwrap().unwrap();
    let Ok(chirp::jobs::Job::FanoutPart {
        tweet_id,
        progress,
        until,
    }) = job
    else {
        panic!("not a part: {job:?}");
    };
    chirp::newsfeeds::fanout(worker, claim.id, tweet_id, progress, Some(until))
        .await
        .unwrap();
    assert!(
        parts_of(&app, id).await.is_empty(),
        "the part's job is gone"
    );
    every_fan_has_it_once(&app, &fans, id).await;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_big_accounts_fan_out_is_cut_into_parts_of_at_most_eight_batches(db: PgPool) {
    // Batches of 1: 20 followers would be two parts of 10, but a part holds at most 8 batches:
    // parts of 8, 8 and 4, the job itself running the last.
    let app = TestApp::with(db, |c| c.fanout_batch_size = 1).await;
    let (_, fans, id) = star_posts_and_one_runner_starts(&app, 20, 5).await;
    let parts = parts_of(&app, id).await;
    assert_eq!(parts.len(), 2, "8 + 8 queued, 4 done");
    assert_eq!(parts[0].0, None);
    assert_eq!(
        parts[1].0,
        Some(parts[0].1),
        "each part starts where the last ended"
    );
    assert_eq!(
        rows_per_reader(&app, id).await.len(),
        5,
        "the last 4 and the author"
    );

    // Two workers run the parts side by side.
    let (a, b) = (app.state.worker.clone(), app.state.worker.clone());
    let (ran_a, ran_b) = tokio::join!(a.run_until_idle(), b.run_until_idle());
    assert_eq!(ran_a.unwrap() + ran_b.unwrap(), 2);
    every_fan_has_it_once(&app, &fans, id).await;
}

#[test]
fn a_part_is_an_even_share_of_at_least_one_and_at_most_eight_batches() {
    use chirp::newsfeeds::part_size;
    assert_eq!(
        part_size(3383, 1000, 2),
        1692,
        "the most-followed imported account"
    );
    assert_eq!(part_size(1500, 1000, 2), 1000, "at least one batch");
    assert_eq!(part_size(900, 1000, 2), 1000, "one batch: not split");
    assert_eq!(part_size(100_000, 1000, 2), 8000, "at most eight batches");
    assert_eq!(part_size(3383, 1000, 1), 3383, "one part");
    assert_eq!(part_size(10, 0, 0), 8, "zeros are taken as ones");
}

/// Issue 36: fan-out jobs of small accounts run as one batch (one transaction, set-based
/// statements over every follower and tweet). Every reader must get what one job at a time
/// gives: each followed author's tweets once, in the order they arrived (above an entry the
/// reader already had, in the order of the tweets), entry times unique and at or after their
/// tweets', the reader's head at its newest entry, cached newsfeeds merged to equal
/// Postgres, a tweet deleted before its fan-out nowhere; a big account's job (more followers
/// than a batch) runs whole beside the batch.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn many_small_fan_outs_run_as_one_batch_and_give_each_reader_what_one_at_a_time_would(
    db: PgPool,
) {
    let app = TestApp::with(db, |c| {
        c.fanout_batch_size = 4;
        c.fanout_parts = 1;
    })
    .await;
    let mut authors = Vec::new();
    for i in 0..4 {
        authors.push(app.signup(&format!("author{i}")).await);
    }
    let (star, star_token) = app.signup("star").await;
    let mut readers = Vec::new();
    for i in 0..6 {
        let (id, token) = app.signup(&format!("reader{i}")).await;
        for (j, (author, _)) in authors.iter().enumerate() {
            if (i + j) % 3 != 0 {
                app.follow(&token, *author).await;
            }
        }
        if i < 5 {
            app.follow(&token, star).await;
        }
        readers.push((id, token));
    }
    app.drain().await;
    // Half the readers have cached newsfeeds (and every one of them a head row already).
    for (_, token) in &readers[..3] {
        assert!(
            app.get("/api/newsfeeds/", Some(token))
                .await
                .status
                .is_success()
        );
    }
    let mut posted = Vec::new();
    for round in 0..3 {
        for (i, (_, token)) in authors.iter().enumerate() {
            posted.push(
                app.tweet(token, &format!("r{round} a{i}")).await["id"]
                    .as_i64()
                    .unwrap(),
            );
        }
        if round == 1 {
            posted.push(
                app.tweet(&star_token, "to five").await["id"]
                    .as_i64()
                    .unwrap(),
            );
        }
    }
    let gone = posted.remove(2);
    assert!(
        app.delete(&format!("/api/tweets/{gone}/"), Some(&authors[2].1))
            .await
            .status
            .is_success()
    );
    // A reader posts after them all: the batch's entries arrive above its own (late, each
    // stamped above the reader's head).
    let own = app.tweet(&readers[0].1, "mine").await["id"]
        .as_i64()
        .unwrap();
    let queued: i64 = sqlx::query_scalar("select count(*) from jobs")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(
        queued, 13,
        "one fan-out job per tweet (the deleted one's went with it)"
    );
    assert!(
        app.drain().await <= 2,
        "the runner took the fan-outs together"
    );
    let left: i64 = sqlx::query_scalar("select count(*) from jobs")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(left, 0);

    for (reader, token) in &readers {
        // What the newsfeed means: the tweets of the accounts the reader follows.
        let mut expected: Vec<i64> = sqlx::query_scalar(
            "select t.id from tweets t join friendships f on f.to_user_id = t.user_id
             where f.from_user_id = $1 order by t.created_at desc",
        )
        .bind(reader)
        .fetch_all(app.db())
        .await
        .unwrap();
        if *reader == readers[0].0 {
            expected.push(own);
        }
        assert!(!expected.contains(&gone));
        let rows: Vec<(i64, chirp::time::Timestamp, chirp::time::Timestamp)> = sqlx::query_as(
            "select n.tweet_id, n.created_at, t.created_at from newsfeeds n
             join tweets t on t.id = n.tweet_id where n.user_id = $1 order by n.created_at desc",
        )
        .bind(reader)
        .fetch_all(app.db())
        .await
        .unwrap();
        assert_eq!(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            expected,
            "reader {reader}: each followed tweet once, in the order it arrived"
        );
        assert!(rows.iter().all(|(_, at, tweet_at)| at >= tweet_at));
        let head: chirp::time::Timestamp =
            sqlx::query_scalar("select head from feed_heads where user_id = $1")
                .bind(reader)
                .fetch_one(app.db())
                .await
                .unwrap();
        assert_eq!(
            Some(head),
            rows.first().map(|r| r.1),
            "reader {reader}: head at the newest entry"
        );
        if let Some(cached) = cached_feed_tweets(&app, *reader).await {
            assert_eq!(
                cached, expected,
                "reader {reader}: the cached newsfeed merged"
            );
        }
        assert_eq!(
            tweet_ids(&app.get("/api/newsfeeds/", Some(token)).await.body),
            expected,
            "reader {reader}: the page"
        );
    }
}

/// The trace id (`x-trace-id`) and the trace ids of the fan-out jobs queued for `tweet`, by
/// kind, of a post by `token` with the header `traceparent`, if any.
async fn post_traced(
    app: &TestApp,
    token: &str,
    traceparent: Option<&str>,
) -> (String, i64, Vec<(String, Option<String>)>) {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut req = Request::builder()
        .method("POST")
        .uri("/api/tweets/")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json");
    if let Some(t) = traceparent {
        req = req.header("traceparent", t);
    }
    let req = req.body(Body::from(r#"{"content": "traced"}"#)).unwrap();
    let res = app.app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), axum::http::StatusCode::CREATED);
    let trace = res.headers()["x-trace-id"].to_str().unwrap().to_owned();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let tweet = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"]
        .as_i64()
        .unwrap();
    (trace, tweet, jobs_of(app, tweet).await)
}

async fn jobs_of(app: &TestApp, tweet: i64) -> Vec<(String, Option<String>)> {
    sqlx::query_as("select kind, trace_id from jobs where tweet_id = $1 order by id")
        .bind(tweet)
        .fetch_all(app.db())
        .await
        .unwrap()
}

/// Issue 39: a post's trace id (its W3C `traceparent`'s trace-id, else one of chirp's own),
/// answered in `x-trace-id`, is stored on the fan-out job the post queued and on the parts
/// that job queues, so a slow fan-out leads back to its post.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_posts_trace_id_follows_it_to_its_fan_out_job_and_the_parts_it_queues(db: PgPool) {
    let app = TestApp::with(db, |c| c.fanout_batch_size = 3).await;
    let (star, ts) = app.signup("star").await;
    followers(&app, star, 10).await;

    let id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = format!("00-{id}-00f067aa0ba902b7-01");
    let (trace, tweet, jobs) = post_traced(&app, &ts, Some(&parent)).await;
    assert_eq!(trace, id);
    assert_eq!(jobs, vec![("fanout".to_owned(), Some(id.to_owned()))]);
    // The job runs its last part and queues the first (10 followers, batches of 3, 2 parts).
    assert!(app.state.worker.run_one().await.unwrap());
    let jobs = jobs_of(&app, tweet).await;
    assert_eq!(
        jobs,
        vec![("fanout_part".to_owned(), Some(id.to_owned()))],
        "the part carries the post's trace id"
    );
    app.drain().await;

    // Without a traceparent (or with a malformed one) chirp makes one up, and stores that.
    for header in [None, Some("00-not-a-trace-01")] {
        let (trace, _, jobs) = post_traced(&app, &ts, header).await;
        assert_eq!(trace.len(), 32, "{trace}");
        assert!(trace.bytes().all(|b| b.is_ascii_hexdigit()), "{trace}");
        assert_ne!(trace, id);
        assert_eq!(jobs, vec![("fanout".to_owned(), Some(trace))]);
        app.drain().await;
    }
}

/// A fan-out batch moves its readers' heads through the index whatever the planner believes of
/// `feed_heads`: with statistics from when the table was empty and 20,000 heads since (a new
/// deployment, or any table that grew between two `ANALYZE`s), the statement reads the batch's
/// heads only. On the bench's database the join alone scanned every head for each batch
/// (100,001 heads, 13 ms, even for a batch with no reader: BENCHMARKS.md, round 30).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_batch_moves_its_readers_heads_through_the_index(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (bob, tb) = app.signup("bob").await;
    app.follow(&tb, alice).await;
    // The statistics of an emptied table: no row, one page.
    sqlx::query("insert into feed_heads (user_id, head) values ($1, '-infinity')")
        .bind(bob)
        .execute(app.db())
        .await
        .unwrap();
    for sql in ["delete from feed_heads", "analyze feed_heads"] {
        sqlx::query(sql).execute(app.db()).await.unwrap();
    }
    sqlx::query(
        "with fans as (
             insert into users (username, email, password_hash)
             select 'head' || g, 'head' || g || '@example.com', 'x' from generate_series(1, 20000) g
             returning id)
         insert into feed_heads (user_id, head) select id, now() from fans",
    )
    .execute(app.db())
    .await
    .unwrap();
    app.tweet(&ta, "to bob").await;
    app.drain().await;
    let mut tx = app.db().begin().await.unwrap();
    for moved in [vec![bob], vec![]] {
        let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "explain (analyze, format json) {}",
            chirp::newsfeeds::MOVE_HEADS
        )))
        .bind(&moved)
        .bind(vec![chrono::Utc::now(); moved.len()])
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        let rows = rows_scanned(&plan[0]["Plan"]);
        // Each reader's head, and the reader itself from the arrays.
        assert!(
            rows <= 2 * moved.len() as i64,
            "{rows} rows read to move {} heads: {plan}",
            moved.len()
        );
    }
    tx.rollback().await.unwrap();
    // And the batch still moved bob's head to his newest entry.
    let (head, newest): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as(
            "select (select head from feed_heads where user_id = $1),
                    (select max(created_at) from newsfeeds where user_id = $1)",
        )
        .bind(bob)
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(head, newest);
}
