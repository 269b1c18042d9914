//! `demo-lock-service`: the lease service as a program.
//!
//! Prints `listening on ADDR` on stdout once it accepts connections (handy with
//! `--listen 127.0.0.1:0`), logs to stderr (`RUST_LOG`, default `info`), and stops
//! gracefully on Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use demo_lock_service::{Config, LockService, shutdown_signal};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// An HTTP lease service issuing durable, strictly increasing fencing tokens.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7000")]
    listen: SocketAddr,
    /// Directory for the durable state (token counter and grants).
    #[arg(long, default_value = "./data/lock-service")]
    data_dir: PathBuf,
    /// Longest TTL a client may ask for, in milliseconds.
    #[arg(long, default_value_t = 3_600_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_ttl_ms: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("demo-lock-service: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::new(&cli.data_dir).with_max_ttl(Duration::from_millis(cli.max_ttl_ms));
    let service = LockService::open(config)?;
    let listener =
        TcpListener::bind(cli.listen).await.map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, data_dir = %cli.data_dir.display(), "lock service listening");
    println!("listening on {addr}");
    service.serve(listener, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
