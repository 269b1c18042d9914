//! gRPC through a real tonic server and client: the layer answers gRPC calls
//! with gRPC statuses (the client sees `Aborted`, not a protocol error),
//! `Server::builder().layer(..)` and `add_service(layer.layer(..))` both
//! compile and work, metadata carries the token and the key, and read-only
//! methods can be left unfenced.
#![cfg(feature = "tonic")]

use std::net::SocketAddr;

use fencing_layer::{FencingLayer, MarkStore, key::HeaderKey};
use http::HeaderName;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::Layer;

/// Serves the health service behind `layer` on an ephemeral loopback port.
async fn serve(
    layer: FencingLayer<HeaderKey>,
    as_a_named_service: bool,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = if as_a_named_service {
        // `Fencing<HealthServer<_>>` is a NamedService.
        tokio::spawn(async move {
            Server::builder().add_service(layer.layer(health)).serve_with_incoming(incoming).await.unwrap();
        })
    } else {
        tokio::spawn(async move {
            Server::builder().layer(layer).add_service(health).serve_with_incoming(incoming).await.unwrap();
        })
    };
    (addr, server)
}

/// A health check carrying `token` (if any) and the resource `key` in metadata.
async fn check(
    client: &mut HealthClient<Channel>,
    token: Option<&str>,
    key: &str,
) -> Result<(), tonic::Status> {
    let mut request = Request::new(HealthCheckRequest { service: String::new() });
    if let Some(token) = token {
        request.metadata_mut().insert("fencing-token", token.parse().unwrap());
    }
    request.metadata_mut().insert("x-resource", key.parse().unwrap());
    client.check(request).await.map(drop)
}

fn layer(store: &MarkStore) -> FencingLayer<HeaderKey> {
    FencingLayer::new()
        .store(store.clone())
        .key_extractor(HeaderKey::new(HeaderName::from_static("x-resource")))
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    HealthClient::new(channel)
}

#[tokio::test]
async fn rejections_reach_a_tonic_client_as_grpc_statuses() {
    for as_a_named_service in [false, true] {
        let store = MarkStore::in_memory();
        let (addr, server) = serve(layer(&store), as_a_named_service).await;
        let mut client = client(addr).await;

        check(&mut client, Some("5"), "ledger-1").await.unwrap();
        assert_eq!(store.mark("ledger-1"), Some(5));

        let stale = check(&mut client, Some("4"), "ledger-1").await.unwrap_err();
        assert_eq!(stale.code(), Code::Aborted, "{stale:?}");
        assert_eq!(stale.message(), "fencing token 4 is stale for ledger-1: the highest seen is 5");
        let metadata = stale.metadata();
        assert_eq!(metadata.get("fencing-problem").unwrap(), "stale-token");
        assert_eq!(metadata.get("fencing-key").unwrap(), "ledger-1");
        assert_eq!(metadata.get("fencing-presented-token").unwrap(), "4");
        assert_eq!(metadata.get("fencing-highest-token").unwrap(), "5");

        let missing = check(&mut client, None, "ledger-1").await.unwrap_err();
        assert_eq!(missing.code(), Code::FailedPrecondition, "{missing:?}");
        let invalid = check(&mut client, Some("04"), "ledger-1").await.unwrap_err();
        assert_eq!(invalid.code(), Code::InvalidArgument, "{invalid:?}");

        // The same channel goes on working after the refusals, and the mark holds.
        check(&mut client, Some("6"), "ledger-1").await.unwrap();
        assert_eq!(store.mark("ledger-1"), Some(6));
        server.abort();
    }
}

#[tokio::test]
async fn read_only_methods_can_be_left_unfenced() {
    let store = MarkStore::in_memory();
    let layer = layer(&store).unfenced_if(|request| request.path() == "/grpc.health.v1.Health/Check");
    let (addr, server) = serve(layer, false).await;
    let mut client = client(addr).await;
    check(&mut client, None, "ledger-1").await.unwrap();
    check(&mut client, Some("1"), "ledger-1").await.unwrap();
    assert_eq!(store.mark("ledger-1"), None, "an unfenced call leaves the marks alone");
    server.abort();
}

#[tokio::test]
async fn problem_json_when_grpc_statuses_are_off() {
    let store = MarkStore::in_memory();
    store.seed("ledger-1", 5).unwrap();
    let (addr, server) = serve(layer(&store).grpc_statuses(false), false).await;
    let mut client = client(addr).await;
    // What tonic users saw before: the HTTP status, and a body that is not gRPC.
    let status = check(&mut client, Some("4"), "ledger-1").await.unwrap_err();
    assert_ne!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("409"), "{status:?}");
    server.abort();
}
