//! `GET /metrics` (issue 39): what an operator alerts on, per process, in the Prometheus text
//! format.

use axum::http::StatusCode;
use chirp::cache::AfterCommit;
use chirp::config::CacheMode;
use sqlx::PgPool;

use crate::helpers::TestApp;

/// The value of the sample `series` (its name and labels as the text format writes them:
/// labels sorted by name), if the scrape holds it.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

async fn scrape(app: &TestApp) -> String {
    let (status, kind, text) = app.get_text("/metrics").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    text
}

/// Every family docs/API.md "Observability" names answers, requests count by their route's
/// pattern (never by a path with ids in it), lookups count by cache kind, and each process
/// keeps its own figures (the test suite runs two servers in one process).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn metrics_count_requests_by_route_pattern_and_lookups_by_cache_kind(db: PgPool) {
    let app = TestApp::new(db.clone()).await;
    let other = TestApp::new(db).await;
    let (alice, token) = app.signup("alice").await;
    let tweet = app.tweet(&token, "hello").await["id"].as_i64().expect("id");
    for _ in 0..2 {
        let res = app.get(&format!("/api/tweets/{tweet}"), None).await;
        assert_eq!(res.status, StatusCode::OK);
        let res = app
            .get(&format!("/api/tweets/?user_id={alice}"), None)
            .await;
        assert_eq!(res.status, StatusCode::OK);
    }
    assert_eq!(
        app.get("/api/nowhere", None).await.status,
        StatusCode::NOT_FOUND
    );
    // One route's service keeps the series of the first answer it records: other statuses and
    // methods (HEAD is answered by the GET handler) must still count as themselves.
    let gone = app.get("/api/tweets/999999999", None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let head = axum::http::Request::head(format!("/api/tweets/{tweet}"))
        .body(axum::body::Body::empty())
        .expect("a request");
    assert_eq!(app.send(head).await.status, StatusCode::OK);

    let text = scrape(&app).await;
    for family in [
        "http_requests_total",
        "http_request_duration_seconds",
        "chirp_cache_hits_total",
        "chirp_cache_misses_total",
        "chirp_fanout_queue_depth",
        "chirp_fanout_oldest_job_age_seconds",
        "chirp_outbox_rows",
        "chirp_outbox_oldest_age_seconds",
        "chirp_cache_fences_total",
        "chirp_near_cache_trusted",
        "chirp_stream_clients",
        "chirp_long_poll_clients",
        "chirp_redis_round_trip_seconds",
        "chirp_postgres_round_trip_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{text}"
        );
    }
    let detail = r#"http_requests_total{method="GET",route="/api/tweets/{id}",status="200"}"#;
    assert_eq!(sample(&text, detail), Some(2.0), "{text}");
    let missing = r#"http_requests_total{method="GET",route="/api/tweets/{id}",status="404"}"#;
    assert_eq!(sample(&text, missing), Some(1.0), "{text}");
    let head = r#"http_requests_total{method="HEAD",route="/api/tweets/{id}",status="200"}"#;
    assert_eq!(sample(&text, head), Some(1.0), "{text}");
    let took_all = r#"http_request_duration_seconds_count{method="GET",route="/api/tweets/{id}"}"#;
    assert_eq!(sample(&text, took_all), Some(3.0), "{text}");
    let lost = r#"http_requests_total{method="GET",route="unmatched",status="404"}"#;
    assert_eq!(sample(&text, lost), Some(1.0), "{text}");
    assert!(
        !text.contains(&format!("/api/tweets/{tweet}\"")),
        "a route label holds an id:\n{text}"
    );
    // alice's timeline: filled from Postgres once, then answered by its cached list.
    let timeline = |k: &str| format!(r#"chirp_cache_{k}_total{{kind="timeline"}}"#);
    assert!(sample(&text, &timeline("misses")) >= Some(1.0), "{text}");
    assert!(sample(&text, &timeline("hits")) >= Some(1.0), "{text}");
    assert!(
        sample(
            &text,
            r#"chirp_postgres_round_trip_seconds_count{read="first_fill"}"#
        ) >= Some(1.0),
        "{text}"
    );
    assert!(sample(&text, "chirp_redis_round_trip_seconds_count") >= Some(1.0));
    assert_eq!(sample(&text, "chirp_redis_up"), Some(1.0));
    assert_eq!(
        sample(&text, r#"chirp_stream_clients{stream="user"}"#),
        Some(0.0)
    );

    // The other process served none of it.
    let theirs = scrape(&other).await;
    assert_eq!(sample(&theirs, detail), None, "{theirs}");
    assert_eq!(sample(&theirs, &timeline("hits")), Some(0.0), "{theirs}");
}

/// With the cache off `/metrics` still answers (families without samples left out), and a
/// method outside the standard ones is `other`, whatever its name: a client cannot make a
/// series per made-up method.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn metrics_answer_with_the_cache_off_and_bound_the_method_label(db: PgPool) {
    let app = TestApp::with(db, |c| c.cache = CacheMode::Off).await;
    for method in ["FOO1", "FOO2"] {
        let req = axum::http::Request::builder()
            .method(method)
            .uri("/api/nowhere")
            .body(axum::body::Body::empty())
            .unwrap();
        app.send(req).await;
    }
    let text = scrape(&app).await;
    let other = r#"http_requests_total{method="other",route="unmatched",status="404"}"#;
    assert_eq!(sample(&text, other), Some(2.0), "{text}");
    assert!(!text.contains("FOO"), "{text}");
    assert_eq!(sample(&text, "chirp_cache_fences_total"), Some(0.0));
    assert_eq!(sample(&text, "chirp_redis_up"), Some(0.0));
    // No object near cache without Redis; the token one answers nothing from memory.
    let trusted = |c: &str| {
        sample(
            &text,
            &format!(r#"chirp_near_cache_trusted{{cache="{c}"}}"#),
        )
    };
    assert_eq!(trusted("object"), None, "{text}");
    assert_eq!(trusted("token"), Some(0.0), "{text}");
}

/// The outbox and fan-out gauges say what Postgres holds: a cache step that did not run (a
/// crash after the commit) shows as an outbox row until the relay applies it.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn metrics_show_the_outbox_and_the_fan_out_queue_as_postgres_holds_them(db: PgPool) {
    let app = TestApp::new(db).await;
    let (bob_id, bob) = app.signup("bob").await;
    let (_, alice) = app.signup("alice").await;
    app.follow(&alice, bob_id).await;
    app.drain().await;
    app.state.cache.set_after_commit(AfterCommit::Crash);
    app.tweet(&bob, "left to the relay").await;
    app.state.cache.set_after_commit(AfterCommit::Apply);
    let rows = app.outbox_rows().await;
    assert!(rows >= 1);
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs where failed_at is null")
        .fetch_one(app.db())
        .await
        .expect("jobs");

    let text = scrape(&app).await;
    assert_eq!(
        sample(&text, "chirp_outbox_rows"),
        Some(rows as f64),
        "{text}"
    );
    assert!(sample(&text, "chirp_outbox_oldest_age_seconds") >= Some(0.0));
    assert_eq!(
        sample(&text, "chirp_fanout_queue_depth"),
        Some(jobs as f64),
        "{text}"
    );
    assert_eq!(sample(&text, "chirp_queues_read"), Some(1.0));

    app.relay().await;
    app.drain().await;
    // The fan-out's own outbox row is deleted after its cache step, by the process's deleter
    // (decision 0032): wait for it, as `outbox_rows` does.
    app.state.cache.forgotten().await;
    let text = scrape(&app).await;
    assert_eq!(sample(&text, "chirp_outbox_rows"), Some(0.0), "{text}");
    assert_eq!(sample(&text, "chirp_outbox_oldest_age_seconds"), Some(0.0));
    assert_eq!(
        sample(&text, "chirp_fanout_queue_depth"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "chirp_fanout_oldest_job_age_seconds"),
        Some(0.0)
    );
}

/// The metric names in `text` (of docs/ops): words that start with `chirp_` or `http_`, less a
/// histogram's `_bucket`, `_count` or `_sum`.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let word = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let mut rest = text;
    while let Some(at) = ["chirp_", "http_"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail.find(|c: char| !word(c)).unwrap_or(tail.len());
        if !before.is_some_and(word) {
            let name = &tail[..end];
            let name = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.insert(name.to_owned());
        }
        rest = &tail[end.max(1)..];
    }
    names
}

/// docs/ops's alert rules and dashboard name only metrics that `/metrics` exports.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_ops_alerts_and_dashboard_name_only_exported_metrics(db: PgPool) {
    let app = TestApp::new(db).await;
    app.get("/livez", None).await;
    let text = scrape(&app).await;
    let root = env!("CARGO_MANIFEST_DIR");
    for file in ["docs/ops/alerts.yml", "docs/ops/dashboard.json"] {
        let doc = std::fs::read_to_string(format!("{root}/{file}")).expect(file);
        let names = metric_names(&doc);
        assert!(names.len() >= 8, "{file}: {names:?}");
        for name in names {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{file} names {name}, which /metrics does not export"
            );
        }
    }
}
