#!/usr/bin/env bash
# docs/integrating.md's sessions, run for real: the bare hyper example (`cargo run -q --example
# hyper --all-features` at the workspace root, on 127.0.0.1:3000) and curl against it; the
# client_layer example; and the page's project outside the workspace (its Cargo.toml and
# src/main.rs are written into the page from here), built in this script's temporary directory
# beside a link `fencing` to the workspace (as the README's `path = "../fencing/…"` has it),
# run twice on one marks.redb. Written into the page; --check compares.
#
#   docs/transcripts/integrating.sh [--check]
#
# `cargo run --all-features` without `-p` at the workspace root builds with the features
# `cargo test --workspace --all-features` built with, so after CI's test step it rebuilds
# nothing. The project is built offline (its Cargo.lock is the workspace's) into the
# workspace's target directory: the first time about 20 crates whose features differ there
# and fencing-layer (about a minute on 2 cores), later only fencing-layer (about 20 s).
source "$(dirname "$0")/lib.sh"
export CARGO_TERM_COLOR=never

cargo_toml='[package]
name = "marks-demo"
version = "0.1.0"
edition = "2024"

[dependencies]
fencing-layer = { path = "../fencing/fencing-layer", features = ["axum", "redb"] }
axum = "0.8"
tokio = { version = "1", features = ["full"] }'

main_rs='use axum::{Router, routing::put};
use fencing_layer::{FencingLayer, MarkStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MarkStore::open("marks.redb")?;
    let app: Router = Router::new().route(
        "/docs/{doc}",
        put(|| async { "stored\n" }).route_layer(FencingLayer::new().store(store.clone())),
    );
    // The router holds a clone of the store, so the file is still locked.
    if let Err(error) = MarkStore::open("marks.redb") {
        eprintln!("{error}");
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}'

# Stops the last server started (SIGTERM: a background job of a script ignores SIGINT, and
# these programs have no handler of their own).
stop() {
  local pid
  pid=$(tail -n 1 "$work/pids")
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

session() {
  local here=$PWD
  cd "$root"
  # Nothing to build after CI's test step; here, so that the server below starts at once.
  cargo build -q --example hyper --example client_layer --all-features >&2 9>&-
  echo "@@ hyper"
  serve "$here/hyper.log" "^listening on" "cargo run -q --example hyper --all-features" \
    "cargo run -q --example hyper --all-features"
  echo "@@ hyper-curl"
  say "curl -si -w '\n' -X PUT localhost:3000/docs/report -H 'Fencing-Token: 7' -d v1"
  say "curl -si -w '\n' -X PUT localhost:3000/docs/report -H 'Fencing-Token: 6' -d v0"
  say "curl -si -w '\n' localhost:3000/docs/report"
  stop

  echo "@@ client-layer"
  say "cargo run -q --example client_layer --all-features"

  # The project outside the workspace, beside `fencing` (the workspace).
  cd "$here"
  ln -s "$root" fencing
  mkdir -p marks-demo/src
  cd marks-demo
  printf '%s\n' "$cargo_toml" >Cargo.toml
  printf '%s\n' "$main_rs" >src/main.rs
  cp "$root/Cargo.lock" .
  echo "@@ cargo-toml toml"
  printf '%s\n' "$cargo_toml"
  echo "@@ main-rs rust,no_run"
  printf '%s\n' "$main_rs"
  case ${CARGO_TARGET_DIR:-} in
    /*) ;;
    *) CARGO_TARGET_DIR=$root/${CARGO_TARGET_DIR:-target} ;;
  esac
  export CARGO_NET_OFFLINE=true CARGO_TARGET_DIR
  cargo build -q >&2 9>&-
  echo "@@ run"
  serve run.log "^listening on" "cargo run -q" "cargo run -q"
  say "cargo run -q"
  stop
}

transcribe docs/integrating.md "$@"
