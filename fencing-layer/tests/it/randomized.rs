//! Invariants 1 and 2 under many random interleavings: requests with random
//! tokens for a few keys race on a multi-threaded runtime through the layer
//! into a handler that yields a random number of times; a checker replays the
//! handler's entry/exit history.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::Event;
use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::post;
use fencing_layer::{FencingLayer, FencingToken, InFlightPolicy, Rejection};
use http::{Request, StatusCode};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

/// One request of a run: key, token, and how many times its handler yields.
type Step = (u64, u64, u8);

struct Exit<'a> {
    record: &'a Mutex<Vec<Event>>,
    event: Event,
}

impl Drop for Exit<'_> {
    fn drop(&mut self) {
        self.record.lock().unwrap().push(self.event);
    }
}

/// Replays a history; returns the first violation of invariant 1 or 2.
fn check(history: &[Event]) -> Result<(), String> {
    let mut inside: HashMap<u64, HashMap<u64, usize>> = HashMap::new();
    let mut last_admitted: HashMap<u64, u64> = HashMap::new();
    for (at, event) in history.iter().enumerate() {
        match *event {
            Event::Enter(key, token) => {
                if let Some(last) = last_admitted.insert(key, token).filter(|&last| last > token) {
                    return Err(format!("#{at}: key {key} admitted token {token} after {last}"));
                }
                let others = inside.entry(key).or_default();
                if let Some((other, _)) = others.iter().find(|&(&t, &n)| t != token && n > 0) {
                    return Err(format!("#{at}: key {key} token {token} entered while {other} was inside"));
                }
                *others.entry(token).or_default() += 1;
            }
            Event::Exit(key, token) | Event::Dropped(key, token) => {
                *inside.entry(key).or_default().entry(token).or_default() -= 1;
            }
        }
    }
    Ok(())
}

/// Runs `steps` concurrently through `layer` (or bare when `None`); returns the
/// handler history and every response status.
fn run(steps: &[Step], layer: Option<FencingLayer>) -> (Vec<Event>, Vec<(StatusCode, Option<&'static str>)>) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let history = Arc::new(Mutex::new(Vec::new()));
    let yields: HashMap<(u64, u64), u8> = steps.iter().map(|&(k, t, y)| ((k, t), y)).collect();
    let record = history.clone();
    let handler = move |Path(key): Path<u64>, request: Request<Body>| {
        let record = record.clone();
        let token = FencingToken::current().map_or_else(
            || request.headers()["fencing-token"].to_str().unwrap().parse().unwrap(),
            |t| t.get(),
        );
        let spins = yields.get(&(key, token)).copied().unwrap_or(0);
        async move {
            record.lock().unwrap().push(Event::Enter(key, token));
            // Records the exit even when the cancel policy drops this future mid-way.
            let _exit = Exit { record: &record, event: Event::Exit(key, token) };
            for _ in 0..spins {
                tokio::task::yield_now().await;
            }
        }
    };
    let router = Router::new().route("/r/{key}", post(handler));
    let router = match layer {
        Some(layer) => router.route_layer(layer),
        None => router,
    };
    let statuses = runtime.block_on(async {
        let tasks: Vec<_> = steps
            .iter()
            .map(|&(key, token, _)| {
                let router = router.clone();
                tokio::spawn(async move {
                    let request = Request::post(format!("/r/{key}"))
                        .header("fencing-token", token)
                        .body(Body::empty())
                        .unwrap();
                    let response = router.oneshot(request).await.unwrap();
                    (response.status(), response.extensions().get::<Rejection>().map(Rejection::kind))
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for task in tasks {
            statuses.push(tokio::time::timeout(Duration::from_secs(30), task).await.unwrap().unwrap());
        }
        statuses
    });
    let history = history.lock().unwrap().clone();
    (history, statuses)
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec((0..3u64, 0..12u64, 0..8u8), 10..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn drain_policy_keeps_both_invariants(steps in steps()) {
        let (history, outcomes) = run(&steps, Some(FencingLayer::new()));
        prop_assert_eq!(check(&history), Ok(()));
        let admitted = outcomes.iter().filter(|(s, _)| *s == StatusCode::OK).count();
        prop_assert_eq!(admitted * 2, history.len());
        prop_assert!(outcomes.iter().all(|o| matches!(o, (StatusCode::OK, None) | (StatusCode::CONFLICT, Some("stale-token")))), "{:?}", outcomes);
    }

    #[test]
    fn cancel_policy_keeps_both_invariants(steps in steps()) {
        let layer = FencingLayer::new().in_flight_policy(InFlightPolicy::Cancel);
        let (history, outcomes) = run(&steps, Some(layer));
        prop_assert_eq!(check(&history), Ok(()));
        // Every 200 ran the handler; a cancelled request may have been dropped
        // before its handler started, so it may or may not have an entry.
        let finished = outcomes.iter().filter(|o| matches!(o, (StatusCode::OK, None))).count();
        let cancelled = outcomes.iter().filter(|o| matches!(o, (_, Some("cancelled")))).count();
        prop_assert!((finished * 2..=(finished + cancelled) * 2).contains(&history.len()));
        prop_assert!(outcomes.iter().all(|(s, _)| *s == StatusCode::OK || *s == StatusCode::CONFLICT), "{:?}", outcomes);
    }
}

#[test]
fn the_checker_catches_both_violations() {
    use Event::{Enter, Exit};
    assert_eq!(check(&[Enter(0, 2), Exit(0, 2), Enter(0, 3), Enter(0, 3), Exit(0, 3), Exit(0, 3)]), Ok(()));
    assert!(check(&[Enter(0, 2), Exit(0, 2), Enter(0, 1)]).unwrap_err().contains("after 2"));
    assert!(check(&[Enter(0, 1), Enter(0, 2)]).unwrap_err().contains("while 1 was inside"));
    assert_eq!(check(&[Enter(0, 1), Enter(1, 2), Exit(0, 1), Enter(0, 1)]), Ok(()));
}

#[test]
fn without_the_layer_the_same_workload_breaks_the_invariants() {
    // Descending tokens on one key: the bare service admits them in any order.
    let steps: Vec<Step> = (0..64).rev().map(|t| (0, t, 4)).collect();
    let (history, _) = run(&steps, None);
    assert!(check(&history).is_err(), "the checker saw no violation in an unfenced run");
}
