//! Multipart bodies, tweet photos and avatars: validated by content, stored, served, deleted.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use sqlx::PgPool;
use tower::ServiceExt;

use crate::helpers::TestApp;

/// One part of a multipart body: a text field, or a file with a name and bytes.
enum Part<'a> {
    Text(&'a str, &'a str),
    File(&'a str, &'a str, Vec<u8>),
}

const BOUNDARY: &str = "chirp-test-boundary";

fn multipart(parts: &[Part<'_>]) -> Vec<u8> {
    let mut body = Vec::new();
    for part in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        match part {
            Part::Text(name, value) => {
                body.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
                        .as_bytes(),
                );
            }
            Part::File(name, file_name, bytes) => {
                body.extend_from_slice(
                    format!(
                        "Content-Disposition: form-data; name=\"{name}\"; filename=\"{file_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                    )
                    .as_bytes(),
                );
                body.extend_from_slice(bytes);
                body.extend_from_slice(b"\r\n");
            }
        }
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

async fn send(
    app: &TestApp,
    method: Method,
    uri: &str,
    token: Option<&str>,
    parts: &[Part<'_>],
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri).header(
        "content-type",
        format!("multipart/form-data; boundary={BOUNDARY}"),
    );
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let res = app
        .app
        .clone()
        .oneshot(req.body(Body::from(multipart(parts))).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// GETs a URL: status, content type and bytes.
async fn fetch(app: &TestApp, url: &str) -> (StatusCode, String, Vec<u8>) {
    let req = Request::get(url).body(Body::empty()).unwrap();
    let res = app.app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let mime = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (
        status,
        mime,
        res.into_body().collect().await.unwrap().to_bytes().to_vec(),
    )
}

/// Real images (4×3 JPEG and 5×4 PNG with EXIF, a GPS position and a comment; 3×2 GIF; 6×5
/// WebP with EXIF), made with Pillow. Their metadata holds the marker [`MARKER`].
fn png() -> Vec<u8> {
    include_bytes!("../fixtures/photo.png").to_vec()
}

fn jpeg() -> Vec<u8> {
    include_bytes!("../fixtures/photo.jpg").to_vec()
}

fn gif() -> Vec<u8> {
    include_bytes!("../fixtures/photo.gif").to_vec()
}

fn webp() -> Vec<u8> {
    include_bytes!("../fixtures/photo.webp").to_vec()
}

/// A 6×5 lossy WebP with an alpha channel, and a 4×4 animated one of three frames, each with
/// EXIF (extended `VP8X` files whose header must survive the EXIF's removal).
fn webp_alpha() -> Vec<u8> {
    include_bytes!("../fixtures/photo-alpha.webp").to_vec()
}

fn webp_animated() -> Vec<u8> {
    include_bytes!("../fixtures/photo-animated.webp").to_vec()
}

/// In the fixtures' EXIF (camera make) and comments.
const MARKER: &[u8] = b"chirp-test-";

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Files in the test's media directory.
fn stored_files(app: &TestApp) -> usize {
    fn walk(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .flatten()
                .map(|e| {
                    if e.path().is_dir() {
                        walk(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
    }
    walk(std::path::Path::new(&app.state.config.media_store))
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_multipart_signup_and_a_tweet_with_three_photos_served_back(db: PgPool) {
    let app = TestApp::new(db).await;
    let (status, body) = send(
        &app,
        Method::POST,
        "/api/accounts/signup/",
        None,
        &[
            Part::Text("username", "photographer"),
            Part::Text("email", "p@example.com"),
            Part::Text("password", "correct horse"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let token = body["token"].as_str().unwrap().to_owned();
    let id = body["user"]["id"].as_i64().unwrap();

    // The same field errors as JSON bodies.
    let (status, body) = send(&app, Method::POST, "/api/tweets/", Some(&token), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["errors"]["content"].is_array(), "{body}");

    let photos = [png(), jpeg(), gif()];
    let (status, tweet) = send(
        &app,
        Method::POST,
        "/api/tweets/",
        Some(&token),
        &[
            Part::Text("content", "three photos"),
            Part::File("files", "a.png", photos[0].clone()),
            Part::File("files", "b.jpg", photos[1].clone()),
            Part::File("files", "c.gif", photos[2].clone()),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{tweet}");
    let urls: Vec<String> = tweet["photo_urls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(urls.len(), 3);
    for (url, (bytes, mime)) in
        urls.iter()
            .zip(photos.iter().zip(["image/png", "image/jpeg", "image/gif"]))
    {
        assert!(url.starts_with("/media/photos/"), "{url}");
        let (status, got_mime, got) = fetch(&app, url).await;
        assert_eq!((status, got_mime.as_str()), (StatusCode::OK, mime));
        // The same picture, without its metadata.
        assert_eq!(
            imagesize::blob_size(&got).unwrap(),
            imagesize::blob_size(bytes).unwrap()
        );
        assert!(!contains(&got, MARKER), "{url} kept its metadata");
    }
    // Photo URLs are part of the (cached) tweet object in listings and the detail.
    let tid = tweet["id"].as_i64().unwrap();
    for _ in 0..2 {
        let detail = app.get(&format!("/api/tweets/{tid}/"), None).await.body;
        assert_eq!(detail["photo_urls"], tweet["photo_urls"]);
        let listed = app
            .get(&format!("/api/tweets/?user_id={id}"), None)
            .await
            .body;
        assert_eq!(listed["results"][0]["photo_urls"], tweet["photo_urls"]);
    }

    // Deleted with the tweet.
    let res = app
        .delete(&format!("/api/tweets/{tid}/"), Some(&token))
        .await;
    assert_eq!(res.status, StatusCode::OK);
    for url in &urls {
        assert_eq!(fetch(&app, url).await.0, StatusCode::NOT_FOUND);
    }
    assert_eq!(stored_files(&app), 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_non_image_a_tenth_file_or_an_oversize_file_is_a_400_and_stores_nothing(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, token) = app.quick_user("uploader").await;
    let renamed = Part::File(
        "files",
        "notes.png",
        b"just some text, not a picture".to_vec(),
    );
    let mut ten: Vec<Part<'_>> = (0..10)
        .map(|_| Part::File("files", "p.png", png()))
        .collect();
    ten.push(Part::Text("content", "ten"));
    let mut big = png();
    big.resize(chirp::media::MAX_FILE_BYTES + 1, 0);
    let cases: Vec<Vec<Part<'_>>> = vec![
        vec![Part::Text("content", "text as png"), renamed],
        ten,
        vec![
            Part::Text("content", "big"),
            Part::File("files", "ok.png", png()),
            Part::File("files", "big.png", big),
        ],
    ];
    for parts in &cases {
        let (status, body) = send(&app, Method::POST, "/api/tweets/", Some(&token), parts).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["errors"]["files"].is_array(), "{body}");
    }
    let tweets: i64 = sqlx::query_scalar("select count(*) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!((tweets, stored_files(&app)), (0, 0));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_uploaded_avatar_replaces_the_previous_one(db: PgPool) {
    let app = TestApp::new(db).await;
    let (id, token) = app.quick_user("face").await;
    let uri = format!("/api/users/{id}/");
    let (status, first) = send(
        &app,
        Method::PATCH,
        &uri,
        Some(&token),
        &[
            Part::Text("nickname", "Face"),
            Part::File("avatar", "me.png", png()),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let old = first["avatar_url"].as_str().unwrap().to_owned();
    assert!(old.starts_with(&format!("/media/avatars/{id}/")), "{old}");
    assert_eq!(first["nickname"], "Face");
    assert_eq!(fetch(&app, &old).await.0, StatusCode::OK);

    let (status, second) = send(
        &app,
        Method::PUT,
        &uri,
        Some(&token),
        &[Part::File("avatar", "me.jpg", jpeg())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let new = second["avatar_url"].as_str().unwrap();
    assert_ne!(new, old);
    assert_eq!(
        fetch(&app, &old).await.0,
        StatusCode::NOT_FOUND,
        "the old file is gone"
    );
    assert_eq!(fetch(&app, new).await.1, "image/jpeg");
    assert_eq!(stored_files(&app), 1);

    let (status, body) = send(
        &app,
        Method::PATCH,
        &uri,
        Some(&token),
        &[Part::File("avatar", "x.png", b"not an image".to_vec())],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["errors"]["avatar"].is_array(), "{body}");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn hostile_uploads_are_refused_and_stored_photos_lose_their_metadata(db: PgPool) {
    let app = TestApp::new(db).await;
    let (id, token) = app.quick_user("uploader").await;
    let mut html_png = b"\x89PNG\r\n\x1a\n".to_vec();
    html_png.extend_from_slice(b"<html><script>alert(1)</script></html>");
    let mut truncated = jpeg();
    truncated.truncate(truncated.len() / 2);
    // The PNG fixture's header, claiming 100,000 pixels a side.
    let mut huge = png();
    huge[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    huge[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let bad: [(&str, Vec<u8>); 4] = [
        ("GIF? no beside a good PNG", b"GIF? no".to_vec()),
        ("PNG magic and HTML", html_png),
        ("half a JPEG", truncated),
        ("100,000 pixels a side", huge),
    ];
    for (what, bytes) in bad {
        let (status, body) = send(
            &app,
            Method::POST,
            "/api/tweets/",
            Some(&token),
            &[
                Part::Text("content", "hostile"),
                Part::File("files", "good.png", png()),
                Part::File("files", "x.gif", bytes),
            ],
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
        assert!(body["errors"]["files"].is_array(), "{what}: {body}");
    }
    // A text field is held to the JSON body limit, also on upload routes.
    let long = "n".repeat(chirp::http::MAX_BODY_BYTES + 1);
    let (status, body) = send(
        &app,
        Method::PATCH,
        &format!("/api/users/{id}/"),
        Some(&token),
        &[
            Part::Text("nickname", &long),
            Part::File("avatar", "me.png", png()),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["errors"]["nickname"].is_array(), "{body}");
    let tweets: i64 = sqlx::query_scalar("select count(*) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!((tweets, stored_files(&app)), (0, 0), "nothing stored");

    // Good photos are stored without EXIF (camera, GPS), XMP or comments, and served so that
    // no browser runs them as anything else.
    let originals = [
        ("a.jpg", jpeg()),
        ("b.png", png()),
        ("c.webp", webp()),
        ("d.webp", webp_alpha()),
        ("e.webp", webp_animated()),
    ];
    for (_, bytes) in &originals {
        assert!(contains(bytes, MARKER), "the fixture has metadata to lose");
    }
    let parts: Vec<Part<'_>> = std::iter::once(Part::Text("content", "clean"))
        .chain(
            originals
                .iter()
                .map(|(name, bytes)| Part::File("files", name, bytes.clone())),
        )
        .collect();
    let (status, tweet) = send(&app, Method::POST, "/api/tweets/", Some(&token), &parts).await;
    assert_eq!(status, StatusCode::CREATED, "{tweet}");
    for (url, (name, original)) in tweet["photo_urls"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&originals)
    {
        let url = url.as_str().unwrap();
        let req = Request::get(url).body(Body::empty()).unwrap();
        let res = app.app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let header = |n: &str| res.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(header("x-content-type-options").as_deref(), Some("nosniff"));
        assert!(
            header("content-disposition").is_some_and(|d| d.starts_with("inline; filename=")),
            "{name}"
        );
        let length = header("content-length");
        let served = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(length, Some(served.len().to_string()), "{name}");
        assert!(!contains(&served, MARKER), "{name} kept its metadata");
        for chunk in [b"VP8X", b"ALPH", b"ANIM", b"ANMF"] {
            assert_eq!(
                contains(&served, chunk),
                contains(original, chunk),
                "{name}: {} kept as it was",
                String::from_utf8_lossy(chunk)
            );
        }
        if let Some(at) = served.windows(4).position(|w| w == b"VP8X") {
            assert_eq!(
                served[at + 8] & 0x0C,
                0,
                "{name}: VP8X still flags EXIF or XMP"
            );
        }
        assert_eq!(
            imagesize::blob_size(&served).unwrap(),
            imagesize::blob_size(original).unwrap(),
            "{name}: the same picture"
        );
    }
}

/// Review 2026-11-26, finding 15: the previous avatar to delete was read through the cache, so
/// a stale cached profile deleted an older file and left the real previous one behind. It
/// comes from the row the update replaces now.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_replaced_avatar_is_the_one_postgres_held_whatever_the_cache_says(db: PgPool) {
    let app = TestApp::new(db).await;
    let (id, token) = app.quick_user("face").await;
    let uri = format!("/api/users/{id}/");
    let (status, first) = send(
        &app,
        Method::PATCH,
        &uri,
        Some(&token),
        &[Part::File("avatar", "a.png", png())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    // Behind the cache's back (a missed invalidation): Postgres names another file now.
    let stored = app
        .state
        .media
        .put_all(
            &format!("avatars/{id}"),
            vec![(axum::body::Bytes::from(png()), "png")],
        )
        .await
        .unwrap();
    let behind = stored[0].clone();
    sqlx::query("update users set avatar_url = $2 where id = $1")
        .bind(id)
        .bind(&behind)
        .execute(app.db())
        .await
        .unwrap();
    let (status, second) = send(
        &app,
        Method::PATCH,
        &uri,
        Some(&token),
        &[Part::File("avatar", "c.jpg", jpeg())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(
        fetch(&app, &behind).await.0,
        StatusCode::NOT_FOUND,
        "the avatar Postgres held was replaced and deleted"
    );
    let new = second["avatar_url"].as_str().unwrap();
    assert_eq!(fetch(&app, new).await.0, StatusCode::OK);
}

/// Found by the schema fuzzer (scripts/fuzz-api): a media key longer than the file system's
/// name limit was a 500 (the store's open failed), and so was a path through a stored file
/// (review); a key of another shape than chirp issues is a 404 without touching the store.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_key_chirp_never_issues_is_a_404(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, token) = app.signup("alice").await;
    let parts = [
        Part::Text("content", "a photo"),
        Part::File("files", "a.png", png()),
    ];
    let (status, tweet) = send(&app, Method::POST, "/api/tweets/", Some(&token), &parts).await;
    assert_eq!(status, StatusCode::CREATED, "{tweet}");
    let url = tweet["photo_urls"][0].as_str().expect("a photo url");
    let stored = url.strip_prefix("/media/").expect("root-relative");
    assert_eq!(app.get(url, None).await.status, StatusCode::OK);
    let long = "%F0%9D%91%BB".repeat(40);
    let keys = [
        format!("photos/{long}.jpg"),
        "photos/a%20b.jpg".to_owned(),
        "x".repeat(300),
        format!("{stored}/x"),
        format!("{stored}.png"),
        format!("avatars/x/{}", &stored["photos/".len()..]),
    ];
    for key in keys {
        let res = app.get(&format!("/media/{key}"), None).await;
        assert_eq!(res.status, StatusCode::NOT_FOUND, "{key}: {}", res.body);
    }
}

/// A course front end edits a profile with `PUT /api/profiles/{id}/` (multipart nickname and
/// avatar): served as `PATCH /api/users/{id}/` is, with the same validation; someone else's
/// profile is a 403 and an unknown one a 404, and neither changes anything. (Before, the path
/// was a 404.)
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_courses_profile_path_edits_a_profile_as_the_users_path_does(db: PgPool) {
    let app = TestApp::new(db).await;
    let (id, token) = app.quick_user("face").await;
    let (_, other) = app.quick_user("other").await;
    let uri = format!("/api/profiles/{id}/");
    let parts = [
        Part::Text("nickname", "Face"),
        Part::File("avatar", "me.png", png()),
    ];
    let (status, body) = send(&app, Method::PUT, &uri, Some(&token), &parts).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["nickname"], "Face");
    let avatar = body["avatar_url"].as_str().unwrap().to_owned();
    assert!(
        avatar.starts_with(&format!("/media/avatars/{id}/")),
        "{avatar}"
    );
    let profile = app.get(&format!("/api/users/{id}/"), None).await;
    assert_eq!(profile.body, body, "the profile as the users path shows it");
    let long = "x".repeat(51);
    let bad = [Part::Text("nickname", long.as_str())];
    let (status, errors) = send(&app, Method::PUT, &uri, Some(&token), &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(errors["errors"]["nickname"].is_array(), "{errors}");
    let rename = [Part::Text("nickname", "Not yours")];
    let (status, _) = send(&app, Method::PUT, &uri, Some(&other), &rename).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = send(
        &app,
        Method::PUT,
        "/api/profiles/999999/",
        Some(&token),
        &rename,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, patched) = send(&app, Method::PATCH, &uri, None, &rename).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{patched}");
    let after = app.get(&format!("/api/users/{id}/"), None).await;
    assert_eq!(after.body, body, "nothing changed");
}
