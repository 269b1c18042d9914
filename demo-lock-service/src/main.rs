//! `demo-lock-service`: the lease service as a program.
//!
//! `demo-lock-service [--listen ADDR] [--data-dir DIR] [--signing-key FILE] ...` serves;
//! `demo-lock-service keygen --secret FILE --public FILE` writes an Ed25519 key pair for
//! `--signing-key` (the secret) and the resources' verifiers (the public key).
//!
//! Prints `listening on ADDR` on stdout once it accepts connections (handy with
//! `--listen 127.0.0.1:0`), logs to stderr (`RUST_LOG`, default `info`), and stops
//! gracefully on Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use demo_lock_service::{Config, DEFAULT_MAX_LEASES, LockService, ProofSigner, shutdown_signal};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// An HTTP lease service issuing durable, strictly increasing fencing tokens.
#[derive(Debug, Parser)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: Serve,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Writes a new Ed25519 key pair: the secret key for `--signing-key`, the public key
    /// for the resources that check proofs. Never overwrites a file.
    Keygen {
        /// Where to write the secret key (created readable by its owner only).
        #[arg(long)]
        secret: PathBuf,
        /// Where to write the public key.
        #[arg(long)]
        public: PathBuf,
    },
}

/// Serving (the default: no subcommand).
#[derive(Debug, Args)]
struct Serve {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7000")]
    listen: SocketAddr,
    /// Directory for the durable state (token counter and grants).
    #[arg(long, default_value = "./data/lock-service")]
    data_dir: PathBuf,
    /// Longest TTL a client may ask for, in milliseconds.
    #[arg(long, default_value_t = 3_600_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_ttl_ms: u64,
    /// Most leases held at once; past it grants get 503 with Retry-After (a live
    /// lease is never evicted).
    #[arg(long, default_value_t = DEFAULT_MAX_LEASES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_leases: u64,
    /// Secret key file (from `keygen`): every grant then carries `"proof"`, a signature
    /// over (lock name, token) that resources check with the public key.
    #[arg(long, value_name = "FILE")]
    signing_key: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Keygen { secret, public }) => keygen(&secret, &public),
        None => run(cli.serve).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("demo-lock-service: {e}");
            ExitCode::FAILURE
        }
    }
}

fn keygen(secret: &Path, public: &Path) -> Result<(), Box<dyn std::error::Error>> {
    // Checked up front so that a refusal leaves no half-written pair behind.
    for path in [secret, public] {
        if path.symlink_metadata().is_ok() {
            return Err(format!("{} exists; keygen never overwrites a key file", path.display()).into());
        }
    }
    let signer = ProofSigner::generate()?;
    signer.write_key_pair(secret, public)?;
    println!("secret key: {}", secret.display());
    println!("public key: {} ({})", public.display(), signer.public_key().to_base64());
    Ok(())
}

async fn run(cli: Serve) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::new(&cli.data_dir)
        .with_max_ttl(Duration::from_millis(cli.max_ttl_ms))
        .with_max_leases(usize::try_from(cli.max_leases).unwrap_or(usize::MAX));
    if let Some(path) = &cli.signing_key {
        let signer = ProofSigner::read(path)?;
        tracing::info!(public_key = signer.public_key().to_base64(), "grants are signed");
        config = config.with_signer(signer);
    }
    config = config.with_metrics(demo_lock_service::install_prometheus()?);
    let service = LockService::open(config)?;
    let listener =
        TcpListener::bind(cli.listen).await.map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, data_dir = %cli.data_dir.display(), max_leases = cli.max_leases, "lock service listening");
    println!("listening on {addr}");
    service
        .serve(listener, async {
            let signal = shutdown_signal().await;
            tracing::info!("{signal}: shutting down")
        })
        .await?;
    tracing::info!("stopped");
    Ok(())
}
