//! Which headers cross the proxy. Hop-by-hop headers (RFC 9110 §7.6.1) and the ones named in
//! `Connection` belong to one connection and are never forwarded, in either direction.

use http::header::{self, HeaderMap, HeaderName};

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
];

/// `from` without hop-by-hop headers, the headers `Connection` names, and `drop`, in the same
/// order. When there is nothing to leave out (the usual case for a response), `from` is
/// returned as it is, without a copy.
pub fn end_to_end(from: HeaderMap, drop: &[HeaderName]) -> HeaderMap {
    let named: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    let leave_out = |name: &HeaderName| {
        HOP_BY_HOP.contains(name) || drop.contains(name) || named.iter().any(|n| n == name.as_str())
    };
    if !from.keys().any(leave_out) {
        return from;
    }
    let mut out = HeaderMap::with_capacity(from.len());
    for (name, value) in &from {
        if !leave_out(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// The API key of a request: `Authorization: Bearer …`, Azure's `api-key`, or Anthropic's
/// `x-api-key`.
pub fn api_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(auth) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let key = auth
            .strip_prefix("Bearer ")
            .or_else(|| auth.strip_prefix("bearer "))
            .unwrap_or(auth);
        return Some(key.trim());
    }
    headers
        .get("api-key")
        .or_else(|| headers.get("x-api-key"))
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn drops_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret-Hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::HOST, HeaderValue::from_static("proxy"));
        h.append("x-multi", HeaderValue::from_static("a"));
        h.append("x-multi", HeaderValue::from_static("b"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        let out = end_to_end(h, &[header::HOST]);
        let names: Vec<_> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-multi", "authorization"]);
        assert_eq!(out.get_all("x-multi").iter().count(), 2);
    }

    #[test]
    fn nothing_to_drop_keeps_everything_in_order() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.append("x-multi", HeaderValue::from_static("a"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        h.append("x-multi", HeaderValue::from_static("b"));
        let out = end_to_end(h.clone(), &[header::HOST]);
        assert_eq!(out, h);
        let pairs = |m: &HeaderMap| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.to_str().unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(pairs(&out), pairs(&h));
    }

    #[test]
    fn the_key_is_read_from_any_of_the_three_headers() {
        let key = |name: &'static str, value: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(value));
            api_key(&h).map(str::to_string)
        };
        assert_eq!(key("authorization", "Bearer sk-1").as_deref(), Some("sk-1"));
        assert_eq!(key("api-key", "az").as_deref(), Some("az"));
        assert_eq!(key("x-api-key", "sk-ant").as_deref(), Some("sk-ant"));
        assert_eq!(key("x-other", "n"), None);
    }
}
