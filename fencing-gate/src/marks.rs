//! The layer the gate fences with, from `[fencing]`, `[marks]` and the routes:
//! the same [`FencingLayer`] a Rust service would use, handing each admitted
//! request's place over to its upstream exchange.

use std::time::Duration;

use fencing_layer::verify::{Ed25519Verifier, ProofPublicKey};
use fencing_layer::{FencingLayer, MarkStore};
use http::HeaderName;

use crate::config::{GateConfig, Marks};
use crate::routes::{RouteKeys, Routes};

/// The layer for `config`, its marks opened (a database reached, a claims
/// session ready): a store out of reach is an error at start-up, not 503s later.
pub(crate) async fn layer(config: &GateConfig) -> Result<FencingLayer<RouteKeys>, String> {
    let fencing = &config.fencing;
    let header = HeaderName::try_from(&fencing.header).map_err(|e| e.to_string())?;
    let methods = fencing.methods.clone();
    let routes = Routes::new(&config.routes).map_err(|e| e.to_string())?;
    let custom = methods.is_some() || !routes.is_empty() || !fencing.enabled;
    let keys = RouteKeys::new(routes, methods);
    let mut layer = FencingLayer::new()
        .header(header)
        .allow_unfenced(fencing.allow_unfenced)
        .drain_timeout(Duration::from_millis(fencing.drain_timeout_ms))
        .hand_over_places(true)
        .metrics_label("gate")
        // The upstream has no use for the token in extensions: it gets the header.
        .token_extension(false)
        .key_extractor(keys.clone());
    if custom {
        // Each route says which of its methods are fenced; the layer asks the routes.
        let enabled = fencing.enabled;
        layer = layer.unfenced_methods([]).unfenced_if(move |request| !enabled || keys.unfenced(request));
    }
    if let Some(path) = &fencing.verify_key {
        let key = ProofPublicKey::read(path)
            .map_err(|e| format!("[fencing] verify_key {}: {e}", path.display()))?;
        layer = layer.verifier(Ed25519Verifier::new(key));
    }
    Ok(match &config.marks {
        Marks::Memory { max_keys } => layer.store(MarkStore::builder().max_keys(*max_keys).in_memory()),
        Marks::Redb { path, max_keys } => {
            let store = MarkStore::builder()
                .max_keys(*max_keys)
                .open(path)
                .map_err(|e| format!("[marks] path {}: {e}", path.display()))?;
            layer.store(store)
        }
        Marks::Postgres { url } => postgres(layer, url).await?,
        Marks::Etcd { endpoints, prefix } => etcd(layer, endpoints, prefix).await?,
    })
}

#[cfg(feature = "postgres")]
async fn postgres(layer: FencingLayer<RouteKeys>, url: &str) -> Result<FencingLayer<RouteKeys>, String> {
    use fencing_postgres::connect::describe_error;
    use fencing_postgres::{PgConnect, PgFence, PgSharedStore, PoolLimits};
    let connect: PgConnect = url.parse().map_err(|e| format!("[marks] url: {e}"))?;
    let pool = fencing_postgres::pool(connect.clone(), PoolLimits::default()).map_err(|e| e.to_string())?;
    let store = PgSharedStore::new(pool, connect, PgFence::new());
    store.migrate().await.map_err(|e| format!("[marks] postgres: {}", describe_error(&e)))?;
    store.ready().await.map_err(|e| format!("[marks] postgres: {e}"))?;
    Ok(layer.shared_store(store))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: FencingLayer<RouteKeys>, _: &str) -> Result<FencingLayer<RouteKeys>, String> {
    Err("[marks] kind = \"postgres\": this fencing-gate was built without the `postgres` feature".into())
}

#[cfg(feature = "etcd")]
async fn etcd(
    layer: FencingLayer<RouteKeys>,
    endpoints: &[String],
    prefix: &str,
) -> Result<FencingLayer<RouteKeys>, String> {
    let clients = fencing_etcd::member_clients(endpoints, fencing_etcd::connect_options())
        .await
        .map_err(|e| format!("[marks] etcd: {e}"))?;
    let timing = fencing_layer::claims::ClaimTiming::for_term(fencing_etcd::DEFAULT_TERM);
    let store = fencing_etcd::EtcdSharedStore::with_members(clients, prefix.to_owned(), timing)
        .map_err(|e| format!("[marks] etcd: {e}"))?;
    store.ready().await.map_err(|e| format!("[marks] etcd {}: {e}", endpoints.join(",")))?;
    Ok(layer.shared_store(store))
}

#[cfg(not(feature = "etcd"))]
async fn etcd(_: FencingLayer<RouteKeys>, _: &[String], _: &str) -> Result<FencingLayer<RouteKeys>, String> {
    Err("[marks] kind = \"etcd\": this fencing-gate was built without the `etcd` feature".into())
}
