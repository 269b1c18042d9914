//! `scenarios`: the stories of the fencing workspace on the command line: the seed's scenario (by
//! default), `billing`, and the payment stand-in (`payments`), each printing what happened.
//! It serves nothing to keep: the fenced storage service's own commands are `demo-resource serve | marks`.
//!
//! * `scenarios` runs the seed's scenario in-process (the demo lock service and the storage
//!   service on ephemeral loopback ports) and prints its outcomes; it exits non-zero if one
//!   differs from the expected one. With `--lock-backend etcd --etcd-endpoints
//!   http://127.0.0.1:2379` the tokens come from etcd; likewise `--lock-backend postgres
//!   --postgres-url URL`, `--lock-backend redis --redis-url URL` and `--lock-backend zookeeper
//!   --zookeeper HOST:PORT`, each in a binary built with the feature of the same name (`cargo run
//!   -p scenarios --features etcd -- --lock-backend etcd`). `--timeline FILE.svg` also draws the
//!   three rounds on one time axis (grants, leases, the pause, each write's token and outcome, the
//!   resource's mark).
//! * `scenarios billing [--timeline FILE.svg]` (built with `--features billing`) runs the seed's
//!   second failure: a billing job on a Redis lock (`--redis-url`, default 127.0.0.1:6379; a
//!   private `redis-server` when none answers) charging customers through the payment stand-in,
//!   unfenced, with a fenced per-run record in PostgreSQL (`--postgres-url`), and with the record
//!   and idempotency keys (docs/billing.md). Non-zero exit if an outcome differs from the prediction.
//! * `scenarios payments --listen 127.0.0.1:8090` serves the payment-provider stand-in (`POST
//!   /v1/charges` with `Idempotency-Key`; see the `payments` module); prints `listening on ADDR`.
//!
//! Every build has every command and flag (`--help` lists them all); one whose feature was not
//! built exits 1 with the command to rebuild and run it with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use demo_lock_service::{Served, shutdown_signal};
#[cfg(feature = "billing")]
use scenarios::billing;
use scenarios::scenario;
use scenarios::timeline::Timeline;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// The fencing workspace's stories: the seed's scenario (by default), billing, the payment stand-in.
#[derive(Debug, Parser)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    /// Another story than the seed's scenario (the default).
    #[command(subcommand)]
    command: Option<Command>,
    /// The seed's scenario's flags.
    #[command(flatten)]
    scenario: ScenarioArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The seed's second failure: a billing job on a Redis lock charges customers twice;
    /// a fenced per-run record, then idempotency keys, fix it (needs `--features billing`).
    Billing(BillingArgs),
    /// Serve the payment-provider stand-in: charges, deduplicated by `Idempotency-Key`.
    Payments(PaymentsArgs),
}

#[derive(Debug, Args)]
struct PaymentsArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
}

#[derive(Debug, Args)]
struct BillingArgs {
    /// The Redis holding the lock; when none answers there, a private redis-server is
    /// started on an ephemeral loopback port (needs `redis-server` on PATH).
    #[arg(long, value_name = "URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// A PostgreSQL database to connect to; the runs' record goes into a new database
    /// of the scenario's own on that server, dropped at the end.
    #[arg(
        long,
        value_name = "URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres?connect_timeout=3"
    )]
    postgres_url: String,
    /// How many customers the job charges.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(2..=50))]
    customers: u16,
    /// A's lock TTL in milliseconds (`PX`); A is paused past it.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..=10_000))]
    ttl_ms: u64,
    /// Also draw the rounds on one time axis, as an SVG picture written to FILE.
    #[arg(long, value_name = "FILE.svg")]
    timeline: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ScenarioArgs {
    /// Where the fencing tokens come from: the demo lock service (in-process), etcd,
    /// PostgreSQL, Redis or ZooKeeper (each built with its feature: `--features etcd`...).
    #[arg(long, value_enum, default_value_t = LockBackendArg::Demo)]
    lock_backend: LockBackendArg,
    /// etcd client URLs, comma-separated (with `--lock-backend etcd`); `https://` ones over TLS.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    etcd_endpoints: Vec<String>,
    /// With `https://` etcd endpoints: the CA certificate(s) (PEM file) that signed etcd's
    /// certificates. Without it, they are checked against the system's roots.
    #[arg(long, value_name = "FILE")]
    etcd_ca: Option<PathBuf>,
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
    /// With a `rediss://` URL (Redis over TLS): the CA certificate(s) (PEM file) that signed
    /// Redis's certificate. Without it, the system's roots (`rediss://HOST:PORT/#insecure`
    /// checks no certificate: for tests only).
    #[arg(long, value_name = "FILE")]
    redis_ca: Option<PathBuf>,
    /// ZooKeeper ensemble, `HOST:PORT[,HOST:PORT…]` (with `--lock-backend zookeeper`).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:2181")]
    zookeeper: String,
    /// Reach the ZooKeeper servers over TLS (give their secure client ports), checking their
    /// certificates with the CA certificate(s) in this PEM file. Needs scenarios built with
    /// `--features zookeeper-tls`.
    #[arg(long, value_name = "FILE")]
    zookeeper_ca: Option<PathBuf>,
    /// Also draw the three rounds on one time axis, as an SVG picture written to FILE.
    #[arg(long, value_name = "FILE.svg")]
    timeline: Option<PathBuf>,
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Some(Command::Payments(_)) => "info",
        // A story's output is its report; the layer's rejections would only repeat it.
        None | Some(Command::Billing(_)) => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        None => run_scenario(cli.scenario).await,
        Some(Command::Billing(args)) => run_billing(args).await,
        Some(Command::Payments(args)) => match payments(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("scenarios payments: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// What a command whose feature this binary was built without answers: the
/// feature, and the command again with it (`args`: what follows `--`).
fn not_built(what: &str, feature: &str, args: &str) -> String {
    format!(
        "{what} needs scenarios built with --features {feature}: \
         cargo run -p scenarios --features {feature} -- {args}"
    )
}

async fn run_scenario(args: ScenarioArgs) -> ExitCode {
    let needs = match args.lock_backend {
        LockBackendArg::Demo => None,
        LockBackendArg::Etcd => (!cfg!(feature = "etcd")).then_some("etcd"),
        LockBackendArg::Postgres => (!cfg!(feature = "postgres")).then_some("postgres"),
        LockBackendArg::Redis => (!cfg!(feature = "redis")).then_some("redis"),
        LockBackendArg::Zookeeper => (!cfg!(feature = "zookeeper")).then_some("zookeeper"),
    };
    if let Some(feature) = needs {
        let args = format!("--lock-backend {feature}");
        eprintln!("scenarios: {}", not_built(&format!("the scenario with {args}"), feature, &args));
        return ExitCode::FAILURE;
    }
    let source = match args.lock_backend {
        LockBackendArg::Demo => scenario::TokenSource::DemoLockService,
        LockBackendArg::Etcd => {
            scenario::TokenSource::Etcd { endpoints: args.etcd_endpoints, ca_file: args.etcd_ca }
        }
        LockBackendArg::Postgres => scenario::TokenSource::Postgres { url: args.postgres_url },
        LockBackendArg::Redis => scenario::TokenSource::Redis {
            url: args.redis_url,
            accept_volatile_counter: args.redis_accept_volatile_counter,
            ca_file: args.redis_ca,
        },
        LockBackendArg::Zookeeper => {
            scenario::TokenSource::ZooKeeper { cluster: args.zookeeper, ca_file: args.zookeeper_ca }
        }
    };
    let run = scenario::run_with(source).await.map(|r| (r.to_string(), r.timeline(), r.problems()));
    conclude("scenario", run, args.timeline.as_deref(), "expected that")
}

/// Ends a scenario or billing run: its report on stdout, its timeline
/// drawn to `timeline` if asked, and success only when every outcome was the
/// expected one (each other one on stderr, after `expected`).
fn conclude(
    what: &str,
    run: Result<(String, Timeline, Vec<String>), impl std::fmt::Display>,
    timeline: Option<&std::path::Path>,
    expected: &str,
) -> ExitCode {
    let (report, picture, problems) = match run {
        Ok(run) => run,
        Err(e) => {
            eprintln!("{what} failed to run: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{report}");
    if let Some(path) = timeline {
        if let Err(e) = std::fs::write(path, picture.to_svg()) {
            eprintln!("cannot write the timeline to {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("timeline: {}", path.display());
    }
    if problems.is_empty() {
        return ExitCode::SUCCESS;
    }
    for problem in problems {
        eprintln!("unexpected outcome: {expected} {problem}");
    }
    ExitCode::FAILURE
}

/// `scenarios payments`: the payment-provider stand-in until Ctrl-C or SIGTERM.
async fn payments(args: PaymentsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let listener =
        TcpListener::bind(args.listen).await.map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, pid = std::process::id(), "payment provider stand-in listening");
    println!("listening on {addr}");
    scenarios::payments::Provider::default()
        .serve(listener, async {
            let signal = shutdown_signal().await;
            tracing::info!("{signal}: shutting down")
        })
        .await?;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(not(feature = "billing"))]
async fn run_billing(_: BillingArgs) -> ExitCode {
    eprintln!("scenarios: {}", not_built("billing", "billing", "billing"));
    ExitCode::FAILURE
}

#[cfg(feature = "billing")]
async fn run_billing(args: BillingArgs) -> ExitCode {
    let options = billing::Options {
        redis_url: args.redis_url,
        postgres_url: args.postgres_url,
        customers: usize::from(args.customers),
        ttl: std::time::Duration::from_millis(args.ttl_ms),
    };
    let run = billing::run(&options).await.map(|r| (r.to_string(), r.timeline(), r.problems()));
    conclude("billing scenario", run, args.timeline.as_deref(), "expected")
}
