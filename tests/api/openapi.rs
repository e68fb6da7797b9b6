//! The generated OpenAPI document (issue 39): it covers every route, it is what
//! `GET /api/openapi.json` serves, and every change to it shows in review as a snapshot diff.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use sqlx::PgPool;

use crate::helpers::TestApp;

/// `METHOD /path` of every operation of the document, path ids named `{}`.
fn documented() -> BTreeSet<String> {
    let doc = serde_json::to_value(chirp::http::openapi::document()).expect("serializes");
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                ops.insert(format!("{} {}", method.to_uppercase(), anonymous(path)));
            }
        }
    }
    ops
}

/// `/api/lists/{id}/members/{user_id}/` → `/api/lists/{}/members/{}` (no trailing slash).
fn anonymous(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.trim_end_matches('/').chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' => in_param = false,
            _ if !in_param => out.push(c),
            _ => {}
        }
    }
    out
}

/// Every `METHOD /path` docs/API.md names in its tables and text (`GET or POST /x`,
/// `PATCH/PUT /x` and `/x , /y` name several).
fn contract() -> BTreeSet<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/API.md"))
        .expect("docs/API.md");
    let mut ops = BTreeSet::new();
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '|' || c == '`')
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        let methods: Vec<&str> = w
            .split('/')
            .filter(|m| ["GET", "POST", "PUT", "PATCH", "DELETE"].contains(m))
            .collect();
        if methods.is_empty() || methods.join("/") != *w {
            continue;
        }
        // `GET or POST /path`: the methods before `or` share the path.
        let (mut methods, mut j) = (methods, i + 1);
        while words.get(j) == Some(&"or") {
            methods.push(words[j + 1]);
            j += 2;
        }
        let Some(path) = words.get(j).filter(|p| p.starts_with('/')) else {
            continue;
        };
        let path = path.split('?').next().unwrap_or(path);
        let path = path.trim_end_matches([',', '.', ':', ';', ')']);
        let mut paths = vec![path.to_owned()];
        // `POST /api/circles/{id}/join/ , /leave/`.
        if words.get(j + 1) == Some(&",")
            && let Some(sibling) = words.get(j + 2).filter(|p| p.starts_with('/'))
        {
            let base = path.trim_end_matches('/').rsplit_once('/').map(|(b, _)| b);
            paths.push(format!("{}{sibling}", base.unwrap_or("")));
        }
        for method in &methods {
            for path in &paths {
                ops.insert(format!("{method} {}", anonymous(path)));
            }
        }
    }
    ops
}

/// Every operation of the contract is in the document, and the document has nothing the
/// contract does not name (besides chirp's own extras, listed here).
#[test]
fn document_covers_every_route_of_the_contract() {
    let doc = documented();
    let contract = contract();
    assert!(
        contract.len() > 50,
        "the contract parser found only {contract:?}"
    );
    let missing: Vec<_> = contract.difference(&doc).collect();
    assert!(
        missing.is_empty(),
        "routes of docs/API.md without an operation: {missing:?}"
    );
    // docs/API.md names a photo's URL, not its route.
    let extras = ["GET /media/{}"];
    let unnamed: Vec<_> = (doc.difference(&contract))
        .filter(|op| !extras.contains(&op.as_str()))
        .collect();
    assert!(
        unnamed.is_empty(),
        "operations docs/API.md does not name: {unnamed:?}"
    );
}

/// A route can only be added with utoipa-axum's `routes!`, which documents it: no module of
/// the crate calls axum's own `route`, `route_service` or `nest` (that is how a route the
/// document lacks would come in).
#[test]
fn every_route_is_added_with_its_operation() {
    let mut sources = vec![std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src"
    ))];
    let mut files = Vec::new();
    while let Some(path) = sources.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("a source directory") {
                sources.push(entry.expect("entry").path());
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    assert!(files.len() > 50, "{files:?}");
    let mut offenders = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("source");
        // An axum route takes its path first (`subscriber.route(TOPIC, …)` is pub/sub).
        for call in [".route(", ".route_service(", ".nest(", ".nest_service("] {
            for (at, _) in text.match_indices(call) {
                let rest = text[at + call.len()..].trim_start();
                let line = text[..at].rsplit('\n').next().unwrap_or("");
                if rest.starts_with('"') && !line.contains("//") {
                    let n = text[..at].lines().count();
                    offenders.push(format!("{}:{n}: {line}{call}", path.display()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "routes added without an operation: {offenders:#?}"
    );
}

/// Every change to the document shows in review: the snapshot is
/// tests/api/snapshots/api__openapi__document.snap (`cargo insta review`, or
/// `INSTA_UPDATE=always cargo test --test api openapi` and read the diff).
#[test]
fn document() {
    let mut doc = chirp::http::openapi::document().clone();
    // The crate's version is not the document's content.
    doc.info.version = "[version]".into();
    insta::assert_snapshot!(doc.to_pretty_json().expect("serializes"));
}

/// Operation ids are unique, every `$ref` names a schema of the document, and every link
/// leads from an operation to an operation of the document.
#[test]
fn the_document_is_consistent() {
    let doc = serde_json::to_value(chirp::http::openapi::document()).expect("serializes");
    let mut ids = BTreeSet::new();
    let mut links = Vec::new();
    for item in doc["paths"].as_object().expect("paths").values() {
        for op in item.as_object().expect("path item").values() {
            let id = op["operationId"].as_str().expect("an operation id");
            assert!(ids.insert(id.to_owned()), "operation id {id} twice");
            for response in op["responses"].as_object().expect("responses").values() {
                for link in response["links"]
                    .as_object()
                    .into_iter()
                    .flat_map(|l| l.values())
                {
                    links.push((
                        id.to_owned(),
                        link["operationId"].as_str().expect("target").to_owned(),
                    ));
                }
            }
        }
    }
    assert_eq!(links.len(), 21, "every link of openapi::LINKS: {links:?}");
    for (from, to) in &links {
        assert!(
            ids.contains(to),
            "a link from {from} to {to}, which is no operation"
        );
    }
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    let text = doc.to_string();
    for reference in text.split("\"$ref\":\"").skip(1) {
        let name = reference.split('"').next().unwrap_or("");
        let name = name
            .strip_prefix("#/components/schemas/")
            .expect("a schema reference");
        assert!(
            schemas.contains_key(name),
            "a $ref to {name}, which is no schema"
        );
    }
}

/// `GET /api/openapi.json` serves the document (OpenAPI 3.1, with and without the trailing
/// slash), and `/api/docs/` a page that shows it.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_document_and_its_page_are_served(db: PgPool) {
    let app = TestApp::new(db).await;
    let (status, kind, text) = app.get_text("/api/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(kind.starts_with("application/json"), "{kind}");
    let served: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let generated = serde_json::to_value(chirp::http::openapi::document()).expect("serializes");
    assert_eq!(served, generated);
    assert_eq!(served["openapi"], "3.1.0");
    let (status, kind, html) = app.get_text("/api/docs/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(kind.starts_with("text/html"), "{kind}");
    assert!(
        html.contains("\"/api/tweets\""),
        "the page embeds the document"
    );
}

/// The statuses the document gives `method path` (its template, e.g. `/api/lists/{id}`).
fn statuses(method: &str, path: &str) -> Vec<String> {
    let doc = serde_json::to_value(chirp::http::openapi::document()).expect("serializes");
    let responses = doc["paths"][path][method]["responses"]
        .as_object()
        .unwrap_or_else(|| panic!("no operation {method} {path}"));
    responses.keys().cloned().collect()
}

/// What the schema fuzzer found on its first run (scripts/fuzz-api): error answers the document
/// did not describe. Following oneself is a 400 on a route whose only parameter is in the path;
/// a query id of no user is a 404; a 400's body matched both error schemas, which `oneOf`
/// forbids (it is `anyOf` now).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_error_answers_the_fuzzer_found_are_documented(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, token) = app.signup("alice").await;
    let cases = [
        (
            "post",
            "/api/friendships/{id}/follow",
            format!("/api/friendships/{alice}/follow/"),
        ),
        (
            "post",
            "/api/friendships/{id}/unfollow",
            format!("/api/friendships/{alice}/unfollow/"),
        ),
        ("get", "/api/lists", "/api/lists/?user_id=999999".to_owned()),
        (
            "get",
            "/api/tweets",
            "/api/tweets/?user_id=999999".to_owned(),
        ),
        (
            "get",
            "/api/chat/channels",
            "/api/chat/channels/?page_size=0".to_owned(),
        ),
    ];
    for (method, template, uri) in cases {
        let res = match method {
            "post" => app.post(&uri, Some(&token), serde_json::json!({})).await,
            _ => app.get(&uri, Some(&token)).await,
        };
        assert!(res.status.is_client_error(), "{uri}: {}", res.status);
        let documented = statuses(method, template);
        assert!(
            documented.contains(&res.status.as_str().to_owned()),
            "{method} {uri} answered {} but the document gives {documented:?}",
            res.status
        );
    }
    let doc = serde_json::to_value(chirp::http::openapi::document()).expect("serializes");
    let schema = &doc["paths"]["/api/chat/channels"]["get"]["responses"]["400"]["content"]["application/json"]
        ["schema"];
    assert!(schema.get("anyOf").is_some(), "{schema}");
}
