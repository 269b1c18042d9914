//! A fenced gRPC service: tonic's health service behind `FencingLayer`, keyed by
//! the `x-resource` metadata, then a tonic client that writes with token 5,
//! then with the stale token 4. Runs on loopback and exits.
//!
//! ```text
//! cargo run -p fencing-layer --example grpc --features tonic
//! ```

use fencing_layer::{FencingLayer, key::HeaderKey};
use http::HeaderName;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layer = FencingLayer::new()
        .key_extractor(HeaderKey::new(HeaderName::from_static("x-resource")))
        // Every gRPC call is a POST: leave the read-only ones unfenced by path.
        .unfenced_if(|request| request.path() == "/grpc.health.v1.Health/Watch");
    let (_reporter, health) = tonic_health::server::health_reporter();
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse()?)?;
    let addr = incoming.local_addr()?;
    tokio::spawn(Server::builder().layer(layer).add_service(health).serve_with_incoming(incoming));

    let mut client = HealthClient::new(Channel::from_shared(format!("http://{addr}"))?.connect().await?);
    for token in [5, 4] {
        let mut request = tonic::Request::new(HealthCheckRequest::default());
        request.metadata_mut().insert("fencing-token", token.into());
        request.metadata_mut().insert("x-resource", "ledger-1".parse()?);
        match client.check(request).await {
            Ok(_) => println!("token {token}: OK"),
            Err(status) => {
                let highest =
                    status.metadata().get("fencing-highest-token").map(|v| v.to_str().unwrap_or("?"));
                println!(
                    "token {token}: {:?} \"{}\" (fencing-highest-token: {})",
                    status.code(),
                    status.message(),
                    highest.unwrap_or("-")
                );
            }
        }
    }
    Ok(())
}
