//! `fencing-load`'s inputs: path templates, headers, methods, bodies, targets
//! and token schedules, parsed and expanded without a network; and its verdicts
//! on what a run measured.

use fencing_benches::load::report::TargetRow;
use fencing_benches::load::request::{body, parse_header, parse_method};
use fencing_benches::load::schedule::{FIRST_TOKEN, Schedule, Token};
use fencing_benches::load::tally::Tally;
use fencing_benches::load::target::Target;
use fencing_benches::load::template::PathTemplate;
use fencing_benches::load::validity;

#[test]
fn templates_expand_every_placeholder_and_literal_braces() {
    let t = PathTemplate::parse("/t/{conn}/k-{key}?seq={seq}&x={{y}}").unwrap();
    assert_eq!(t.expand(7, 42, 3), "/t/7/k-3?seq=42&x={y}");
    assert!(t.uses_key());
    let plain = PathTemplate::parse("/logs/hot").unwrap();
    assert_eq!(plain.expand(1, 2, 3), "/logs/hot");
    assert!(!plain.uses_key());
}

#[test]
fn the_key_prefix_goes_before_every_keys_number_in_the_path_only() {
    let t = PathTemplate::parse("/docs/{key}/v?c={conn}&k={key}").unwrap().with_key_prefix("load-ab12-");
    assert_eq!(t.expand(1, 2, 3), "/docs/load-ab12-3/v?c=1&k=load-ab12-3");
    assert_eq!(t.key_prefix(), "load-ab12-");
    assert!(t.key_in_path());
    for (template, in_path) in [
        ("/docs/{key}", true),
        ("/docs/{conn}", false),
        ("/docs?k={key}", false),
        ("/d/{seq}?x=1&k={key}", false),
    ] {
        assert_eq!(PathTemplate::parse(template).unwrap().key_in_path(), in_path, "{template}");
    }
    let bad = PathTemplate::parse("/docs/{key}").unwrap().with_key_prefix("a b");
    assert!(bad.check().unwrap_err().contains("not a valid path"));
}

#[test]
fn bad_templates_are_refused_with_the_reason() {
    for (template, reason) in [
        ("/api/{user}", "unknown placeholder {user}"),
        ("/api/{key", "unclosed '{'"),
        ("/api/key}", "unmatched '}'"),
        ("api/{key}", "must start with '/'"),
        ("/a b/{key}", "not a valid path"),
    ] {
        let err = PathTemplate::parse(template).unwrap_err();
        assert!(err.contains(reason), "{template}: {err}");
    }
}

#[test]
fn headers_are_curl_style_and_checked() {
    let (name, value) = parse_header("X-Tenant:acme corp").unwrap();
    assert_eq!((name.as_str(), value.to_str().unwrap()), ("x-tenant", "acme corp"));
    let (name, value) = parse_header("Authorization: Bearer a:b").unwrap();
    assert_eq!((name.as_str(), value.to_str().unwrap()), ("authorization", "Bearer a:b"));
    assert!(parse_header("X-Tenant acme").unwrap_err().contains("'Name: value'"));
    assert!(parse_header("Bad Name: x").unwrap_err().contains("not a valid header name"));
    assert!(parse_header("X-Ok: line\nbreak").unwrap_err().contains("not a valid header value"));
}

#[test]
fn methods_are_case_insensitive_for_the_standard_ones() {
    assert_eq!(parse_method("put").unwrap(), http::Method::PUT);
    assert_eq!(parse_method("PATCH").unwrap(), http::Method::PATCH);
    assert_eq!(parse_method("PURGE").unwrap().as_str(), "PURGE");
    assert!(parse_method("NOT A METHOD").is_err());
}

#[test]
fn the_body_comes_from_the_text_the_file_or_the_default_size() {
    assert_eq!(body(Some(r#"{"v":1}"#), None, 16).unwrap().as_ref(), br#"{"v":1}"#);
    assert_eq!(body(None, None, 5).unwrap().as_ref(), b"xxxxx");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("body.json");
    std::fs::write(&path, b"[1,2,3]").unwrap();
    assert_eq!(body(None, Some(&path), 16).unwrap().as_ref(), b"[1,2,3]");
    let missing = dir.path().join("missing.json");
    assert!(body(None, Some(&missing), 16).unwrap_err().contains("--body-file"));
}

#[test]
fn targets_take_the_path_from_the_url_the_flag_or_the_default() {
    let t = Target::parse(
        "t",
        "http://127.0.0.1:9/api/docs/{key},http://localhost:10/api/docs/{key}",
        None,
        "/d",
    )
    .unwrap();
    assert_eq!(t.replicas.len(), 2);
    assert_eq!(t.template.as_str(), "/api/docs/{key}");
    assert_eq!(t.replicas[1].1, "localhost:10");
    assert_eq!(
        Target::parse("t", "http://127.0.0.1:9/", None, "/d/{key}").unwrap().template.as_str(),
        "/d/{key}"
    );
    assert_eq!(
        Target::parse("t", "http://127.0.0.1:9/a", Some("/b/{seq}"), "/d").unwrap().template.as_str(),
        "/b/{seq}"
    );
    for (urls, reason) in [
        ("https://127.0.0.1:9", "only http://"),
        ("http://192.0.2.1:9/x", "not a loopback address"),
        ("http://127.0.0.1:9/a,http://127.0.0.1:10/b", "same path"),
        ("http://127.0.0.1:9/{nope}", "unknown placeholder"),
    ] {
        let err = Target::parse("t", urls, None, "/d").unwrap_err();
        assert!(err.contains(reason), "{urls}: {err}");
    }
}

#[test]
fn a_new_holder_every_n_requests_raises_each_keys_token_on_its_own() {
    // Four connections on two keys: connections 0 and 2 write to key 0, 1 and 3 to key 1.
    let schedule = Schedule::new(2, 4, Some(3), 0, 0);
    let (mut rng0, mut rng1) = (schedule.rng(0), schedule.rng(1));
    assert_eq!((schedule.key(0, 0), schedule.key(1, 5), schedule.key(2, 9)), (0, 1, 0));
    let key0: Vec<Token> =
        (0..7).map(|i| schedule.next(if i % 2 == 0 { 0 } else { 2 }, i, &mut rng0)).collect();
    let key1: Vec<Token> = (0..2).map(|i| schedule.next(1, i, &mut rng1)).collect();
    let valid = |t: u64| Token::Valid(FIRST_TOKEN + t);
    assert_eq!(key0, [valid(0), valid(0), valid(0), valid(1), valid(1), valid(1), valid(2)]);
    assert_eq!(key1, [valid(0), valid(0)]);
}

#[test]
fn with_more_keys_than_connections_each_connection_takes_turns_over_all_of_them() {
    let schedule = Schedule::new(10, 4, None, 0, 0);
    let keys: Vec<u32> = (0..5).map(|seq| schedule.key(1, seq)).collect();
    assert_eq!(keys, [1, 5, 9, 3, 7]);
    // As many keys as connections (the default): each keeps its own.
    let own = Schedule::new(4, 4, None, 0, 0);
    assert!((0..100).all(|seq| own.key(3, seq) == 3));
}

#[test]
fn the_stale_and_malformed_mix_follows_the_percentages() {
    let schedule = Schedule::new(1, 1, None, 20, 10);
    let mut rng = schedule.rng(0);
    let tokens: Vec<Token> = (0..10_000).map(|seq| schedule.next(0, seq, &mut rng)).collect();
    let stale = tokens.iter().filter(|t| **t == Token::Stale).count();
    let malformed = tokens.iter().filter(|t| **t == Token::Malformed).count();
    assert!((1_800..2_200).contains(&stale), "{stale} stale of 10,000");
    assert!((800..1_200).contains(&malformed), "{malformed} malformed of 10,000");
    assert!(tokens.iter().all(|t| matches!(t, Token::Stale | Token::Malformed | Token::Valid(FIRST_TOKEN))));
}

#[test]
fn first_tokens_are_the_runs_or_each_keys_own() {
    let schedule = Schedule::new(2, 2, Some(2), 0, 0).with_first_token(7);
    let mut rng = schedule.rng(0);
    let tokens: Vec<Token> = (0..3).map(|seq| schedule.next(0, seq, &mut rng)).collect();
    assert_eq!(tokens, [Token::Valid(7), Token::Valid(7), Token::Valid(8)]);
    let per_key = Schedule::new(2, 2, None, 0, 0).with_first_tokens(vec![5001, 0]);
    assert_eq!((per_key.first_token(0), per_key.first_token(1)), (5001, 1), "at least 1, above the stale 0");
    assert_eq!(per_key.next(1, 0, &mut per_key.rng(1)), Token::Valid(1));
}

#[test]
fn the_schedule_knows_when_it_expects_409s() {
    assert_eq!(Schedule::new(4, 4, None, 0, 0).expected_409_share(), Some(0.0));
    assert_eq!(Schedule::new(4, 4, Some(10), 25, 5).expected_409_share(), Some(0.25));
    // Connections sharing keys that change holders: some requests lose a race, how many
    // the schedule cannot say.
    assert_eq!(Schedule::new(2, 4, Some(10), 0, 0).expected_409_share(), None);
}

fn row(tally: &Tally) -> TargetRow {
    let target = Target::parse("target", "http://127.0.0.1:9/d/{key}", None, "/").unwrap();
    TargetRow::new(&target, tally, 1.0, &mut [1.0], 4)
}

#[test]
fn a_run_without_answers_refused_connections_or_mostly_404s_is_no_measurement() {
    let mut good = Tally::new();
    (0..90).for_each(|_| good.count_status(201));
    (0..10).for_each(|_| good.count_status(503));
    assert!(validity::invalid(&[row(&good)], 0.5).is_empty());

    let mut refused = good.clone();
    refused.errors += 2;
    refused.connect_errors += 2;
    let causes = validity::invalid(&[row(&refused)], 0.5);
    assert_eq!(causes.len(), 1);
    assert!(causes[0].contains("2 connection(s) could not be opened"), "{causes:?}");

    let mut silent = Tally::new();
    silent.errors = 4;
    let causes = validity::invalid(&[row(&silent)], 0.5);
    assert!(causes[0].contains("no request was answered (4 without an answer)"), "{causes:?}");

    let mut lost = Tally::new();
    (0..40).for_each(|_| lost.count_status(201));
    (0..55).for_each(|_| lost.count_status(404));
    (0..5).for_each(|_| lost.count_status(500));
    let causes = validity::invalid(&[row(&lost)], 0.5);
    assert!(
        causes[0].ends_with(
            "60.0 % of 100 answers were outside 2xx, 409 and 400 (404 ×55, 500 ×5), above \
             --max-other-share 0.5: is the path template or the method right?"
        ),
        "{causes:?}"
    );
    assert!(validity::invalid(&[row(&lost)], 0.6).is_empty());
}

#[test]
fn more_409s_than_the_schedule_expects_are_warned_about() {
    let mut stale = Tally::new();
    (0..90).for_each(|_| stale.count_status(201));
    (0..10).for_each(|_| stale.count_status(409));
    assert!(validity::warnings(&[row(&stale)], Some(0.0), 0.05)[0].contains("10.0 % of answers were 409"));
    assert!(validity::warnings(&[row(&stale)], Some(0.08), 0.05).is_empty(), "--stale-pct 8 asks for them");
    assert!(validity::warnings(&[row(&stale)], None, 0.05).is_empty(), "races the schedule cannot count");
}
