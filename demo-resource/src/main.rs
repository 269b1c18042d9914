//! `demo-resource`: the fenced storage service, and the seed's scenario.
//!
//! * `demo-resource serve --listen 127.0.0.1:8080 [--no-fencing] [--data-dir DIR | --in-memory]`
//!   prints `listening on ADDR` on stdout once it accepts connections (handy with
//!   port 0), logs to stderr (`RUST_LOG`, default `info`) and stops gracefully on
//!   Ctrl-C or SIGTERM.
//! * `demo-resource serve --postgres URL [--local-marks | --no-fencing]` keeps the
//!   data in PostgreSQL (`postgres://user@host:port/db` or `host=… dbname=…`);
//!   several `serve` processes given the same URL are replicas of one resource.
//!   Each write is fenced in its own transaction, with marks in the database
//!   that every replica checks (and by the per-process layer in front). It
//!   creates the tables at start-up if missing. `--local-marks` keeps only the
//!   per-process layer, to show that it is not enough with several replicas.
//! * `demo-resource scenario` runs the scenario in-process and prints its outcomes;
//!   it exits non-zero if one differs from the expected one. With
//!   `--lock-backend etcd --etcd-endpoints http://127.0.0.1:2379` the tokens come from etcd;
//!   likewise `--lock-backend postgres --postgres-url URL`, `--lock-backend redis --redis-url URL`
//!   and `--lock-backend zookeeper --zookeeper HOST:PORT`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use demo_lock_service::shutdown_signal;
use demo_resource::{Config, Resource, Storage, scenario};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// A storage service whose writes are fenced by fencing tokens.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the logs and key-value routes over HTTP.
    Serve(Serve),
    /// Run the seed's scenario (resources and, by default, the lock service in-process) and print the outcomes.
    Scenario(ScenarioArgs),
}

#[derive(Debug, Args)]
struct ScenarioArgs {
    /// Where the fencing tokens come from: the demo lock service (in-process), etcd,
    /// PostgreSQL, Redis or ZooKeeper.
    #[arg(long, value_enum, default_value_t = LockBackendArg::Demo)]
    lock_backend: LockBackendArg,
    /// etcd client URLs, comma-separated (with `--lock-backend etcd`).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    etcd_endpoints: Vec<String>,
    /// PostgreSQL URL (with `--lock-backend postgres`); the lease tables are created if missing.
    #[arg(long, value_name = "URL", default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    postgres_url: String,
    /// Redis URL (with `--lock-backend redis`). The server must have `appendonly yes` and
    /// `appendfsync always`, unless --redis-accept-volatile-counter.
    #[arg(long, value_name = "URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Use a Redis that would lose its token counter in a crash (tokens could then repeat).
    #[arg(long)]
    redis_accept_volatile_counter: bool,
    /// ZooKeeper ensemble, `HOST:PORT[,HOST:PORT…]` (with `--lock-backend zookeeper`).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:2181")]
    zookeeper: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LockBackendArg {
    /// The demo lock service, started in-process on an ephemeral port.
    Demo,
    /// etcd: the lock key's create revision is the token.
    Etcd,
    /// PostgreSQL: a lease table and a durable counter row.
    Postgres,
    /// Redis: INCR of a per-lock counter (AOF with appendfsync always required).
    Redis,
    /// ZooKeeper: an ephemeral lock znode; its creation zxid is the token.
    Zookeeper,
}

#[derive(Debug, Args)]
struct Serve {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Serve the same routes without the fencing layer, to show the failure.
    #[arg(long)]
    no_fencing: bool,
    /// Directory for the data (`data.redb`) and the fencing marks (`marks.redb`).
    #[arg(long, default_value = "./data/resource")]
    data_dir: PathBuf,
    /// Keep data and marks in memory only: a restart forgets them.
    #[arg(long, conflicts_with = "data_dir")]
    in_memory: bool,
    /// Keep the data in this PostgreSQL database; processes given the same URL are
    /// replicas of one resource. Each write is fenced in its own transaction.
    #[arg(long, value_name = "URL", conflicts_with_all = ["data_dir", "in_memory"])]
    postgres: Option<String>,
    /// With --postgres: fence with each process's own marks only, not in the
    /// database. Stale writes then get through on other replicas: a demonstration.
    // The conflicts are spelled out: clap drops `requires` when the required
    // argument conflicts with one given (`--in-memory --local-marks` would run).
    #[arg(long, requires = "postgres", conflicts_with_all = ["no_fencing", "in_memory", "data_dir"])]
    local_marks: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Serve(_) => "info",
        // The scenario's output is the report; the layer's rejections would only repeat it.
        Command::Scenario(_) => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Serve(args) => match serve(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo-resource: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Scenario(args) => run_scenario(args).await,
    }
}

async fn serve(args: Serve) -> Result<(), Box<dyn std::error::Error>> {
    let config = match args.postgres {
        Some(url) => Config {
            storage: Storage::Postgres { url, fence_in_transaction: !args.local_marks },
            fencing: true,
        },
        None if args.in_memory => Config::in_memory(),
        None => Config::durable(&args.data_dir),
    };
    let config = if args.no_fencing { config.without_fencing() } else { config };
    // Not the URL itself: it may hold a password.
    let storage = match &config.storage {
        Storage::Dir(dir) => format!("{}", dir.display()),
        Storage::InMemory => "in memory".to_owned(),
        Storage::Postgres { fence_in_transaction: true, .. } => {
            "postgres, fenced in each transaction".to_owned()
        }
        Storage::Postgres { fence_in_transaction: false, .. } => "postgres, local marks only".to_owned(),
    };
    let resource = Resource::connect(config.clone()).await?;
    let listener =
        TcpListener::bind(args.listen).await.map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, pid = std::process::id(), storage, fencing = config.fencing, "resource listening");
    println!("listening on {addr}");
    resource.serve(listener, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

async fn run_scenario(args: ScenarioArgs) -> ExitCode {
    let source = match args.lock_backend {
        LockBackendArg::Demo => scenario::TokenSource::DemoLockService,
        LockBackendArg::Etcd => scenario::TokenSource::Etcd { endpoints: args.etcd_endpoints },
        LockBackendArg::Postgres => scenario::TokenSource::Postgres { url: args.postgres_url },
        LockBackendArg::Redis => scenario::TokenSource::Redis {
            url: args.redis_url,
            accept_volatile_counter: args.redis_accept_volatile_counter,
        },
        LockBackendArg::Zookeeper => scenario::TokenSource::ZooKeeper { cluster: args.zookeeper },
    };
    let report = match scenario::run_with(source).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("scenario failed to run: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{report}");
    let problems = report.problems();
    if problems.is_empty() {
        return ExitCode::SUCCESS;
    }
    for problem in problems {
        eprintln!("unexpected outcome: expected that {problem}");
    }
    ExitCode::FAILURE
}
