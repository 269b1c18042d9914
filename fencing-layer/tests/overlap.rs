//! Invariant 2, with real tasks: while a request with token t is inside the
//! handler, no higher token for the same key is. Time is tokio's paused clock,
//! so every wait below is exact and no outcome depends on the machine's speed.

mod common;

use std::time::Duration;

use common::{Event, Probe, post_token};
use fencing_layer::{FencingLayer, InFlightPolicy, Rejection};
use http::StatusCode;
use tokio::time::{Instant, sleep};

#[tokio::test(start_paused = true)]
async fn a_higher_token_waits_until_the_lower_one_has_returned() {
    let probe = Probe::default();
    let router = probe.router(FencingLayer::new());
    probe.hold(1);
    let first = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 1).await.status }
    });
    probe.wait_for(Event::Enter(0, 1)).await;
    let second = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 2).await.status }
    });
    sleep(Duration::from_secs(2)).await;
    assert_eq!(probe.events(), [Event::Enter(0, 1)], "token 2 entered while token 1 was inside");
    // The mark rose the moment token 2 arrived: the old holder's next write is refused at once.
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::CONFLICT);
    // Another key is not held up.
    assert_eq!(post_token(&router, 9, 7).await.status, StatusCode::OK);
    probe.release(1);
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    assert_eq!(second.await.unwrap(), StatusCode::OK);
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
    probe.hold(1);
    let first = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 1).await.status }
    });
    probe.wait_for(Event::Enter(0, 1)).await;
    let started = Instant::now();
    let reply = post_token(&router, 0, 2).await;
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(reply.problem()["presented_token"], 2);
    assert_eq!(post_token(&router, 0, 1).await.status, StatusCode::CONFLICT);
    probe.release(1);
    assert_eq!(first.await.unwrap(), StatusCode::OK);
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
    probe.hold(1);
    let first = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 1).await.status }
    });
    probe.wait_for(Event::Enter(0, 1)).await;
    let second = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 2).await }
    });
    sleep(Duration::from_millis(100)).await;
    let third = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 3).await.status }
    });
    let started = Instant::now();
    let second = second.await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO, "the overtaken waiter is answered at once");
    assert_eq!(second.status, StatusCode::CONFLICT);
    assert_eq!(
        (second.problem()["presented_token"].clone(), second.problem()["highest_token"].clone()),
        (2.into(), 3.into())
    );
    probe.release(1);
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    assert_eq!(third.await.unwrap(), StatusCode::OK);
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
    probe.hold(1);
    let first = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 1).await }
    });
    probe.wait_for(Event::Enter(0, 1)).await;
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
    probe.hold(1);
    let first = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 1).await }
    });
    probe.wait_for(Event::Enter(0, 1)).await;
    let second = tokio::spawn({
        let router = router.clone();
        async move { post_token(&router, 0, 2).await.status }
    });
    sleep(Duration::from_millis(100)).await;
    first.abort();
    assert_eq!(second.await.unwrap(), StatusCode::OK);
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
