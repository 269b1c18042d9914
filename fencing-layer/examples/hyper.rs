//! A bare hyper 1 server fenced by the layer: no axum, no framework, only
//! hyper's `serve_connection` and a tower service wrapped by `FencingLayer`.
//! hyper has its own `Service` trait, so a tower service goes through
//! `hyper_util::service::TowerToHyperService`. `tests/it/integrating.rs` serves
//! this file's `serve` and sends it requests.
//!
//! ```sh
//! cargo run -p fencing-layer --example hyper     # listens on 127.0.0.1:3000
//! curl -i -X PUT localhost:3000/docs/report -H 'Fencing-Token: 7' -d v1
//! ```

use bytes::Bytes;
use fencing_layer::{FencingLayer, FencingToken};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::{Layer, service_fn};

/// The handler: any `Service<Request<Incoming>>` whose response body is `From<Bytes>`
/// (the layer builds its problem+json rejections from `Bytes`).
async fn handle(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    // The token the layer admitted this request with; unfenced methods have none.
    let token = FencingToken::current();
    let path = request.uri().path().to_owned();
    let body = request.into_body().collect().await?.to_bytes();
    let text = match token {
        Some(token) => format!("stored {path} ({} bytes) under token {token}\n", body.len()),
        None => format!("read {path}, unfenced\n"),
    };
    Ok(Response::new(Full::new(Bytes::from(text))))
}

/// Serves `listener` until accepting fails, every connection through one fenced service.
pub async fn serve(listener: TcpListener, layer: FencingLayer) -> std::io::Result<()> {
    // One `Fencing<_>` for every connection: its clones share the marks.
    let fenced = layer.layer(service_fn(handle));
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(fenced.clone());
        tokio::spawn(async move {
            if let Err(error) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                eprintln!("connection error: {error}");
            }
        });
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on {}", listener.local_addr()?);
    serve(listener, FencingLayer::new()).await
}
