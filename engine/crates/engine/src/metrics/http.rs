//! The metrics endpoint (`--metrics-listen`): `GET /metrics` and nothing
//! else, over HTTP/1.1. It is read-only and bounded as every other
//! listener of the engine: at most [`MAX_CONNECTIONS`] at once (the next
//! waits to be accepted), request headers within [`HEADER_TIMEOUT`] and
//! [`MAX_HEADER_BYTES`], a connection lives [`CONNECTION_LIFETIME`] at
//! most, and a request body is never read.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Scrapers served at once (Prometheus keeps one connection per target).
pub const MAX_CONNECTIONS: usize = 16;
/// How long a client has to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest request head buffered (hyper's floor is 8 KiB).
pub const MAX_HEADER_BYTES: usize = 16 << 10;
/// A kept-alive connection is closed after this long (the scraper opens
/// another), so that idle ones cannot hold every slot for good.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// The OpenMetrics text format, for scrapers that ask for it.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Answer one request: the metrics for `GET /metrics` (OpenMetrics text if
/// the client accepts it, else the Prometheus text format), 405 for another
/// method on that path, 404 for any other path.
pub fn respond<B>(registry: &Registry, req: &Request<B>) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        r
    };
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    let openmetrics = req
        .headers()
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let mut text = String::with_capacity(64 << 10);
    let (encoded, content_type) = if openmetrics {
        (
            prometheus_client::encoding::text::encode(&mut text, registry),
            OPENMETRICS,
        )
    } else {
        (
            prometheus_client::encoding::prometheus_text::encode(&mut text, registry),
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )
    };
    if encoded.is_err() {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics failed to encode\n",
        );
    }
    let mut r = Response::new(Full::new(Bytes::from(text)));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Serve `registry` on `listener` until the runtime stops.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (sock, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("metrics accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let resp = respond(&registry, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                .serve_connection(TokioIo::new(sock), svc);
            match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                Ok(Err(e)) => tracing::debug!("metrics {peer}: {e}"),
                Err(_) => tracing::debug!("metrics {peer}: connection closed after its lifetime"),
                Ok(Ok(())) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str, method: Method, accept: Option<&str>) -> Response<Full<Bytes>> {
        let mut reg = Registry::default();
        let c: prometheus_client::metrics::counter::Counter = Default::default();
        c.inc();
        reg.register("peregrine_test", "A test counter.", c);
        let mut b = Request::builder().method(method).uri(path);
        if let Some(a) = accept {
            b = b.header(ACCEPT, a);
        }
        respond(&reg, &b.body(()).unwrap())
    }

    fn body(r: Response<Full<Bytes>>) -> String {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let b = rt.block_on(r.into_body().collect()).unwrap().to_bytes();
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[test]
    fn serves_get_metrics_only() {
        let r = get("/metrics", Method::GET, None);
        assert_eq!(r.status(), StatusCode::OK);
        let ct = r.headers()[CONTENT_TYPE].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
        assert!(body(r).contains("peregrine_test_total 1\n"));
        let r = get(
            "/metrics?x=1",
            Method::GET,
            Some("application/openmetrics-text"),
        );
        assert!(r.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"));
        assert!(body(r).ends_with("# EOF\n"));
        for p in ["/", "/metrics/", "/debug", "/metricsx"] {
            assert_eq!(
                get(p, Method::GET, None).status(),
                StatusCode::NOT_FOUND,
                "{p}"
            );
        }
        for m in [Method::POST, Method::PUT, Method::DELETE] {
            let r = get("/metrics", m.clone(), None);
            assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED, "{m}");
            assert_eq!(r.headers()[ALLOW], "GET");
        }
    }
}
