//! The OpenAPI 3.1 document of the API, generated from the handlers themselves (utoipa and
//! utoipa-axum, as crates.io does): each handler carries its `#[utoipa::path]` (method, path,
//! parameters, body, answers), each route is registered with [`utoipa_axum::routes!`], which
//! adds the route to the router and its operation to the document in one step, so a route can
//! not exist without being documented (`tests/api/openapi.rs` checks that no other way of adding
//! one is used). [`finish`] then adds what every operation shares: the error answers of
//! docs/API.md, the `x-trace-id` header, and the form and multipart forms of every JSON body.
//!
//! Served as `GET /api/openapi.json`, with a documentation page (Scalar) at `GET /api/docs/`.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::http::header::CONTENT_TYPE;
use axum::response::{Html, IntoResponse};
use serde::Serialize;
use utoipa::openapi::header::Header;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, OpenApi, Ref, RefOr, Type};
use utoipa::{IntoParams, Modify, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::state::AppState;

/// The document's fixed part: title, description, tags, the bearer scheme and the error bodies.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "chirp",
        description = "A Twitter-like backend: a cache-aside layer over Postgres. The contract \
            and its guarantees are docs/API.md; this document is generated from the handlers. \
            Every path also answers with a trailing `/`. Listings page with `created_at__lt` \
            (older) and `created_at__gt` (newer, exact refresh).",
        license(name = "MIT OR Apache-2.0"),
    ),
    modifiers(&BearerScheme),
    components(schemas(ValidationError, Failure, Detail)),
    tags(
        (name = "accounts", description = "Sign-up, login, logout"),
        (name = "users", description = "Profiles"),
        (name = "tweets", description = "Tweets and a user's timeline"),
        (name = "newsfeeds", description = "The caller's home timeline (fan-out-on-write, hybrid)"),
        (name = "friendships", description = "Follows"),
        (name = "blocks", description = "Mutes and blocks (private to their owner)"),
        (name = "comments"), (name = "likes"), (name = "lists"), (name = "circles"),
        (name = "hashtags", description = "Hashtag timelines and trends"),
        (name = "notifications"), (name = "media"),
        (name = "chat", description = "Poll-based chat channels"),
        (name = "streams", description = "Server-sent events or NDJSON streams"),
        (name = "operations", description = "Health, metrics and this document"),
    )
)]
pub struct ApiDoc;

/// The `bearer` security scheme: `Authorization: Bearer <token>` (or `Token <token>`).
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, api: &mut OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("A token from signup or login."))
                    .build(),
            ),
        );
    }
}

/// 400 for invalid input: `{"success": false, "message": "Please check input", "errors":
/// {"<field or parameter>": ["<message>", ...]}}`.
#[derive(Serialize, ToSchema)]
pub struct ValidationError {
    pub success: bool,
    pub message: String,
    pub errors: BTreeMap<String, Vec<String>>,
}

/// 400 for a refused action that is not about one field: `{"success": false, "message"}`
/// (a wrong username and password pair).
#[derive(Serialize, ToSchema)]
pub struct Failure {
    pub success: bool,
    pub message: String,
}

/// Every other error (401, 403, 404, 405, 413, 415, 429, 500, 503): `{"detail": "<message>"}`.
#[derive(Serialize, ToSchema)]
pub struct Detail {
    pub detail: String,
}

/// `{"success": true}`.
#[derive(Serialize, ToSchema)]
pub struct Success {
    pub success: bool,
}

/// `{"success": true, "deleted": 0 | 1}`: an idempotent removal and whether it removed anything.
#[derive(Serialize, ToSchema)]
pub struct Deleted {
    pub success: bool,
    #[schema(minimum = 0, maximum = 1)]
    pub deleted: u8,
}

/// `{"success": true, "duplicate": true}`: an idempotent addition that found it done already.
#[derive(Serialize, ToSchema)]
pub struct Duplicate {
    pub success: bool,
    pub duplicate: bool,
}

/// A 201 of an idempotent addition: the new thing (a friendship, a member), or
/// `{"success": true, "duplicate": true}` when it was there already.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum NewOrDuplicate<T> {
    New(T),
    Duplicate(Duplicate),
}

impl<T> NewOrDuplicate<T> {
    /// `{"success": true, "duplicate": true}`.
    pub fn duplicate() -> Self {
        NewOrDuplicate::Duplicate(Duplicate {
            success: true,
            duplicate: true,
        })
    }
}

/// One page of an endless listing (timelines are rendered from cached JSON in its shape).
pub use crate::pagination::Page;

/// A newsfeed entry: `{"id", "created_at", "tweet": Tweet}` (`id` is the caller's newsfeed
/// row, or the tweet's id negated for a pulled tweet; `created_at` is the entry's time in the
/// newsfeed, which is the tweet's or later for a late arrival).
#[derive(Serialize, ToSchema)]
pub struct NewsFeed {
    pub id: i64,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: crate::time::Timestamp,
    pub tweet: crate::tweets::Tweet,
}

/// The endless pagination of docs/API.md: no cursor for the newest page, `created_at__lt` for
/// older items, `created_at__gt` for newer ones (a refresh: all of them, up to 1,000).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items strictly older than this RFC 3339 time ("load more").
    #[param(rename = "created_at__lt", value_type = Option<String>, format = DateTime)]
    pub created_at_lt: Option<String>,
    /// Items strictly newer than this RFC 3339 time ("pull to refresh").
    #[param(rename = "created_at__gt", value_type = Option<String>, format = DateTime)]
    pub created_at_gt: Option<String>,
    /// Items per page, 1–100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub page_size: Option<u32>,
}

/// The router of these two routes (added by [`super::routes`]).
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(openapi_json))
        .routes(routes!(docs))
}

/// The whole document, built once from [`super::routes`] and [`finish`]ed.
pub fn document() -> &'static OpenApi {
    static DOC: OnceLock<OpenApi> = OnceLock::new();
    DOC.get_or_init(|| finish(super::routes().split_for_parts().1))
}

/// This document as JSON.
#[utoipa::path(get, path = "/api/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document",
        content_type = "application/json")))]
async fn openapi_json() -> Result<impl IntoResponse, ApiError> {
    static JSON: OnceLock<String> = OnceLock::new();
    let json = match JSON.get() {
        Some(json) => json,
        None => {
            let json = document().to_pretty_json().map_err(|e| {
                ApiError::Internal(anyhow::Error::new(e).context("serializing the document"))
            })?;
            JSON.get_or_init(|| json)
        }
    };
    Ok(([(CONTENT_TYPE, "application/json")], json.as_str()))
}

/// A documentation page for this document (Scalar; its script comes from a CDN).
#[utoipa::path(get, path = "/api/docs", tag = "operations",
    responses((status = 200, description = "An HTML page", content_type = "text/html")))]
async fn docs() -> Html<&'static str> {
    static HTML: OnceLock<String> = OnceLock::new();
    Html(HTML.get_or_init(|| {
        utoipa_scalar::Scalar::new(document().clone())
            .title("chirp API")
            .to_html()
    }))
}

/// Adds what every operation shares (docs/API.md "General"): the `x-trace-id` header on every
/// answer; 401 (a bad token is refused on every route), 429 and 503 (rate limits and the
/// request time limit, not on the probes) and 500 everywhere; 404 where the path or the query
/// names an id; 400 where there are parameters (a path id too: following oneself) or a body;
/// 413 and 415 where there is a body, and a JSON body's schema also as a form and a multipart
/// body. Operation ids become unique (`<tag>_<handler>`, and `_<method>` for a handler of two
/// methods), the [`LINKS`] go on their answers, and the wildcard media path becomes an
/// OpenAPI template.
pub fn finish(mut api: OpenApi) -> OpenApi {
    let paths = std::mem::take(&mut api.paths.paths);
    for (path, mut item) in paths {
        let probe = matches!(path.as_str(), "/livez" | "/healthz");
        let shared = operations(&mut item).count() > 1
            && item.put.as_ref().map(|o| &o.operation_id)
                == item.patch.as_ref().map(|o| &o.operation_id);
        for (method, op) in operations(&mut item) {
            complete(op, path.contains('{'), probe);
            let tag = op
                .tags
                .as_ref()
                .and_then(|t| t.first())
                .cloned()
                .unwrap_or_default();
            let name = op.operation_id.take().unwrap_or_default();
            op.operation_id = Some(
                match (shared && matches!(method, "put" | "patch"), tag.is_empty()) {
                    (true, _) => format!("{tag}_{name}_{method}"),
                    (false, false) => format!("{tag}_{name}"),
                    (false, true) => name,
                },
            );
        }
        let path = path.replace("{*key}", "{key}");
        api.paths.paths.insert(path, item);
    }
    link(&mut api);
    api
}

/// The links of the document (OpenAPI "links"): from an answer to the operations that take
/// what it made, for clients and for the stateful phase of the schema fuzzer
/// (`scripts/fuzz-api`). Each is (operation, status, link name, target operation, parameters,
/// request body), values as OpenAPI runtime expressions.
#[rustfmt::skip]
const LINKS: &[LinkSpec] = &[
    ("accounts_signup", "201", "Profile", "users_profile", &[("id", "$response.body#/user/id")], None),
    ("accounts_signup", "201", "Follow", "friendships_follow", &[("id", "$response.body#/user/id")], None),
    ("tweets_create", "201", "Detail", "tweets_detail", &[("id", "$response.body#/id")], None),
    ("tweets_create", "201", "Comments", "comments_list", &[("tweet_id", "$response.body#/id")], None),
    ("tweets_create", "201", "Comment", "comments_create", &[],
        Some(r#"{"tweet_id": "$response.body#/id", "content": "a comment"}"#)),
    ("tweets_create", "201", "Like", "likes_like", &[],
        Some(r#"{"content_type": "tweet", "object_id": "$response.body#/id"}"#)),
    ("tweets_create", "201", "Delete", "tweets_remove", &[("id", "$response.body#/id")], None),
    ("comments_create", "201", "Edit", "comments_edit", &[("id", "$response.body#/id")], None),
    ("comments_create", "201", "Like", "likes_like", &[],
        Some(r#"{"content_type": "comment", "object_id": "$response.body#/id"}"#)),
    ("comments_create", "201", "Delete", "comments_remove", &[("id", "$response.body#/id")], None),
    ("lists_create", "201", "Detail", "lists_detail", &[("id", "$response.body#/id")], None),
    ("lists_create", "201", "AddMember", "lists_add_member", &[("id", "$response.body#/id")], None),
    ("lists_create", "201", "Timeline", "lists_list_timeline", &[("id", "$response.body#/id")], None),
    ("lists_create", "201", "Delete", "lists_remove", &[("id", "$response.body#/id")], None),
    ("circles_create", "201", "Detail", "circles_detail", &[("id", "$response.body#/id")], None),
    ("circles_create", "201", "Tweets", "circles_circle_tweets", &[("id", "$response.body#/id")], None),
    ("circles_create", "201", "Rank", "circles_rank", &[("id", "$response.body#/id")], None),
    ("circles_create", "201", "Leave", "circles_leave", &[("id", "$response.body#/id")], None),
    ("chat_create", "201", "Send", "chat_send", &[("id", "$response.body#/id")], None),
    ("chat_create", "201", "Poll", "chat_poll", &[("id", "$response.body#/id")], None),
    ("chat_create", "201", "Read", "chat_read", &[("id", "$response.body#/id")], None),
];

/// One link: (operation id, status, link name, target operation id, parameters, request body).
type LinkSpec = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
);

fn link(api: &mut OpenApi) {
    for (from, status, name, to, params, body) in LINKS {
        let ops = api.paths.paths.values_mut().flat_map(operations);
        let Some((_, op)) = ops
            .into_iter()
            .find(|(_, op)| op.operation_id.as_deref() == Some(from))
        else {
            continue;
        };
        let Some(RefOr::T(response)) = op.responses.responses.get_mut(*status) else {
            continue;
        };
        let mut built = LinkBuilder::new().operation_id(*to);
        for (param, value) in *params {
            built = built.parameter(*param, *value);
        }
        let body = body.and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok());
        response.links.insert(
            (*name).to_owned(),
            RefOr::T(built.request_body(body).build()),
        );
    }
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = (&'static str, &mut Operation)> {
    [
        ("get", item.get.as_mut()),
        ("post", item.post.as_mut()),
        ("put", item.put.as_mut()),
        ("patch", item.patch.as_mut()),
        ("delete", item.delete.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, op)| Some((method, op?)))
}

/// A response header of one JSON type.
fn header(of: Type, description: &str) -> RefOr<Header> {
    RefOr::T(
        HeaderBuilder::new()
            .schema(Some(ObjectBuilder::new().schema_type(of)))
            .description(Some(description))
            .build(),
    )
}

fn detail(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Detail")))
                .build(),
        )
        .build()
}

fn complete(op: &mut Operation, has_path_id: bool, probe: bool) {
    let params = op.parameters.iter().flatten().filter_map(|p| match p {
        RefOr::T(p) => Some(p),
        RefOr::Ref(_) => None,
    });
    let has_params = params.clone().next().is_some();
    // An id in the query names a resource too (`GET /api/tweets/?user_id=X`).
    let names_resource = has_path_id
        || params
            .clone()
            .any(|p| p.parameter_in == ParameterIn::Query && p.name.ends_with("_id"));
    if let Some(RefOr::T(body)) = op.request_body.as_mut()
        && let Some(json) = body.content.get("application/json").cloned()
    {
        for form in ["application/x-www-form-urlencoded", "multipart/form-data"] {
            body.content
                .entry(form.to_owned())
                .or_insert_with(|| json.clone());
        }
    }
    let has_body = op.request_body.is_some();
    let mut add = |status: &str, response: Response| {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert(RefOr::T(response));
    };
    if has_params || has_body {
        add(
            "400",
            ResponseBuilder::new()
                .description("Invalid input: the fields or parameters at fault")
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(
                            AnyOfBuilder::new()
                                .item(Ref::from_schema_name("ValidationError"))
                                .item(Ref::from_schema_name("Failure")),
                        ))
                        .build(),
                )
                .build(),
        );
    }
    add(
        "401",
        detail("A token that is malformed, unknown or revoked (or none where one is needed)"),
    );
    if names_resource {
        add(
            "404",
            detail("No such resource (also: a path id that is not an integer)"),
        );
    }
    if has_body {
        add("413", detail("The body is too large"));
        add("415", detail("The body is not JSON, a form or multipart"));
    }
    if !probe {
        let mut limited = detail("Rate limited; retry after `Retry-After` seconds");
        limited.headers.insert(
            "Retry-After".into(),
            header(Type::Integer, "Seconds to wait"),
        );
        add("429", limited);
        add(
            "503",
            detail("Busy (see `Retry-After`) or the request timed out"),
        );
    }
    add("500", detail("Internal error; nothing internal is sent"));
    for response in op.responses.responses.values_mut() {
        if let RefOr::T(response) = response {
            response.headers.insert(
                "x-trace-id".into(),
                header(Type::String, "The request's trace id (32 hex digits)"),
            );
        }
    }
}
