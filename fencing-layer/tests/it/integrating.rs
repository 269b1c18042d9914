//! docs/integrating.md, checked: where tower-http's CORS, timeout and trace layers go around the
//! fencing layer, the layer around a whole `Router`, and the bare hyper example.

// The example's `main` goes unused here, and its `pub fn serve` is public to no one.
#[path = "../../examples/hyper.rs"]
#[allow(dead_code, unreachable_pub)]
mod hyper_example;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::put;
use bytes::Bytes;
use fencing_layer::FencingLayer;
use http::header::{ACCESS_CONTROL_ALLOW_ORIGIN, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_http::cors::CorsLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

const ORIGIN: &str = "https://app.example";

/// CORS for a browser app that writes with a fencing token and reads Retry-After on a 503.
fn cors() -> CorsLayer {
    CorsLayer::new()
        .allow_origin(HeaderValue::from_static(ORIGIN))
        .allow_methods([Method::PUT])
        .allow_headers([HeaderName::from_static("fencing-token"), CONTENT_TYPE])
        .expose_headers([RETRY_AFTER])
}

/// `PUT /docs/a` from the browser app, with `token` if any; the body says how long the handler takes.
fn put_doc(token: Option<u64>, body: &'static str) -> Request<Body> {
    let mut request = Request::put("/docs/a").header("origin", ORIGIN);
    if let Some(token) = token {
        request = request.header("fencing-token", token);
    }
    request.body(Body::from(body)).unwrap()
}

/// The handler: "slow" takes 10 s, "half" 500 ms, anything else no time; `done` counts those that finish.
fn routes(done: &Arc<AtomicUsize>) -> Router {
    let done = Arc::clone(done);
    let store = move |body: String| {
        let done = Arc::clone(&done);
        async move {
            match body.as_str() {
                "slow" => tokio::time::sleep(Duration::from_secs(10)).await,
                "half" => tokio::time::sleep(Duration::from_millis(500)).await,
                _ => {}
            }
            done.fetch_add(1, Ordering::SeqCst);
            "stored\n"
        }
    };
    Router::new().route("/docs/{doc}", put(store))
}

async fn call(app: &Router, request: Request<Body>) -> Response<Body> {
    app.clone().oneshot(request).await.unwrap()
}

#[tokio::test]
async fn cors_outside_the_layer_puts_its_headers_on_rejections() {
    let done = Arc::new(AtomicUsize::new(0));
    let cors_inside = routes(&done).layer(cors()).route_layer(FencingLayer::new());
    let cors_outside = routes(&done).route_layer(FencingLayer::new()).layer(cors());
    for (app, on_rejections) in [(cors_inside, false), (cors_outside, true)] {
        // The handler's own answers carry CORS headers either way.
        let stored = call(&app, put_doc(Some(2), "")).await;
        assert_eq!(stored.status(), StatusCode::OK);
        assert_eq!(stored.headers()[ACCESS_CONTROL_ALLOW_ORIGIN], ORIGIN);
        // The layer's answers carry them only when CORS is outside it.
        for (token, status) in [(Some(1), StatusCode::CONFLICT), (None, StatusCode::PRECONDITION_REQUIRED)] {
            let rejected = call(&app, put_doc(token, "")).await;
            assert_eq!(rejected.status(), status);
            assert_eq!(rejected.headers()["content-type"], "application/problem+json");
            assert_eq!(
                rejected.headers().get(ACCESS_CONTROL_ALLOW_ORIGIN).map(|v| v.to_str().unwrap()),
                on_rejections.then_some(ORIGIN),
                "{status} with CORS outside the layer: {on_rejections}"
            );
        }
        // The preflight is an OPTIONS, never fenced: CORS answers it in either order.
        let preflight = Request::options("/docs/a")
            .header("origin", ORIGIN)
            .header("access-control-request-method", "PUT")
            .header("access-control-request-headers", "fencing-token")
            .body(Body::empty())
            .unwrap();
        let preflight = call(&app, preflight).await;
        assert_eq!(preflight.status(), StatusCode::OK);
        assert_eq!(preflight.headers()[ACCESS_CONTROL_ALLOW_ORIGIN], ORIGIN);
        assert_eq!(preflight.headers()["access-control-allow-headers"], "fencing-token,content-type");
    }
}

#[tokio::test(start_paused = true)]
async fn a_timeout_inside_the_layer_bounds_how_long_a_raise_waits() {
    let done = Arc::new(AtomicUsize::new(0));
    let app = routes(&done)
        .route_layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, Duration::from_secs(1)))
        .route_layer(FencingLayer::new()); // drain_timeout: 5 s
    let start = Instant::now();
    let stale = tokio::spawn(app.clone().oneshot(put_doc(Some(1), "slow")));
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The raise waits for token 1 to leave the handler: the timeout cuts it at 1 s.
    let raise = call(&app, put_doc(Some(2), "half")).await;
    assert_eq!(raise.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_millis(1500), "1 s at the door, then its own 500 ms");
    let stale = stale.await.unwrap().unwrap();
    assert_eq!(stale.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(done.load(Ordering::SeqCst), 1, "only the raise's handler finished");
}

#[tokio::test(start_paused = true)]
async fn a_timeout_outside_the_layer_also_counts_the_wait_at_the_door() {
    let done = Arc::new(AtomicUsize::new(0));
    let app = routes(&done)
        .route_layer(FencingLayer::new()) // drain_timeout: 5 s
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, Duration::from_secs(1)));
    let start = Instant::now();
    let stale = tokio::spawn(app.clone().oneshot(put_doc(Some(1), "slow")));
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The raise is let in at 1 s, when token 1 is cut, and cut itself 100 ms later, inside its handler:
    // 408 without Retry-After, not the layer's 503.
    let raise = call(&app, put_doc(Some(2), "half")).await;
    assert_eq!(raise.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(raise.headers().get(RETRY_AFTER), None);
    assert_eq!(start.elapsed(), Duration::from_millis(1100));
    assert_eq!(stale.await.unwrap().unwrap().status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(done.load(Ordering::SeqCst), 0, "neither handler finished");
    // The mark rose all the same.
    assert_eq!(call(&app, put_doc(Some(1), "")).await.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn trace_outside_the_layer_sees_its_rejections() {
    let done = Arc::new(AtomicUsize::new(0));
    let traced = Arc::new(Mutex::new(Vec::new()));
    let trace = || {
        let traced = Arc::clone(&traced);
        TraceLayer::new_for_http().on_response(
            move |response: &Response<Body>, _: Duration, _: &tracing::Span| {
                traced.lock().unwrap().push(response.status().as_u16());
            },
        )
    };
    // The order docs/integrating.md recommends, outermost last.
    let outside = routes(&done)
        .route_layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, Duration::from_secs(2)))
        .route_layer(FencingLayer::new())
        .layer(cors())
        .layer(trace());
    let inside = routes(&done).layer(trace()).route_layer(FencingLayer::new());
    for (app, expected) in [(outside, vec![200, 409, 428]), (inside, vec![200])] {
        traced.lock().unwrap().clear();
        for (token, status) in [(Some(2), 200), (Some(1), 409), (None, 428)] {
            assert_eq!(call(&app, put_doc(token, "")).await.status().as_u16(), status);
        }
        assert_eq!(*traced.lock().unwrap(), expected);
    }
}

/// One request on a fresh HTTP/1.1 connection: status and body.
async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    token: Option<u64>,
    body: &'static str,
) -> (u16, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut request = Request::builder().method(method).uri(path).header("host", addr.to_string());
    if let Some(token) = token {
        request = request.header("fencing-token", token);
    }
    let response =
        sender.send_request(request.body(Full::new(Bytes::from_static(body.as_bytes()))).unwrap()).await;
    let response = response.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    drop(sender);
    let _ = conn.await;
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn a_layer_around_a_whole_router() {
    let done = Arc::new(AtomicUsize::new(0));
    let layer = FencingLayer::new();
    let marks = layer.mark_store().clone();
    let app = tower::Layer::layer(&layer, routes(&done)); // a `Fencing<Router>`
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, axum::ServiceExt::<Request<Body>>::into_make_service(app)).await
    });

    assert_eq!(send(addr, Method::PUT, "/docs/a", Some(2), "").await, (200, "stored\n".to_owned()));
    let (status, body) = send(addr, Method::PUT, "/docs/a", Some(1), "").await;
    assert_eq!(status, 409, "{body}");
    // Outside the router the layer sees requests before routing: an unknown path gets its mark too.
    assert_eq!(send(addr, Method::PUT, "/nope", Some(1), "").await.0, 404);
    assert_eq!((marks.mark("/docs/a"), marks.mark("/nope")), (Some(2), Some(1)));
    server.abort();
}

#[tokio::test]
async fn the_bare_hyper_example_is_fenced() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(hyper_example::serve(listener, FencingLayer::new()));

    let stored = send(addr, Method::PUT, "/docs/report", Some(7), "v1").await;
    assert_eq!(stored, (200, "stored /docs/report (2 bytes) under token 7\n".to_owned()));
    let (status, body) = send(addr, Method::PUT, "/docs/report", Some(6), "v0").await;
    assert_eq!(status, 409);
    assert!(body.contains(r#""presented_token":6,"highest_token":7"#), "{body}");
    assert_eq!(send(addr, Method::PUT, "/docs/report", None, "v2").await.0, 428);
    let read = send(addr, Method::GET, "/docs/report", None, "").await;
    assert_eq!(read, (200, "read /docs/report, unfenced\n".to_owned()));
    server.abort();
}
