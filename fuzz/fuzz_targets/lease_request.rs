//! `POST /v1/leases` through the lock service's router with arbitrary bodies and
//! content types: never panics, answers 201/400/409/413/415, errors are
//! `application/problem+json` naming their status, granted tokens only go up.
#![no_main]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use demo_lock_service::{Config, LockService};
use http::{HeaderValue, Method, Request};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    service: LockService,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        // tmpfs when available: every grant is an fsync'd commit.
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            tempfile::tempdir_in("/dev/shm")
        } else {
            tempfile::tempdir()
        }
        .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let service = LockService::open(Config::new(dir.path())).unwrap();
        Fixture { runtime, service, _dir: dir }
    })
}

const CONTENT_TYPES: &[&str] =
    &["application/json", "application/problem+json; charset=utf-8", "text/plain", "APPLICATION/JSON ;x=y"];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let mut request = Request::builder().method(Method::POST).uri("/v1/leases");
    let body = match selector % 8 {
        n @ 0..4 => {
            request = request.header("content-type", CONTENT_TYPES[n as usize]);
            rest
        }
        4 => rest,
        _ => {
            // The content type is the bytes up to the first 0x00, the body the rest.
            let split = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
            if let Ok(ct) = HeaderValue::from_bytes(&rest[..split]) {
                request = request.header("content-type", ct);
            }
            rest.get(split + 1..).unwrap_or_default()
        }
    };
    let request = request.body(Body::from(body.to_vec())).unwrap();
    let f = fixture();
    let (status, content_type, answer) = f.runtime.block_on(async {
        let response = f.service.router().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let ct = response.headers().get("content-type").map(|v| v.as_bytes().to_vec());
        (status, ct, response.into_body().collect().await.unwrap().to_bytes())
    });
    assert!([201, 400, 409, 413, 415].contains(&status), "status {status}");
    if status >= 400 {
        assert_eq!(content_type.as_deref(), Some(&b"application/problem+json"[..]));
        let problem: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(problem["status"], status);
    } else {
        static LAST: AtomicU64 = AtomicU64::new(0);
        let grant: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        let token = grant["token"].as_u64().unwrap();
        assert!(token > LAST.swap(token, Ordering::SeqCst));
    }
});
