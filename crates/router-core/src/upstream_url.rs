//! Engine server URLs: the one check that config, the admin gRPC service, the HTTP admin
//! endpoints and the replicated state machine all use, so a URL that one of them accepts
//! is accepted by every other, and the server set holds each server under one spelling.

/// A valid engine server URL, normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `http://host:port` (scheme and host lowercased, no trailing slash): the server's
    /// identity in the server set.
    pub url: String,
    /// `host:port` (port 80 when the URL gave none), for connecting and for `Host`.
    pub authority: String,
}

/// Why a URL is not an engine server URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not `http://`.
    #[error("only http:// upstream URLs are supported")]
    Scheme,
    /// `user:pass@host`: credentials would show up in `/health`, metrics and logs.
    #[error("credentials in the URL are not allowed (set upstream_token instead)")]
    Credentials,
    /// No host.
    #[error("missing host")]
    MissingHost,
    /// A host with characters no host name or IP address has.
    #[error("bad host '{0}'")]
    BadHost(String),
    /// A port that is not 1..=65535.
    #[error("bad port '{0}' (expected 1-65535)")]
    BadPort(String),
    /// A path, query or fragment: the router sends the client's path (`/v1/...`) to the
    /// server's root.
    #[error("give the server's base URL as http://host:port, without a path, query or fragment")]
    Path,
}

/// Checks and normalizes an engine server URL: `http://host[:port]` with an optional
/// trailing slash; host a DNS name, an IPv4 address or a bracketed IPv6 address.
pub fn parse_upstream_url(url: &str) -> Result<UpstreamUrl, UrlError> {
    let url = url.trim();
    let rest = match url.get(..7) {
        Some(s) if s.eq_ignore_ascii_case("http://") => &url[7..],
        _ => return Err(UrlError::Scheme),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(UrlError::Path);
    }
    if rest.contains('@') {
        return Err(UrlError::Credentials);
    }
    let (host, port) = split_host_port(rest)?;
    if host.is_empty() {
        return Err(UrlError::MissingHost);
    }
    let ok_host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        host.len() <= 253
            && host
                .split('.')
                .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(is_label_byte))
    };
    if !ok_host {
        return Err(UrlError::BadHost(host.to_owned()));
    }
    let port = match port {
        None => 80,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(UrlError::BadPort(p.to_owned())),
        },
    };
    let host = host.to_ascii_lowercase();
    let authority = format!("{host}:{port}");
    Ok(UpstreamUrl {
        url: format!("http://{authority}"),
        authority,
    })
}

fn is_label_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// `host[:port]`, where host may be a bracketed IPv6 address.
fn split_host_port(s: &str) -> Result<(&str, Option<&str>), UrlError> {
    if s.starts_with('[') {
        let close = s.find(']').ok_or_else(|| UrlError::BadHost(s.to_owned()))?;
        let (host, tail) = s.split_at(close + 1);
        return match tail {
            "" => Ok((host, None)),
            t => match t.strip_prefix(':') {
                Some(p) => Ok((host, Some(p))),
                None => Err(UrlError::BadHost(s.to_owned())),
            },
        };
    }
    Ok(match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_urls_are_normalized() {
        for (given, url, authority) in [
            (
                "http://127.0.0.1:9001",
                "http://127.0.0.1:9001",
                "127.0.0.1:9001",
            ),
            (
                " http://Engine-1:8000/ ",
                "http://engine-1:8000",
                "engine-1:8000",
            ),
            ("HTTP://a.b.c", "http://a.b.c:80", "a.b.c:80"),
            ("http://[::1]:9000", "http://[::1]:9000", "[::1]:9000"),
        ] {
            let u = parse_upstream_url(given).unwrap();
            assert_eq!((u.url.as_str(), u.authority.as_str()), (url, authority));
            // Normalizing is idempotent: a normalized URL is its own spelling.
            assert_eq!(parse_upstream_url(&u.url).unwrap(), u);
        }
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for (given, err) in [
            ("https://a:1", UrlError::Scheme),
            ("ftp://a:1", UrlError::Scheme),
            ("a:1", UrlError::Scheme),
            ("http://user:pass@a:1", UrlError::Credentials),
            ("http://a:1/v1", UrlError::Path),
            ("http://a:1?x=1", UrlError::Path),
            ("http://a:1#f", UrlError::Path),
            ("http://", UrlError::MissingHost),
            ("http://:80", UrlError::MissingHost),
            ("http://a:0", UrlError::BadPort("0".into())),
            ("http://a:99999", UrlError::BadPort("99999".into())),
            ("http://a:+80", UrlError::BadPort("+80".into())),
            ("http://a:", UrlError::BadPort(String::new())),
            ("http://a b:1", UrlError::BadHost("a b".into())),
            ("http://a..b:1", UrlError::BadHost("a..b".into())),
            ("http://[zz]:1", UrlError::BadHost("[zz]".into())),
        ] {
            assert_eq!(parse_upstream_url(given), Err(err), "{given}");
        }
    }
}
