//! The `healthcheck` subcommand: one `GET /healthz` to a running proxy, success when it answers
//! 200. Container images run it as their health check, so it needs no shell, no curl and no
//! async runtime: a plain blocking HTTP/1.1 request over a `TcpStream`, with timeouts.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// `context-proxy healthcheck [--url URL] [--timeout-ms N]`
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct HealthcheckArgs {
    /// The proxy to check: `http://HOST:PORT`, optionally with a path (default `/healthz`).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Longest wait for connecting, and for each read and write.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub timeout_ms: u64,
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum HealthcheckError {
    #[error("--url {0:?}: expected http://HOST:PORT[/PATH]")]
    BadUrl(String),
    #[error("{url}: no answer")]
    Io {
        url: String,
        #[source]
        source: io::Error,
    },
    #[error("{url}: not healthy: {status:?}")]
    Unhealthy { url: String, status: String },
}

/// Host, port and path of an `http://` URL; the path defaults to `/healthz`.
fn parse_url(url: &str) -> Option<(&str, u16, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = if path.is_empty() || path == "/" {
        "/healthz"
    } else {
        path
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port.parse().ok()?),
        _ => (authority, 80),
    };
    if host.is_empty() {
        return None;
    }
    Some((host, port, path))
}

/// Sends `GET` to `args.url` and succeeds when the answer's status is 200.
pub fn run(args: &HealthcheckArgs) -> Result<(), HealthcheckError> {
    let (host, port, path) =
        parse_url(&args.url).ok_or_else(|| HealthcheckError::BadUrl(args.url.clone()))?;
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    let io_error = |source| HealthcheckError::Io {
        url: args.url.clone(),
        source,
    };
    let status = get_status_line(host, port, path, timeout).map_err(io_error)?;
    let code = status.split(' ').nth(1);
    if status.starts_with("HTTP/1.") && code == Some("200") {
        Ok(())
    } else {
        Err(HealthcheckError::Unhealthy {
            url: args.url.clone(),
            status,
        })
    }
}

/// The status line of `GET path` on `host:port`.
fn get_status_line(host: &str, port: u16, path: &str, timeout: Duration) -> io::Result<String> {
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let addr = (bare_host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address for the host"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    )?;
    // The status line is all we need; it fits in the first read or few.
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    Ok(String::from_utf8_lossy(line).trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot server answering `response` and handing back the request it read.
    fn serve_once(response: &'static str) -> (String, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 512];
            while !request.ends_with(b"\r\n\r\n") {
                let n = stream.read(&mut buf).unwrap();
                request.extend_from_slice(&buf[..n]);
            }
            stream.write_all(response.as_bytes()).unwrap();
            String::from_utf8(request).unwrap()
        });
        (url, handle)
    }

    fn args(url: String) -> HealthcheckArgs {
        HealthcheckArgs {
            url,
            timeout_ms: 5000,
        }
    }

    #[test]
    fn healthy_on_200_and_asks_for_healthz() {
        let (url, server) = serve_once("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        run(&args(url)).unwrap();
        let request = server.join().unwrap();
        assert!(
            request.starts_with("GET /healthz HTTP/1.1\r\n"),
            "{request}"
        );
    }

    #[test]
    fn unhealthy_on_another_status_and_keeps_a_given_path() {
        let (url, server) = serve_once("HTTP/1.1 503 Service Unavailable\r\n\r\n");
        let err = run(&args(format!("{url}/readyz"))).unwrap_err();
        assert!(err.to_string().contains("503"), "{err}");
        assert!(server.join().unwrap().starts_with("GET /readyz "));
    }

    #[test]
    fn fails_when_nothing_listens() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = run(&args(format!("http://127.0.0.1:{port}"))).unwrap_err();
        assert!(matches!(err, HealthcheckError::Io { .. }), "{err}");
    }

    #[test]
    fn urls_name_host_port_and_path() {
        assert_eq!(
            parse_url("http://proxy:8080"),
            Some(("proxy", 8080, "/healthz"))
        );
        assert_eq!(
            parse_url("http://127.0.0.1:9/readyz"),
            Some(("127.0.0.1", 9, "/readyz"))
        );
        assert_eq!(
            parse_url("http://[::1]:80/"),
            Some(("[::1]", 80, "/healthz"))
        );
        assert_eq!(parse_url("http://[::1]"), Some(("[::1]", 80, "/healthz")));
        assert_eq!(
            parse_url("http://localhost"),
            Some(("localhost", 80, "/healthz"))
        );
        assert_eq!(parse_url("https://proxy:8080"), None);
        assert_eq!(parse_url("http://:8080"), None);
        assert!(matches!(
            run(&args("proxy:8080".into())),
            Err(HealthcheckError::BadUrl(_))
        ));
    }
}
