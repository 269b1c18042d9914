//! `fencing-gate`: the command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use fencing_gate::{Gate, GateConfig};
use http::Uri;

/// A reverse proxy that makes any HTTP service a fenced resource: requests whose
/// fencing token is lower than the highest seen for their key get 409, and never
/// reach the upstream.
#[derive(Debug, Parser)]
#[command(name = "fencing-gate", version, about, long_about = None)]
struct Cli {
    /// Where to listen (with --upstream, and no --config: every unsafe method
    /// fenced, keyed by path, marks in memory).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// The service behind the gate: http://host:port.
    #[arg(long, value_name = "URL")]
    upstream: Option<Uri>,
    /// A TOML configuration (routes, marks, timeouts, limits, metrics);
    /// --listen and --upstream override its addresses.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Fence nothing: a plain reverse proxy (to measure what fencing costs).
    #[arg(long)]
    no_fencing: bool,
    /// Threads serving requests (default: TOKIO_WORKER_THREADS, else one per
    /// CPU this process may use). With 1, one event loop and no work stealing,
    /// as an nginx worker.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Check FILE and exit: 0 when the gate would run with it.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["listen", "upstream", "config"])]
    check_config: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let threads = cli
        .threads
        .or_else(|| std::env::var("TOKIO_WORKER_THREADS").ok()?.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    // One thread: a current-thread runtime spares the scheduler's cross-thread
    // wake-ups and the exchange tasks' hand-offs (about 2 µs a fenced request).
    let runtime = match threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
    };
    match runtime {
        Ok(runtime) => runtime.block_on(start(cli)),
        Err(error) => {
            eprintln!("fencing-gate: cannot start the runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn start(cli: Cli) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "fencing_gate=info,fencing_layer=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(path) = &cli.check_config {
        return match read_config(path) {
            Ok(_) => {
                println!("{}: ok", path.display());
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("fencing-gate: {error}");
                ExitCode::from(2)
            }
        };
    }
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fencing-gate: {error}");
            ExitCode::FAILURE
        }
    }
}

fn read_config(path: &PathBuf) -> Result<GateConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    GateConfig::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))
}

async fn run(cli: Cli) -> Result<(), String> {
    let config = match (&cli.config, cli.listen, cli.upstream) {
        (Some(path), listen, upstream) => {
            let mut config = read_config(path)?;
            config.listen = listen.unwrap_or(config.listen);
            if let Some(upstream) = upstream {
                config.upstream = upstream;
                config = config.checked().map_err(|e| e.to_string())?;
            }
            config
        }
        (None, Some(listen), Some(upstream)) => {
            GateConfig::new(listen, upstream).map_err(|e| e.to_string())?
        }
        _ => return Err("give --listen and --upstream, or --config FILE (see --help)".into()),
    };
    let mut config = config;
    if cli.no_fencing {
        config.fencing.enabled = false;
    }
    if let Some(metrics) = &config.metrics {
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| format!("metrics: {e}"))?;
        let listener = tokio::net::TcpListener::bind(metrics.listen)
            .await
            .map_err(|e| format!("[metrics] listen {}: {e}", metrics.listen))?;
        if let Ok(address) = listener.local_addr() {
            tracing::info!(listen = %address, "metrics serving");
        }
        tokio::spawn(fencing_gate::serve_metrics(listener, handle));
    }
    let gate = Gate::new(&config).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(listen = %address, upstream = %config.upstream, marks = ?config.marks, "fencing-gate serving");
    gate.serve(listener, shutdown_signal()).await;
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!("cannot listen for SIGTERM: {error}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
