//! The client's IP address, the subject of anonymous rate limits and of the failed-authentication
//! limit: the TCP peer's, or, when the peer is a configured trusted proxy
//! (`CHIRP_TRUSTED_PROXIES`), the address that proxy forwarded in the one header it writes
//! (`CHIRP_FORWARDED_HEADER`: `X-Forwarded-For` by default, or RFC 7239's `Forwarded: for=`),
//! read from the right and skipping further trusted proxies, as nginx's `real_ip_recursive`
//! and Express's `trust proxy` do. Only that header is read: proxies append to the one they
//! write and pass the other through as the client sent it. A client that is not behind a
//! trusted proxy can not choose its address by sending these headers. IPv4 peers of a
//! dual-stack listener (`::ffff:a.b.c.d`) count as IPv4.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;

pub use crate::config::{ForwardedHeader, TrustedProxies};
use crate::state::AppState;

/// The client's address, as resolved by [`resolve`] (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

impl ClientIp {
    /// The request's client address ([`resolve`] stored it), if known.
    pub fn of<B>(req: &axum::http::Request<B>) -> Option<ClientIp> {
        req.extensions().get::<ClientIp>().copied()
    }

    /// [`ClientIp::subject`], or `iunknown` (a request served without a peer address).
    pub fn subject_of(client: Option<ClientIp>) -> String {
        client.map_or_else(|| "iunknown".to_owned(), ClientIp::subject)
    }

    /// The rate-limit subject: `i` and the IPv4 address, or the IPv6 address's /64 network
    /// (one host is given a whole /64, so per-address limits would not hold an IPv6 client).
    pub fn subject(self) -> String {
        match self.0 {
            IpAddr::V4(v4) => format!("i{v4}"),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => format!("i{v4}"),
                None => {
                    let net = ipnet::Ipv6Net::new(v6, 64).map_or(v6, |n| n.network());
                    format!("i{net}/64")
                }
            },
        }
    }
}

/// Middleware (outermost of the API's own): stores the request's [`ClientIp`].
pub async fn resolve(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    if let Some(peer) = peer {
        let ip = client_ip(
            peer,
            req.headers(),
            &state.config.trusted_proxies,
            state.config.forwarded_header,
        );
        req.extensions_mut().insert(ClientIp(ip));
    }
    next.run(req).await
}

/// The client's address behind `peer`: the rightmost address in `header` that is not a
/// trusted proxy (the leftmost if all are), or `peer` itself if it is not trusted or forwarded
/// nothing readable.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
    header: ForwardedHeader,
) -> IpAddr {
    let peer = peer.to_canonical();
    if !trusted.trusts(peer) {
        return peer;
    }
    let chain = match header {
        ForwardedHeader::XForwardedFor => x_forwarded_for(headers),
        ForwardedHeader::Forwarded => forwarded(headers),
    };
    let mut client = peer;
    for hop in chain.into_iter().rev() {
        let Some(ip) = hop else {
            // Unreadable (`unknown`, an obfuscated name): stop at the last hop known.
            break;
        };
        client = ip.to_canonical();
        if !trusted.trusts(client) {
            break;
        }
    }
    client
}

/// The `for=` of every element of every `Forwarded` header, left to right (`None` where a hop
/// is not an address).
fn forwarded(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all("forwarded")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_node(value.trim().trim_matches('"')))
            })
        })
        .collect()
}

/// Every address of every `X-Forwarded-For` header, left to right.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|hop| parse_node(hop.trim()))
        .collect()
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]`, `[::1]:80`.
fn parse_node(raw: &str) -> Option<IpAddr> {
    if let Ok(ip) = raw.parse() {
        return Some(ip);
    }
    if let Ok(addr) = raw.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    raw.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    fn ip(raw: &str) -> IpAddr {
        raw.parse().unwrap()
    }

    #[test]
    fn forwarding_headers_count_only_from_trusted_proxies() {
        let trusted = TrustedProxies::parse("10.0.0.0/8, 192.168.1.1").unwrap();
        let xff = ForwardedHeader::XForwardedFor;
        let chain = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4")]);
        // An untrusted peer can not choose its address.
        assert_eq!(
            client_ip(ip("5.5.5.5"), &chain, &trusted, xff),
            ip("5.5.5.5")
        );
        // A trusted one forwarded the rightmost address; the client made up the rest.
        assert_eq!(
            client_ip(ip("10.1.2.3"), &chain, &trusted, xff),
            ip("1.2.3.4")
        );
        // Also when it reaches a dual-stack listener as an IPv4-mapped address.
        assert_eq!(
            client_ip(ip("::ffff:10.1.2.3"), &chain, &trusted, xff),
            ip("1.2.3.4")
        );
        // Two trusted hops in a row are skipped.
        let two = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 192.168.1.1")]);
        assert_eq!(
            client_ip(ip("10.1.2.3"), &two, &trusted, xff),
            ip("1.2.3.4")
        );
        // Several header lines form one list.
        let lines = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(
            client_ip(ip("10.1.2.3"), &lines, &trusted, xff),
            ip("1.2.3.4")
        );
        // Only the configured header counts: a client's own `Forwarded` passed through a proxy
        // that appends to `X-Forwarded-For` changes nothing, and the other way round.
        let both = headers(&[
            (
                "forwarded",
                r#"for=6.6.6.6, for="[2001:db8::1]:4711";proto=https"#,
            ),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(
            client_ip(ip("10.1.2.3"), &both, &trusted, xff),
            ip("1.2.3.4")
        );
        assert_eq!(
            client_ip(ip("10.1.2.3"), &both, &trusted, ForwardedHeader::Forwarded),
            ip("2001:db8::1")
        );
        // Nothing forwarded, or nothing readable: the peer.
        assert_eq!(
            client_ip(ip("10.1.2.3"), &HeaderMap::new(), &trusted, xff),
            ip("10.1.2.3")
        );
        let unknown = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(
            client_ip(
                ip("10.1.2.3"),
                &unknown,
                &trusted,
                ForwardedHeader::Forwarded
            ),
            ip("10.1.2.3")
        );
        assert!(TrustedProxies::parse("10.0.0.0/33").is_err());
        assert!(TrustedProxies::parse("proxy.local").is_err());
        assert_eq!(TrustedProxies::parse(""), Ok(TrustedProxies::default()));
    }

    #[test]
    fn an_ipv6_client_is_limited_by_its_64_network() {
        let a = ClientIp(ip("2001:db8:1:2:aaaa::1")).subject();
        let b = ClientIp(ip("2001:db8:1:2:bbbb::9")).subject();
        assert_eq!(a, b);
        assert_eq!(a, "i2001:db8:1:2::/64");
        assert_eq!(ClientIp(ip("::ffff:1.2.3.4")).subject(), "i1.2.3.4");
        assert_eq!(ClientIp(ip("1.2.3.4")).subject(), "i1.2.3.4");
    }
}
