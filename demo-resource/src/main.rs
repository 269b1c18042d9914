//! `demo-resource`: the command line of the fenced storage service: `serve` it, and read or reset
//! the marks of a stopped one (`marks`).
//! It runs no stories: the seed's scenario, billing and the payment stand-in are `cargo run -p scenarios`.
//!
//! * `demo-resource serve --listen 127.0.0.1:8080 [--no-fencing] [--data-dir DIR | --in-memory]`
//!   prints `listening on ADDR` on stdout once it accepts connections (handy with
//!   port 0), logs to stderr (`RUST_LOG`, default `info`) and stops gracefully on
//!   Ctrl-C or SIGTERM.
//! * `demo-resource serve --postgres URL [--shared-marks | --local-marks | --no-fencing]` (built
//!   with `--features postgres`) keeps the data in PostgreSQL (`postgres://user@host:port/db`
//!   or `host=… dbname=…`, with libpq's `sslmode` and `sslrootcert` for TLS); several `serve`
//!   processes given the same URL are replicas of one resource.
//!   Each write is fenced in its own transaction, with marks in the database
//!   that every replica checks (and by the per-process layer in front). It
//!   creates the tables at start-up if missing. `--local-marks` keeps only the
//!   per-process layer, to show that it is not enough with several replicas.
//! * `serve --etcd ENDPOINTS [--etcd-prefix P] [--etcd-ca FILE]` (built with `--features etcd`):
//!   the layer decides through marks every replica shares in etcd (replica claims on one etcd lease
//!   per process; `https://` endpoints over TLS, with `--etcd-ca`'s CA), whatever holds the data (`--in-memory`, `--data-dir`, or `--postgres` with its writes then not
//!   fenced in their transactions). docs/replicas.md.
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
//!
//! Every build has every command and flag (`--help` lists them all); one whose feature
//! was not built exits 1 with the command to rebuild and run it with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use demo_lock_service::shutdown_signal;
use demo_resource::{Config, ResetError, Resource, Served, StoppedMarks, Storage};
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
    /// replicas of one resource. Each write is fenced in its own transaction. TLS as
    /// libpq's `sslmode` and `sslrootcert` say (`?sslmode=verify-full&sslrootcert=ca.pem`).
    /// Needs demo-resource built with `--features postgres`.
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
    /// With --postgres: what stands between the replica and PostgreSQL. `session`: a direct
    /// connection or a pooler in session mode; `transaction`: a pooler in transaction mode
    /// (PgBouncer pool_mode = transaction), where each transaction sets its own bounds and
    /// nothing is prepared across transactions. The replica checks it at start-up and refuses
    /// a mode its connection does not keep. See docs/replicas.md, "Behind PgBouncer".
    #[arg(long, value_name = "MODE", default_value = "session", value_parser = ["session", "transaction"], requires = "postgres")]
    pg_pooling: String,
    /// With --shared-marks: where the replica's claims session (renewals, and LISTEN for raises
    /// and releases) connects, if not to --postgres URL: the same database straight, or through a
    /// pooler in session mode, when --postgres goes through a pooler in transaction mode (which
    /// carries no notifications).
    #[arg(long, value_name = "URL", requires = "shared_marks")]
    claims_url: Option<String>,
    /// The layer decides through marks every replica shares in etcd (comma-separated client
    /// URLs, e.g. http://127.0.0.1:2379): replica claims on one etcd lease per process. Give
    /// every replica the same endpoints and --etcd-prefix. Needs demo-resource built with
    /// `--features etcd`. See docs/replicas.md.
    #[arg(long, value_name = "ENDPOINTS", value_delimiter = ',', conflicts_with_all = ["no_fencing", "shared_marks", "local_marks"])]
    etcd: Vec<String>,
    /// With --etcd: the key prefix the marks and claims live under.
    #[arg(long, value_name = "PREFIX", default_value = "fencing/demo-resource/", requires = "etcd")]
    etcd_prefix: String,
    /// With --etcd https://…: the CA certificate(s) (PEM file) that signed the members'
    /// certificates. Without it, https:// endpoints are checked against the system's roots.
    #[arg(long, value_name = "FILE", requires = "etcd")]
    etcd_ca: Option<PathBuf>,
    /// The lock service's public key (one line of URL-safe base64): a token may raise a
    /// mark only with a valid `Fencing-Proof` for its path's lock, else 403.
    #[arg(long, value_name = "FILE", conflicts_with = "no_fencing")]
    verify_key: Option<PathBuf>,
    /// Serve the admin routes (list, read, reset marks) on this loopback address too.
    /// They have no authentication. Off by default.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["no_fencing", "postgres", "etcd"])]
    admin_listen: Option<SocketAddr>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Serve(_) => "info",
        // A reset's warn line (key, old, new) is its record.
        Command::Marks(_) => "warn",
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
    if !args.etcd.is_empty() && !cfg!(feature = "etcd") {
        return Err(not_built("serve --etcd", "etcd", "serve --etcd ENDPOINTS").into());
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
            claims_session_url: args.claims_url,
            transaction_pooling: args.pg_pooling == "transaction",
            etcd_marks: None,
            accept_volatile_commits: args.accept_volatile_commits,
        },
        None if args.in_memory => Config::in_memory(),
        None => Config::durable(&args.data_dir),
    };
    let config = if args.no_fencing { config.without_fencing() } else { config };
    let etcd_marks = (!args.etcd.is_empty()).then(|| demo_resource::EtcdMarks {
        endpoints: args.etcd.clone(),
        prefix: args.etcd_prefix.clone(),
        ca_file: args.etcd_ca.clone(),
    });
    let config = Config { etcd_marks, ..config };
    let config = match verify_key {
        Some(key) => config.verify_key(key),
        None => config,
    };
    // Not the URL itself: it may hold a password.
    let storage = match &config.storage {
        Storage::Dir(dir) => format!("{}", dir.display()),
        Storage::InMemory => "in memory".to_owned(),
        // `--no-fencing`: the same tables, nothing fenced.
        Storage::Postgres { .. } if !config.fencing || config.etcd_marks.is_some() => "postgres".to_owned(),
        Storage::Postgres { shared_marks: true, .. } => "postgres, shared marks (replica claims)".to_owned(),
        Storage::Postgres { fence_in_transaction: true, .. } => {
            "postgres, fenced in each transaction".to_owned()
        }
        Storage::Postgres { fence_in_transaction: false, .. } => "postgres, local marks only".to_owned(),
    };
    let storage = match &config.etcd_marks {
        Some(_) => format!("{storage}; marks shared through etcd (replica claims)"),
        None => storage,
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
        let signal = shutdown_signal().await;
        tracing::info!("{signal}: shutting down");
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
