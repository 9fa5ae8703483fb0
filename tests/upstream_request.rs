//! An upstream request is built once and can be sent any number of times (a tool loop or a
//! retry sends it again): every send puts the same bytes on the wire.

use context_proxy::mock::{MockConfig, MockUpstream};
use context_proxy::upstream::UpstreamConfig;
use context_proxy::upstream::Upstreams;
use http::{HeaderMap, Method};

#[tokio::test]
async fn one_built_request_sent_twice_sends_identical_bytes() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let upstreams = Upstreams::new(
        &[UpstreamConfig {
            base_url: mock.base_url(),
            default: true,
            ..UpstreamConfig::default()
        }],
        |_| None,
    )
    .unwrap();
    let upstream = upstreams.route(Some("gpt-4o"));
    let mut headers = HeaderMap::new();
    headers.insert("authorization", "Bearer sk-twice".parse().unwrap());
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("x-custom", "kept".parse().unwrap());
    headers.insert("connection", "keep-alive".parse().unwrap());
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"twice ✓"}]}"#;
    let request = upstream.request(
        Method::POST,
        "/chat/completions",
        Some("api-version=1"),
        headers,
        &[http::header::HOST],
        bytes::Bytes::from_static(body.as_bytes()),
    );
    for _ in 0..2 {
        let answer = upstream.send(&request).await.unwrap();
        assert_eq!(answer.status, 200);
        answer.body.bytes().await.unwrap();
    }
    let received = mock.received();
    assert_eq!(received.len(), 2);
    let (a, b) = (&received[0], &received[1]);
    assert_eq!(a.body, b.body);
    assert_eq!(a.body, body.as_bytes());
    assert_eq!(a.path, b.path);
    assert_eq!(a.query, b.query);
    let wanted = |r: &context_proxy::mock::Received| {
        let mut h: Vec<(String, String)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
            .collect();
        h.sort();
        h
    };
    assert_eq!(wanted(a), wanted(b));
    assert_eq!(a.headers.get("x-custom").unwrap(), "kept");
    assert_eq!(a.headers.get("authorization").unwrap(), "Bearer sk-twice");
}
