//! The README's quick start: an axum app whose writes are fenced.
//!
//! ```sh
//! cargo run -p fencing-layer --example quickstart --features axum
//! curl -i -X PUT localhost:3000/docs/report -H 'Fencing-Token: 7' -d 'v1'
//! ```

use axum::extract::Path;
use axum::routing::put;
use axum::{Router, serve};
use fencing_layer::{FencingLayer, FencingToken};
use tokio::net::TcpListener;

async fn put_doc(Path(doc): Path<String>, token: FencingToken, body: String) -> String {
    format!("stored {doc} ({} bytes) under token {token}\n", body.len())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // On the route's method router: a method the route does not serve gets 405
    // without reaching the layer (`Router::route_layer` would fence that 405 too).
    let app = Router::new().route(
        "/docs/{doc}",
        put(put_doc).get(|| async { "read, unfenced\n" }).route_layer(FencingLayer::new()),
    );
    let listener = TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on {}", listener.local_addr()?);
    serve(listener, app).await
}
