//! `demo-resource`: the fenced storage service, and the seed's scenario.
//!
//! * `demo-resource serve --listen 127.0.0.1:8080 [--no-fencing] [--data-dir DIR | --in-memory]`
//!   prints `listening on ADDR` on stdout once it accepts connections (handy with
//!   port 0), logs to stderr (`RUST_LOG`, default `info`) and stops gracefully on
//!   Ctrl-C or SIGTERM.
//! * `demo-resource serve --postgres URL [--shared-marks | --local-marks | --no-fencing]` (built
//!   with `--features postgres`) keeps the data in PostgreSQL (`postgres://user@host:port/db`
//!   or `host=… dbname=…`); several `serve` processes given the same URL are replicas of one resource.
//!   Each write is fenced in its own transaction, with marks in the database
//!   that every replica checks (and by the per-process layer in front). It
//!   creates the tables at start-up if missing. `--local-marks` keeps only the
//!   per-process layer, to show that it is not enough with several replicas.
//! * `serve --verify-key FILE`: a token may raise a path's mark only with the lock
//!   service's `Fencing-Proof` for that path's lock (FILE: the public key, one line
//!   of URL-safe base64); a raise without one is 403. Works with `--postgres` too
//!   (the layer checks before the database's fence; give every replica the key).
//! * `serve --admin-listen 127.0.0.1:9090`: the admin routes (`GET /marks`,
//!   `GET /marks?key=K`, `POST /marks/reset`) on a second, loopback-only listener;
//!   prints `admin listening on ADDR` after `listening on ADDR`. Off by default;
//!   not with `--postgres` (its marks are in the database) or `--no-fencing`.
//! * `demo-resource marks list | get KEY | reset KEY --to N [--data-dir DIR] [--json]`
//!   reads or repairs the marks of a stopped service's data directory
//!   (`DIR/marks.redb`; a reset sets the data's own fence in `DIR/data.redb` too);
//!   refused while a `serve` still holds the files. docs/operating-marks.md.
//! * `demo-resource scenario` runs the scenario in-process and prints its outcomes;
//!   it exits non-zero if one differs from the expected one. With
//!   `--lock-backend etcd --etcd-endpoints http://127.0.0.1:2379` the tokens come from etcd;
//!   likewise `--lock-backend postgres --postgres-url URL`, `--lock-backend redis --redis-url URL`
//!   and `--lock-backend zookeeper --zookeeper HOST:PORT`, each in a binary built with the
//!   feature of the same name (`cargo run -p demo-resource --features etcd -- scenario
//!   --lock-backend etcd`). `--timeline FILE.svg` also draws the three rounds on one
//!   time axis (grants, leases, the pause, each write's token and outcome, the
//!   resource's mark).
//! * `demo-resource scenario billing [--timeline FILE.svg]` (built with `--features
//!   billing`) runs the seed's second failure: a billing job on a Redis lock (`--redis-url`, default
//!   127.0.0.1:6379; a private `redis-server` when none answers) charging
//!   customers through the payment stand-in, unfenced, with a fenced per-run record
//!   in PostgreSQL (`--postgres-url`), and with the record and idempotency keys
//!   (docs/billing.md). Non-zero exit if an outcome differs from the prediction.
//! * `demo-resource payments --listen 127.0.0.1:8090` serves the payment-provider
//!   stand-in (`POST /v1/charges` with `Idempotency-Key`; see the `payments` module);
//!   prints `listening on ADDR`.
//!
//! Every build has every command and flag (`--help` lists them all); one whose feature
//! was not built exits 1 with the command to rebuild and run it with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use demo_lock_service::shutdown_signal;
#[cfg(feature = "billing")]
use demo_resource::billing;
use demo_resource::timeline::Timeline;
use demo_resource::{Config, ResetError, Resource, Served, StoppedMarks, Storage, scenario};
use fencing_layer::verify::ProofPublicKey;
use serde_json::json;
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
    /// List, read or reset the fencing marks of a stopped service's data directory.
    Marks(MarksArgs),
    /// Run the seed's scenario (resources and, by default, the lock service in-process) and print the outcomes.
    Scenario(ScenarioArgs),
    /// Serve the payment-provider stand-in: charges, deduplicated by `Idempotency-Key`.
    Payments(PaymentsArgs),
}

#[derive(Debug, Args)]
struct PaymentsArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
}

#[derive(Debug, Subcommand)]
enum ScenarioCommand {
    /// The seed's second failure: a billing job on a Redis lock charges customers twice;
    /// a fenced per-run record, then idempotency keys, fix it (needs `--features billing`).
    Billing(BillingArgs),
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
#[command(args_conflicts_with_subcommands = true)]
struct ScenarioArgs {
    /// Another scenario than the seed's first (the default).
    #[command(subcommand)]
    which: Option<ScenarioCommand>,
    /// Where the fencing tokens come from: the demo lock service (in-process), etcd,
    /// PostgreSQL, Redis or ZooKeeper (each built with its feature: `--features etcd`...).
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

#[derive(Debug, Args)]
struct MarksArgs {
    #[command(subcommand)]
    command: MarksCommand,
    /// The data directory the service used (`--data-dir` of `serve`); its marks are `DIR/marks.redb`.
    #[arg(long, global = true, default_value = "./data/resource")]
    data_dir: PathBuf,
    /// Print JSON instead of lines of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum MarksCommand {
    /// Every key and its mark, sorted by key: `KEY MARK` lines.
    List,
    /// One key's mark (the percent-decoded path, such as `/logs/billing`).
    Get {
        /// The key.
        key: String,
    },
    /// Set one key's mark to N, lower or higher; prints `KEY OLD -> NEW`. Lowering
    /// readmits the tokens between N and the old mark: only once their holders are gone.
    Reset {
        /// The key; it must have a mark already.
        key: String,
        /// The new mark.
        #[arg(long, value_name = "N")]
        to: u64,
    },
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
    /// replicas of one resource. Each write is fenced in its own transaction. Needs
    /// demo-resource built with `--features postgres`.
    #[arg(long, value_name = "URL", conflicts_with_all = ["data_dir", "in_memory"])]
    postgres: Option<String>,
    /// With --postgres: fence with each process's own marks only, not in the
    /// database. Stale writes then get through on other replicas: a demonstration.
    // The conflicts are spelled out: clap drops `requires` when the required
    // argument conflicts with one given (`--in-memory --local-marks` would run).
    #[arg(long, requires = "postgres", conflicts_with_all = ["no_fencing", "in_memory", "data_dir"])]
    local_marks: bool,
    /// With --postgres: the layer decides through marks every replica shares (replica
    /// claims in the database, admitted in memory), for any effect; the writes are then
    /// not fenced in their transactions. See docs/replicas.md.
    #[arg(long, requires = "postgres", conflicts_with_all = ["local_marks", "no_fencing", "in_memory", "data_dir"])]
    shared_marks: bool,
    /// With --postgres: serve even from a server that could lose an acknowledged commit
    /// in a crash or failover (`synchronous_commit = off`, an asynchronous standby).
    /// Refused without it: a mark raised there can come back lower.
    #[arg(long, requires = "postgres")]
    accept_volatile_commits: bool,
    /// The lock service's public key (one line of URL-safe base64): a token may raise a
    /// mark only with a valid `Fencing-Proof` for its path's lock, else 403.
    #[arg(long, value_name = "FILE", conflicts_with = "no_fencing")]
    verify_key: Option<PathBuf>,
    /// Serve the admin routes (list, read, reset marks) on this loopback address too.
    /// They have no authentication. Off by default.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["no_fencing", "postgres"])]
    admin_listen: Option<SocketAddr>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Serve(_) => "info",
        // A reset's warn line (key, old, new) is its record.
        Command::Marks(_) => "warn",
        // The scenario's output is the report; the layer's rejections would only repeat it.
        Command::Scenario(_) => "warn",
        Command::Payments(_) => "info",
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
        Command::Marks(args) => match marks(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo-resource marks: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Scenario(ScenarioArgs { which: Some(ScenarioCommand::Billing(args)), .. }) => {
            run_billing(args).await
        }
        Command::Scenario(args) => run_scenario(args).await,
        Command::Payments(args) => match payments(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo-resource payments: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

async fn serve(args: Serve) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(admin) = args.admin_listen
        && !admin.ip().is_loopback()
    {
        return Err(format!(
            "--admin-listen {admin}: the admin routes have no authentication; give a loopback address"
        )
        .into());
    }
    if args.postgres.is_some() && !cfg!(feature = "postgres") {
        return Err(not_built("serve --postgres", "postgres", "serve --postgres URL").into());
    }
    let verify_key = match &args.verify_key {
        Some(path) => Some(ProofPublicKey::read(path)?),
        None => None,
    };
    let config = match args.postgres {
        Some(url) => Config {
            storage: Storage::Postgres {
                url,
                fence_in_transaction: !args.local_marks,
                shared_marks: args.shared_marks,
            },
            fencing: true,
            verify_key: None,
            claim_timing: None,
            claims_session_url: None,
            accept_volatile_commits: args.accept_volatile_commits,
        },
        None if args.in_memory => Config::in_memory(),
        None => Config::durable(&args.data_dir),
    };
    let config = if args.no_fencing { config.without_fencing() } else { config };
    let config = match verify_key {
        Some(key) => config.verify_key(key),
        None => config,
    };
    // Not the URL itself: it may hold a password.
    let storage = match &config.storage {
        Storage::Dir(dir) => format!("{}", dir.display()),
        Storage::InMemory => "in memory".to_owned(),
        // `--no-fencing`: the same tables, nothing fenced.
        Storage::Postgres { .. } if !config.fencing => "postgres".to_owned(),
        Storage::Postgres { shared_marks: true, .. } => "postgres, shared marks (replica claims)".to_owned(),
        Storage::Postgres { fence_in_transaction: true, .. } => {
            "postgres, fenced in each transaction".to_owned()
        }
        Storage::Postgres { fence_in_transaction: false, .. } => "postgres, local marks only".to_owned(),
    };
    let resource =
        Resource::connect(config.clone()).await?.with_metrics(demo_resource::install_prometheus()?);
    let listener =
        TcpListener::bind(args.listen).await.map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr()?;
    let admin = match args.admin_listen {
        Some(admin) => Some(
            TcpListener::bind(admin).await.map_err(|e| format!("cannot listen on {admin} (admin): {e}"))?,
        ),
        None => None,
    };
    let verified = config.verify_key.is_some();
    tracing::info!(%addr, pid = std::process::id(), storage, fencing = config.fencing, verified, "resource listening");
    println!("listening on {addr}");
    // One signal stops both listeners.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let admin = match admin {
        Some(listener) => {
            let admin_addr = listener.local_addr()?;
            tracing::warn!(%admin_addr, "admin routes listening (no authentication: keep them on loopback)");
            println!("admin listening on {admin_addr}");
            let resource = resource.clone();
            let until = until_stopped();
            Some(tokio::spawn(async move { resource.serve_admin(listener, until).await }))
        }
        None => None,
    };
    resource.serve(listener, until_stopped()).await?;
    if let Some(admin) = admin {
        admin.await??;
    }
    tracing::info!("stopped");
    Ok(())
}

/// `demo-resource marks …`: opens `DIR/marks.redb` and `DIR/data.redb` (never creates them) and acts on them.
fn marks(args: MarksArgs) -> Result<(), Box<dyn std::error::Error>> {
    let stopped = StoppedMarks::open(&args.data_dir)?;
    let file = args.data_dir.join("marks.redb");
    let line = |key: &str, rest: &str| format!("{} {rest}", escape(key));
    match args.command {
        MarksCommand::List => {
            let marks = stopped.marks();
            if args.json {
                let marks: Vec<_> =
                    marks.iter().map(|(key, mark)| json!({ "key": key, "mark": mark })).collect();
                println!("{}", json!({ "marks": marks }));
            } else {
                for (key, mark) in marks {
                    println!("{}", line(&key, &mark.to_string()));
                }
            }
        }
        MarksCommand::Get { key } => {
            let mark =
                stopped.mark(&key).ok_or_else(|| format!("no mark for key {key:?} in {}", file.display()))?;
            if args.json {
                println!("{}", json!({ "key": key, "mark": mark }));
            } else {
                println!("{}", line(&key, &mark.to_string()));
            }
        }
        MarksCommand::Reset { key, to } => {
            let old = stopped.reset(&key, to).map_err(|error| match error {
                ResetError::UnknownKey => {
                    format!("no mark for key {key:?} in {}: nothing to reset", file.display())
                }
                error => format!("{key:?}: {error}"),
            })?;
            if args.json {
                println!("{}", json!({ "key": key, "old": old, "new": to }));
            } else {
                println!("{}", line(&key, &format!("{old} -> {to}")));
            }
        }
    }
    Ok(())
}

/// A key on one line of text: backslashes and control characters escaped
/// (`\\`, `\n`, `\u{7f}`), everything else as it is.
fn escape(key: &str) -> String {
    let mut escaped = String::with_capacity(key.len());
    for c in key.chars() {
        if c == '\\' || c.is_control() {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    escaped
}

/// What a command whose feature this binary was built without answers: the
/// feature, and the command again with it.
fn not_built(what: &str, feature: &str, command: &str) -> String {
    format!(
        "{what} needs demo-resource built with --features {feature}: \
         cargo run -p demo-resource --features {feature} -- {command}"
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
        let command = format!("scenario --lock-backend {feature}");
        eprintln!("demo-resource: {}", not_built(&command, feature, &command));
        return ExitCode::FAILURE;
    }
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
    let run = scenario::run_with(source).await.map(|r| (r.to_string(), r.timeline(), r.problems()));
    conclude("scenario", run, args.timeline.as_deref(), "expected that")
}

/// Ends a `scenario` or `billing` run: its report on stdout, its timeline
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

/// `demo-resource payments`: the payment-provider stand-in until Ctrl-C or SIGTERM.
async fn payments(args: PaymentsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let listener =
        TcpListener::bind(args.listen).await.map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, pid = std::process::id(), "payment provider stand-in listening");
    println!("listening on {addr}");
    demo_resource::payments::Provider::default().serve(listener, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(not(feature = "billing"))]
async fn run_billing(_: BillingArgs) -> ExitCode {
    eprintln!("demo-resource: {}", not_built("scenario billing", "billing", "scenario billing"));
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
