//! Trace ids that follow a write from its request to the jobs it queued: a slow fan-out can be
//! followed back to its post.
//!
//! Each request gets a 128-bit trace id: the trace-id of its W3C Trace Context `traceparent`
//! header when it sends a valid one (so chirp joins the caller's trace), else a random one. The
//! id is in the request's log span (`trace_id`), in the `x-trace-id` response header, and, for
//! the handler's task, in a task-local ([`TraceId::current`]) that [`crate::jobs::enqueue`]
//! (and a compose's insert, [`crate::queue_fanout!`]) stores on each job row (`jobs.trace_id`).
//! A worker runs each job in a span with that `trace_id`, and within [`TraceId::scope`], so the
//! jobs a job queues (a fan-out's parts) carry it too.

use std::fmt;
use std::future::Future;

use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static CURRENT: Option<TraceId>;
}

/// A 128-bit trace id, written as 32 lowercase hex digits (W3C Trace Context's trace-id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(u128);

impl TraceId {
    /// A random, non-zero id.
    pub fn random() -> Self {
        TraceId(rand::random::<u128>().max(1))
    }

    /// The trace-id of a `traceparent` header (`00-{32 hex}-{16 hex}-{2 hex}`, lowercase);
    /// `None` if it is malformed or its trace-id or parent-id is all zeros (invalid by the
    /// spec).
    pub fn from_traceparent(header: &str) -> Option<Self> {
        let mut parts = header.trim().split('-');
        let (version, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if !(hex(version, 2) && version != "ff" && hex(parent, 16) && hex(flags, 2))
            || parent.bytes().all(|b| b == b'0')
        {
            return None;
        }
        if version == "00" && parts.next().is_some() {
            return None;
        }
        Self::parse(trace)
    }

    /// An id from its 32 hex digits; `None` if malformed or zero.
    pub fn parse(digits: &str) -> Option<Self> {
        if !hex(digits, 32) {
            return None;
        }
        u128::from_str_radix(digits, 16)
            .ok()
            .filter(|v| *v != 0)
            .map(TraceId)
    }

    /// The id of the task running now (a request's handler, or a job), if it has one.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(|t| *t).ok().flatten()
    }

    /// `fut`, run with `trace` as [`TraceId::current`] whenever it is polled (tokio's
    /// task-local future, with no `async fn` around it).
    pub fn scope<F: Future>(trace: Option<TraceId>, fut: F) -> TaskLocalFuture<Option<Self>, F> {
        CURRENT.scope(trace, fut)
    }

    /// Calls `f` with `trace` as [`TraceId::current`] (for the synchronous part of a
    /// request's layers: spans are made when a service is called, not polled).
    pub fn sync_scope<R>(trace: Option<TraceId>, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(trace, f)
    }
}

/// Whether `s` is `n` lowercase hex digits (W3C Trace Context allows no uppercase).
fn hex(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl TraceId {
    /// The id as an `x-trace-id` header value: 32 lowercase hex digits, written without
    /// `fmt` (this runs on every request).
    pub fn header_value(&self) -> Option<axum::http::HeaderValue> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0u8; 32];
        for (i, digit) in digits.iter_mut().enumerate() {
            *digit = HEX[((self.0 >> (124 - 4 * i)) & 0xf) as usize];
        }
        axum::http::HeaderValue::from_bytes(&digits).ok()
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_value_is_the_display_form() {
        for id in [
            TraceId(1),
            TraceId(u128::MAX),
            TraceId::random(),
            TraceId(0x0123_4567_89ab_cdef << 64),
        ] {
            let header = id.header_value().expect("a header value");
            assert_eq!(header.to_str().expect("ASCII"), id.to_string());
        }
    }

    #[test]
    fn a_traceparent_gives_its_trace_id_and_a_bad_one_none() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        let good = format!("00-{id}-00f067aa0ba902b7-01");
        assert_eq!(
            TraceId::from_traceparent(&good).map(|t| t.to_string()),
            Some(id.to_owned())
        );
        for bad in [
            "".to_owned(),
            format!("00-{id}-00f067aa0ba902b7"),
            format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
            format!("ff-{id}-00f067aa0ba902b7-01"),
            format!("00-{id}-00f067aa0ba902b7-01-extra"),
            format!("00-{}-00f067aa0ba902b7-01", &id[1..]),
            format!("00-{id}x-00f067aa0ba902b7-01"),
            format!("00-{}-00f067aa0ba902b7-01", id.to_uppercase()),
            format!("00-{id}-0000000000000000-01"),
        ] {
            assert_eq!(TraceId::from_traceparent(&bad), None, "{bad}");
        }
        // A later version may add fields.
        assert!(TraceId::from_traceparent(&format!("01-{id}-00f067aa0ba902b7-01-x")).is_some());
        assert_eq!(TraceId::random().to_string().len(), 32);
    }
}
