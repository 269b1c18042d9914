//! Invariant 2, with real tasks: while a request with token t is inside the
//! handler, no higher token for the same key is. Time is tokio's paused clock,
//! so every wait below is exact and no outcome depends on the machine's speed.

use std::time::Duration;

use crate::common::{Event, Probe, post_token, spawn_post};
use fencing_layer::{FencingLayer, InFlightPolicy, Rejection};
use http::StatusCode;
use tokio::time::{Instant, sleep};

#[tokio::test(start_paused = true)]
async fn a_higher_token_waits_until_the_lower_one_has_returned() {
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new());
    let first = probe.spawn_held(&router, 0, 1).await;
    let second = spawn_post(&router, 0, 2);
    sleep(Duration::from_secs(2)).await;
    assert_eq!(probe.events(), [Event::Enter(0, 1)], "token 2 entered while token 1 was inside");
    // The mark rose the moment token 2 arrived: the old holder's next write is refused at once.
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::CONFLICT);
    // Another key is not held up.
    assert_eq!(post_token(&router, 9, 7).await.status, StatusCode::OK);
    probe.release(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
    let key0: Vec<_> =
        probe.events().into_iter().filter(|e| matches!(e, Event::Enter(0, _) | Event::Exit(0, _))).collect();
    assert_eq!(key0, [Event::Enter(0, 1), Event::Exit(0, 1), Event::Enter(0, 2), Event::Exit(0, 2)]);
}

#[tokio::test(start_paused = true)]
async fn equal_tokens_are_inside_together() {
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new());
    probe.hold(3);
    let writes: Vec<_> = (0..3)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move { post_token(&router, 0, 3).await.status })
        })
        .collect();
    sleep(Duration::from_secs(1)).await;
    assert_eq!(probe.events(), [Event::Enter(0, 3); 3]);
    probe.release(3);
    for write in writes {
        assert_eq!(write.await.unwrap(), StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn the_drain_bound_gives_503_and_keeps_the_mark() {
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new().drain_timeout(Duration::from_secs(3)));
    let first = probe.spawn_held(&router, 0, 1).await;
    let started = Instant::now();
    let reply = post_token(&router, 0, 2).await;
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(reply.problem()["presented_token"], 2);
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::CONFLICT);
    probe.release(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(post_token(&router, 0, 2).await.status, StatusCode::OK);
    assert_eq!(
        probe.events(),
        [Event::Enter(0, 1), Event::Exit(0, 1), Event::Enter(0, 2), Event::Exit(0, 2)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_overtaken_by_a_still_higher_token_gets_409() {
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new());
    let first = probe.spawn_held(&router, 0, 1).await;
    let second = spawn_post(&router, 0, 2);
    sleep(Duration::from_millis(100)).await;
    let third = spawn_post(&router, 0, 3);
    let started = Instant::now();
    let second = second.await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO, "the overtaken waiter is answered at once");
    assert_eq!(second.status, StatusCode::CONFLICT);
    assert_eq!(
        (second.problem()["presented_token"].clone(), second.problem()["highest_token"].clone()),
        (2.into(), 3.into())
    );
    probe.release(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(third.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        probe.events(),
        [Event::Enter(0, 1), Event::Exit(0, 1), Event::Enter(0, 3), Event::Exit(0, 3)]
    );
}

#[tokio::test(start_paused = true)]
async fn the_cancel_policy_drops_the_older_request_and_answers_it_409() {
    let probe = Probe::default();
    let layer = FencingLayer::new().in_flight_policy(InFlightPolicy::Cancel);
    let router = probe.router(layer);
    let first = probe.spawn_held(&router, 0, 1).await;
    let started = Instant::now();
    let second = post_token(&router, 0, 2).await;
    assert_eq!(started.elapsed(), Duration::ZERO, "the newer holder did not wait for a drain");
    assert_eq!(second.status, StatusCode::OK);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CONFLICT);
    assert_eq!(first.problem()["type"], "urn:fencing:problem:cancelled");
    // Token 1's handler was dropped before token 2's started.
    assert_eq!(
        probe.events(),
        [Event::Enter(0, 1), Event::Dropped(0, 1), Event::Enter(0, 2), Event::Exit(0, 2)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_disconnected_client_lets_the_next_holder_in() {
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new());
    let first = probe.spawn_held(&router, 0, 1).await;
    let second = spawn_post(&router, 0, 2);
    sleep(Duration::from_millis(100)).await;
    first.abort();
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        probe.events(),
        [Event::Enter(0, 1), Event::Dropped(0, 1), Event::Enter(0, 2), Event::Exit(0, 2)]
    );
}

#[tokio::test]
async fn rejections_travel_in_the_response_extensions() {
    use tower::ServiceExt;
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new());
    assert_eq!(post_token(&router, 0, 5).await.status, StatusCode::OK);
    let request =
        http::Request::post("/r/0").header("fencing-token", "4").body(axum::body::Body::empty()).unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(
        response.extensions().get::<Rejection>(),
        Some(&Rejection::Stale { key: "/r/0".into(), presented: 4, highest: 5 })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_holder_enters_only_after_the_dropped_handler_is_gone() {
    // Token 1's request is driven, then dropped, on a thread of its own, and its
    // handler's drop is slow; the waiting token 2 runs on this runtime's workers.
    // Were the place inside given up before the handler's future was dropped,
    // token 2 would enter while token 1's drop is still running.
    use std::sync::{Arc, Mutex};
    use tower::ServiceExt;
    struct SlowDrop(Arc<Mutex<Vec<&'static str>>>);
    impl Drop for SlowDrop {
        fn drop(&mut self) {
            std::thread::sleep(Duration::from_millis(100));
            self.0.lock().unwrap().push("dropped 1");
        }
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let (started, entered) = std::sync::mpsc::channel();
    let record = log.clone();
    let handler = move |token: fencing_layer::FencingToken| {
        let (log, started) = (record.clone(), started.clone());
        async move {
            if token.get() == 1 {
                let _slow = SlowDrop(log.clone());
                started.send(()).unwrap();
                std::future::pending::<()>().await;
            }
            log.lock().unwrap().push("entered 2");
        }
    };
    let router =
        axum::Router::new().route("/r", axum::routing::post(handler)).route_layer(FencingLayer::new());
    let request = |token: u64| {
        http::Request::post("/r").header("fencing-token", token).body(axum::body::Body::empty()).unwrap()
    };
    let (go, drop_now) = std::sync::mpsc::channel::<()>();
    let first = std::thread::spawn({
        let router = router.clone();
        let first = request(1);
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let mut response = Box::pin(router.oneshot(first));
            runtime.block_on(async {
                let poll_once = std::future::poll_fn(|cx| {
                    let _ = response.as_mut().poll(cx);
                    std::task::Poll::Ready(())
                });
                poll_once.await;
            });
            drop_now.recv().unwrap();
            drop(response);
        }
    });
    tokio::task::spawn_blocking(move || entered.recv().unwrap()).await.unwrap();
    let second = tokio::spawn(router.clone().oneshot(request(2)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    go.send(()).unwrap();
    assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK);
    first.join().unwrap();
    assert_eq!(*log.lock().unwrap(), ["dropped 1", "entered 2"]);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_calls_the_service_it_readied() {
    // ConcurrencyLimit hands a permit to the clone that `poll_ready` readied and
    // panics if a clone without one is called: a waiting request must keep and
    // later call the readied service, not the one left behind for the next call.
    use std::sync::Arc;
    use tower::{Service, ServiceBuilder, ServiceExt};
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let inner = {
        let gate = gate.clone();
        tower::service_fn(move |request: http::Request<()>| {
            let gate = gate.clone();
            async move {
                if request.headers()["fencing-token"] == "1" {
                    let _ = gate.acquire().await;
                }
                Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
            }
        })
    };
    let mut service = ServiceBuilder::new().layer(FencingLayer::new()).concurrency_limit(2).service(inner);
    let request = |token: &str| http::Request::post("/k").header("fencing-token", token).body(()).unwrap();
    let first = service.ready().await.unwrap().call(request("1"));
    let first = tokio::spawn(first);
    sleep(Duration::from_millis(10)).await;
    let second = tokio::spawn(service.ready().await.unwrap().call(request("2")));
    sleep(Duration::from_millis(10)).await;
    assert!(!second.is_finished(), "token 2 did not wait for token 1");
    gate.close();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK);
    // Both permits came back.
    for token in ["2", "3"] {
        assert_eq!(
            service.ready().await.unwrap().call(request(token)).await.unwrap().status(),
            StatusCode::OK
        );
    }
}
