//! Without `--url`: the stand-in log service, fenced and not, served in this process,
//! and what its server threads spend on the CPU.

use std::net::{SocketAddr, ToSocketAddrs};

use http::HeaderValue;
use tokio::net::TcpListener;

use super::args::Args;
use super::target::Target;
use super::template::PathTemplate;

/// The in-process targets the arguments ask for, served on `runtime`
/// (`unfenced`, `fenced`, then `spin` and `shared` when asked for), their keys after `key_prefix`.
///
/// # Errors
///
/// A listener cannot bind, `--shared-postgres` cannot be reached or migrated, or the
/// path template is not valid.
pub fn targets(
    runtime: &tokio::runtime::Runtime,
    args: &Args,
    key_prefix: &str,
) -> Result<Vec<Target>, Box<dyn std::error::Error>> {
    let layer = fencing_layer::FencingLayer::new().token_extension(args.token_extension);
    let mut routers = vec![
        ("unfenced", crate::standin::router(false)),
        ("fenced", crate::standin::router_with(Some(layer))),
    ];
    if let Some(ns) = args.calibrate_ns {
        routers.push(("spin", crate::standin::router_spinning(ns)));
    }
    if let Some(config) = &args.shared_postgres {
        let layer = runtime.block_on(shared_postgres_layer(config))?;
        routers.push(("shared", crate::standin::router_with(Some(layer))));
    }
    if let Some(endpoint) = &args.shared_etcd {
        let layer = runtime.block_on(shared_etcd_layer(endpoint, key_prefix))?;
        routers.push(("shared-etcd", crate::standin::router_with(Some(layer))));
    }
    let template =
        PathTemplate::parse(args.path.as_deref().unwrap_or(args.default_path()))?.with_key_prefix(key_prefix);
    template.check()?;
    let mut targets = Vec::new();
    for (label, router) in routers {
        if args.only.as_deref().is_some_and(|only| only != label) {
            continue;
        }
        let addr = serve(runtime, router)?;
        let host = HeaderValue::from_str(&addr.to_string())?;
        targets.push(Target {
            label: label.to_owned(),
            replicas: vec![(addr, host)],
            template: template.clone(),
        });
    }
    Ok(targets)
}

/// `--serve-only ADDR`: the fenced stand-in, as [`targets`] builds it, on `addr` (loopback
/// only) in `runtime`, for another load generator.
///
/// # Errors
///
/// Not a loopback address, or the listener cannot bind.
pub fn serve_fenced_at(
    runtime: &tokio::runtime::Runtime,
    args: &Args,
    addr: SocketAddr,
) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    if !addr.ip().is_loopback() {
        return Err(format!("--serve-only {addr}: not a loopback address; refusing").into());
    }
    let layer = fencing_layer::FencingLayer::new().token_extension(args.token_extension);
    Ok(serve_on(runtime, crate::standin::router_with(Some(layer)), addr)?)
}

/// Starts `router` on `127.0.0.1:0` in `runtime`; returns its address.
fn serve(runtime: &tokio::runtime::Runtime, router: axum::Router) -> std::io::Result<SocketAddr> {
    serve_on(runtime, router, SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// Starts `router` on `addr` in `runtime`; returns its address.
fn serve_on(
    runtime: &tokio::runtime::Runtime,
    router: axum::Router,
    addr: SocketAddr,
) -> std::io::Result<SocketAddr> {
    use axum::serve::ListenerExt;
    let listener = runtime.block_on(TcpListener::bind(addr))?;
    let addr = listener.local_addr()?;
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    runtime.spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

/// A default layer deciding in a `PgSharedStore` on `config`, a loopback database.
async fn shared_postgres_layer(
    config: &str,
) -> Result<fencing_layer::FencingLayer, Box<dyn std::error::Error>> {
    let config: fencing_postgres::PgConnect = config.parse()?;
    let loopback = config.config().get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => {
            (name.as_str(), 0).to_socket_addrs().is_ok_and(|mut a| a.all(|a| a.ip().is_loopback()))
        }
        tokio_postgres::config::Host::Unix(_) => true,
    });
    if !loopback {
        return Err("--shared-postgres: not a loopback database; refusing".into());
    }
    let limits = fencing_postgres::PoolLimits { max_size: 64, ..Default::default() };
    let store = fencing_postgres::PgSharedStore::new(
        fencing_postgres::pool(config.clone(), limits)?,
        config,
        Default::default(),
    );
    store.migrate().await?;
    Ok(fencing_layer::FencingLayer::new().shared_store(store))
}

/// `--shared-etcd` in a build without feature `etcd`: how to build it with.
#[cfg(not(feature = "etcd"))]
async fn shared_etcd_layer(
    endpoint: &str,
    _key_prefix: &str,
) -> Result<fencing_layer::FencingLayer, Box<dyn std::error::Error>> {
    Err(format!(
        "--shared-etcd {endpoint}: fencing-load was built without feature `etcd` \
         (cargo build --release -p fencing-benches --bin fencing-load --features etcd)"
    )
    .into())
}

/// A default layer deciding in an `EtcdSharedStore` at `endpoint`, a loopback etcd,
/// under a prefix of this run's own.
#[cfg(feature = "etcd")]
async fn shared_etcd_layer(
    endpoint: &str,
    key_prefix: &str,
) -> Result<fencing_layer::FencingLayer, Box<dyn std::error::Error>> {
    let url: http::Uri = endpoint.parse()?;
    let host = url.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let loopback = (host, 0).to_socket_addrs().is_ok_and(|mut a| a.all(|a| a.ip().is_loopback()));
    if !loopback {
        return Err("--shared-etcd: not a loopback etcd; refusing".into());
    }
    let prefix = format!("fencing-load/{key_prefix}/");
    let store = fencing_etcd::EtcdSharedStore::connect([endpoint], prefix).await?;
    store.ready().await?;
    Ok(fencing_layer::FencingLayer::new().shared_store(store))
}

/// Nanoseconds spent on a CPU by this process's threads named `name` (tokio's
/// `thread_name`), from `/proc/self/task/*/schedstat`: unlike wall time, other
/// processes competing for the cores do not inflate it. `None` off Linux.
#[must_use]
pub fn threads_cpu_ns(name: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
        total += stat.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()).unwrap_or(0);
    }
    Some(total)
}

/// The 1, 5 and 15 minute load averages, or `unknown`.
#[must_use]
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}
