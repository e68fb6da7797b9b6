//! Endless pagination with `created_at__lt` / `created_at__gt` cursors (docs/API.md).
//!
//! Every listing is newest first and its `created_at` values are unique, so a cursor is just a
//! timestamp bound and a page is "the first `want` items strictly inside the bounds".

use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::time::{self, Timestamp};

/// Default items per page.
pub const DEFAULT_PAGE_SIZE: usize = 20;
/// Largest `page_size` a client may ask for.
pub const MAX_PAGE_SIZE: usize = 100;
/// Most items one pull-to-refresh (`created_at__gt` alone) returns.
pub const MAX_REFRESH: usize = 1000;

/// The raw query string parameters; parsed by [`PageQuery::parse`] so that every bad value is a
/// 400 naming the parameter.
#[derive(Debug, Default, Deserialize)]
pub struct PageQuery {
    #[serde(rename = "created_at__lt")]
    pub lt: Option<String>,
    #[serde(rename = "created_at__gt")]
    pub gt: Option<String>,
    pub page_size: Option<String>,
}

/// A validated page request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    /// Only items strictly older than this.
    pub lt: Option<Timestamp>,
    /// Only items strictly newer than this.
    pub gt: Option<Timestamp>,
    /// Items to return at most (`page_size`, or 1000 for a pull-to-refresh).
    pub limit: usize,
}

impl PageRequest {
    /// The newest `limit` items.
    pub fn first(limit: usize) -> Self {
        PageRequest {
            lt: None,
            gt: None,
            limit,
        }
    }

    /// How many items to fetch: one more than the page, to learn whether there is a next page.
    pub fn want(&self) -> usize {
        self.limit + 1
    }

    /// Whether an item with this timestamp lies inside the bounds.
    pub fn contains(&self, t: Timestamp) -> bool {
        self.lt.is_none_or(|lt| t < lt) && self.gt.is_none_or(|gt| t > gt)
    }
}

impl PageQuery {
    /// Validates the parameters: RFC 3339 cursors and `page_size` in 1..=100.
    pub fn parse(&self) -> ApiResult<PageRequest> {
        let mut errors = FieldErrors::new();
        let mut cursor = |name: &str, raw: &Option<String>| -> Option<Timestamp> {
            let raw = raw.as_deref()?;
            let parsed = time::parse_cursor(raw);
            if parsed.is_none() {
                errors.insert(
                    name.to_owned(),
                    vec![
                        "Enter a valid RFC 3339 timestamp, e.g. 2026-11-21T09:16:11.005227Z."
                            .into(),
                    ],
                );
            }
            parsed
        };
        let lt = cursor("created_at__lt", &self.lt);
        let gt = cursor("created_at__gt", &self.gt);
        let page_size = match self.page_size.as_deref().map(str::trim) {
            None => Some(DEFAULT_PAGE_SIZE),
            Some(raw) => match raw.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE_SIZE).contains(&n) => Some(n),
                _ => {
                    errors.insert(
                        "page_size".into(),
                        vec![format!("Enter a whole number from 1 to {MAX_PAGE_SIZE}.")],
                    );
                    None
                }
            },
        };
        if !errors.is_empty() {
            return Err(ApiError::Validation(errors));
        }
        let page_size = page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        // `__gt` alone is a pull-to-refresh: everything newer, up to MAX_REFRESH.
        let limit = if gt.is_some() && lt.is_none() {
            MAX_REFRESH
        } else {
            page_size
        };
        Ok(PageRequest { lt, gt, limit })
    }
}

/// One page of an endless listing: `{"has_next_page": bool, "results": [...]}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Page<T> {
    /// Older items exist (with `created_at__gt`: more than 1,000 were newer).
    pub has_next_page: bool,
    pub results: Vec<T>,
}

impl<T> Page<T> {
    /// Cuts `items` (newest first, up to `req.want()` of them) to the page and sets
    /// `has_next_page` from the extra item.
    pub fn from_items(mut items: Vec<T>, req: &PageRequest) -> Self {
        let has_next_page = items.len() > req.limit;
        items.truncate(req.limit);
        Page {
            has_next_page,
            results: items,
        }
    }

    /// The same page with each item converted, leaving out those `f` drops (`has_next_page`
    /// stays: it says whether the listing goes on).
    pub fn filter_map<U>(self, f: impl FnMut(T) -> Option<U>) -> Page<U> {
        Page {
            has_next_page: self.has_next_page,
            results: self.results.into_iter().filter_map(f).collect(),
        }
    }

    /// The same page with each item converted.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            has_next_page: self.has_next_page,
            results: self.results.into_iter().map(f).collect(),
        }
    }
}
