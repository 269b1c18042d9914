//! `fencing-load`'s command line.

use std::path::PathBuf;

use clap::Parser;

use super::thresholds::Thresholds;

/// What `--help` says after the flags: what a run leaves behind, and the exit codes.
const AFTER_HELP: &str = "\
Keys, and what a run leaves behind:
  {key} expands to load-<run id>-<n> (n from 0 to --keys - 1): keys of this run only. The run id is
  fresh and random unless --run-id is given; it is printed at the start and written to --json.
  Against a fenced --url target, a run leaves a mark on each key it wrote (/api/docs/load-<run id>-0
  and on, for the template /api/docs/{key}), at the last token it sent there, besides whatever the
  service stored for the writes themselves. The layer never evicts a mark: marks stay until a
  service with in-memory marks restarts, and with a durable store (redb, PostgreSQL) they stay on
  disk. No real holder uses these keys, so they lock nobody out; each takes a slot of the layer's
  key table (max_keys, 1,000,000 by default; past it new keys get 503) and about 132 bytes beyond
  the key. Find them by their prefix: demo-resource marks list --data-dir DIR | grep load-<run id>-
  (or GET /marks on serve --admin-listen). A mark can be reset (demo-resource marks reset KEY --to
  0), not deleted: run against a throwaway server (demo-resource serve --in-memory) when nothing may
  stay. To reuse an earlier run's keys, give its --run-id with --start-above-mark.
  A path without {key} (before any '?') is refused against --url: every request would write to a
  real key and raise its mark for good to this run's tokens (--first-token, 1000 by default,
  upward), and the key's real holder, whose tokens are lower, would get 409 until its tokens pass
  them or someone resets the mark. --allow-real-keys runs it anyway, for a server whose marks may be
  raised.

Exit status:
  0   measured, every threshold met
  1   bad arguments or setup (a refused path template, a failed --start-above-mark probe)
  2   a usage error (unknown flag, bad value)
  3   nothing trustworthy measured: a target refused connections, answered no request, or gave
      more than --max-other-share of its answers outside 2xx, 409 and 400 (a 404 route, say)
  99  a threshold broken (--max-p99, --min-ratio, --max-error-pct, --min-rps)";

/// Load-test a fenced HTTP service over loopback, against its unfenced baseline:
/// throughput, latency (open loop: corrected for coordinated omission), thresholds, a plot.
#[derive(Debug, Clone, Parser)]
#[command(name = "fencing-load", version, after_help = AFTER_HELP)]
pub struct Args {
    /// URL of a running fenced target, with an optional path template
    /// (`http://127.0.0.1:8080/api/docs/{key}`; placeholders `{conn}`, `{seq}`, `{key}`),
    /// or several replicas separated by commas (connections spread evenly); loopback only.
    /// Without a path: `/logs/{key}` (`demo-resource`'s route). Without `--url`,
    /// fenced and unfenced stand-ins run in-process.
    #[arg(long)]
    pub url: Option<String>,
    /// URL(s) of a running unfenced baseline to compare `--url` with; loopback only.
    /// Without a path it uses `--url`'s.
    #[arg(long, requires = "url")]
    pub baseline_url: Option<String>,
    /// Path template for every target, instead of the URLs' paths.
    #[arg(long)]
    pub path: Option<String>,
    /// Request method.
    #[arg(short = 'X', long, default_value = "POST")]
    pub method: String,
    /// An extra request header, `Name: value`; repeatable.
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,
    /// The request body.
    #[arg(long, conflicts_with = "body_file")]
    pub body: Option<String>,
    /// The request body, read from this file.
    #[arg(long)]
    pub body_file: Option<PathBuf>,
    /// Without `--body` or `--body-file`: this many bytes of `x`.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(0..=65_536))]
    pub body_bytes: u32,
    /// The header the fencing token goes in.
    #[arg(long, default_value = "fencing-token")]
    pub token_header: String,
    /// Concurrent keep-alive connections per target.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
    /// Open loop: this many requests per second in total, on a constant schedule, with
    /// latencies also measured from each request's intended send time (wrk2's method).
    /// Without it, a closed loop: each connection sends as soon as it has its answer.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Seconds per round (measured part plus warm-up).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=120))]
    pub duration: u64,
    /// Rounds per target, interleaved.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Milliseconds at the start of each round left out of the results.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub warmup_ms: u64,
    /// Fencing keys (`{key}` in the path): request `s` of connection `c` writes to key
    /// `(c + s * connections) % keys`. Default: one per connection, its own.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub keys: Option<u32>,
    /// Every connection writes to one key (`--keys 1`).
    #[arg(long, conflicts_with = "keys")]
    pub hot_key: bool,
    /// This run's id, in its keys: `{key}` expands to `load-<run id>-<n>`. Default: a
    /// fresh random id, so that a run never writes to another run's keys nor to a real
    /// holder's. Give an earlier run's id (with `--start-above-mark`) to reuse its keys.
    #[arg(long, value_parser = parse_run_id)]
    pub run_id: Option<String>,
    /// The text before each key's number in `{key}`, instead of `load-<run id>-` (for a route
    /// whose keys must look a certain way). Keys that real holders use are theirs: pick a
    /// prefix no real key has. An empty prefix needs `--allow-real-keys`.
    #[arg(long, conflicts_with = "run_id")]
    pub key_prefix: Option<String>,
    /// Against `--url`: allow a path template without `{key}` (or an empty `--key-prefix`),
    /// whose requests write to real keys and raise their marks for good (see below).
    #[arg(long)]
    pub allow_real_keys: bool,
    /// Every key's first token (its holder's; `--new-holder-every` raises it from there).
    #[arg(long, default_value_t = super::schedule::FIRST_TOKEN,
          value_parser = clap::value_parser!(u64).range(1..=u64::MAX / 2))]
    pub first_token: u64,
    /// Before the rounds, read each key's mark and start its tokens one above it (or at
    /// `--first-token` if that is higher): one request per key, the run's own, with token 0;
    /// a fenced target answers 409 naming the mark (`highest_token`), or admits it on a key
    /// without one (the write goes through, the mark is 0).
    #[arg(long)]
    pub start_above_mark: bool,
    /// A new holder every N valid requests to a key: its token rises by one, so
    /// raises and drains happen under load. Default: one holder per key, at `--first-token`.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub new_holder_every: Option<u64>,
    /// Percent of requests carrying a stale token (409 when fenced).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub stale_pct: u8,
    /// Percent of requests carrying a malformed token (400 when fenced).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub malformed_pct: u8,
    /// Fail (exit 99) if the fenced target's p99 latency is above this many
    /// milliseconds (corrected in the open loop).
    #[arg(long, value_parser = parse_positive)]
    pub max_p99: Option<f64>,
    /// Fail (exit 99) if fenced/baseline throughput (median of per-round ratios) is below this.
    #[arg(long, value_parser = parse_positive)]
    pub min_ratio: Option<f64>,
    /// Fail (exit 99) if more than this percent of the fenced target's requests got no
    /// answer or a status other than 2xx, 409 and 400.
    #[arg(long, value_parser = parse_non_negative)]
    pub max_error_pct: Option<f64>,
    /// Fail (exit 99) if the fenced target ran below this many requests per second.
    #[arg(long, value_parser = parse_positive)]
    pub min_rps: Option<f64>,
    /// Exit 3 (nothing measured) if more than this share of a target's answers are
    /// outside 2xx, 409 and 400 (404 from a wrong route, say).
    #[arg(long, default_value_t = 0.5, value_parser = parse_share)]
    pub max_other_share: f64,
    /// Warn when the share of 409 answers passes what the schedule expects
    /// (`--stale-pct`) by more than this: the keys had marks above the run's tokens.
    #[arg(long, default_value_t = 0.05, value_parser = parse_share)]
    pub warn_409_share: f64,
    /// Write an HDR-style latency percentile plot (SVG) of every target to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Worker threads of the in-process servers' runtime.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub server_threads: u32,
    /// Worker threads of the client runtime.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub client_threads: u32,
    /// In-process only: a third target, the fenced stand-in with its marks in
    /// this PostgreSQL database (`PgSharedStore`), e.g. `host=127.0.0.1 user=postgres
    /// dbname=bench`; loopback only. Its tables are created if missing.
    #[arg(long, conflicts_with = "url")]
    pub shared_postgres: Option<String>,
    /// In-process only: another target, the fenced stand-in with its marks in
    /// etcd (`EtcdSharedStore`) at this client URL, e.g. `http://127.0.0.1:2379`;
    /// loopback only. Marks and claims go under a prefix of this run's own. Needs
    /// fencing-load built with `--features etcd`.
    #[arg(long, conflicts_with = "url", value_name = "ENDPOINT")]
    pub shared_etcd: Option<String>,
    /// In-process only: a third target, the unfenced stand-in behind a layer
    /// that burns this many nanoseconds of CPU per request and does nothing
    /// else: how much a known cost moves the figures.
    #[arg(long, conflicts_with = "url", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub calibrate_ns: Option<u64>,
    /// In-process only: run just this target (`unfenced`, `fenced`, `spin`, `shared` or `shared-etcd`),
    /// for a profiler.
    #[arg(long, conflicts_with = "url")]
    pub only: Option<String>,
    /// In-process only: the fenced stand-in's layer also puts the token in the
    /// request extensions (`FencingLayer::token_extension(true)`).
    #[arg(long, conflicts_with = "url")]
    pub token_extension: bool,
    /// Send nothing: serve the fenced stand-in on this loopback address (`127.0.0.1:18090`)
    /// for `--duration` seconds, for another load generator (wrk, say) to measure the
    /// same server that `--url http://ADDR` measures.
    #[arg(long, conflicts_with_all = ["url", "shared_postgres", "shared_etcd", "calibrate_ns", "only"])]
    pub serve_only: Option<std::net::SocketAddr>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl Args {
    /// Checks what clap cannot.
    ///
    /// # Errors
    ///
    /// The two token mixes above 100 %, or a warm-up as long as a round.
    pub fn validate(&self) -> Result<(), String> {
        if u32::from(self.stale_pct) + u32::from(self.malformed_pct) > 100 {
            return Err("--stale-pct plus --malformed-pct must be at most 100".into());
        }
        if self.warmup_ms >= self.duration * 1_000 {
            return Err("--warmup-ms must be shorter than --duration".into());
        }
        if self.rate.is_some_and(|rate| rate < f64::from(self.connections) / self.duration as f64) {
            return Err("--rate is too low: every connection must get at least one request per round".into());
        }
        Ok(())
    }

    /// The path used when the URL has none.
    #[must_use]
    pub fn default_path(&self) -> &'static str {
        "/logs/{key}"
    }

    /// The text before each key's number: `--key-prefix`, else `load-<run id>-`
    /// (`run_id`: `--run-id`, or the fresh one the run made).
    #[must_use]
    pub fn key_prefix(&self, run_id: &str) -> String {
        self.key_prefix.clone().unwrap_or_else(|| format!("load-{run_id}-"))
    }

    /// Number of fencing keys.
    #[must_use]
    pub fn key_count(&self) -> u32 {
        if self.hot_key { 1 } else { self.keys.unwrap_or(self.connections) }
    }

    /// The pass/fail limits given.
    #[must_use]
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            max_p99_ms: self.max_p99,
            min_ratio: self.min_ratio,
            max_error_pct: self.max_error_pct,
            min_rps: self.min_rps,
        }
    }
}

/// A fresh run id: 8 hex digits from the standard library's per-process random hash keys.
#[must_use]
pub fn new_run_id() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    format!("{:08x}", hasher.finish() as u32)
}

fn parse_run_id(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok { Ok(s.to_owned()) } else { Err(format!("{s:?}: 1 to 64 letters, digits, '-' or '_'")) }
}

fn parse_share(s: &str) -> Result<f64, String> {
    match parse_non_negative(s) {
        Ok(v) if v <= 1.0 => Ok(v),
        _ => Err(format!("{s:?}: expected a share from 0 to 1")),
    }
}

fn parse_non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?}: expected a number >= 0")),
    }
}

fn parse_positive(s: &str) -> Result<f64, String> {
    match parse_non_negative(s) {
        Ok(v) if v > 0.0 => Ok(v),
        _ => Err(format!("{s:?}: expected a number > 0")),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match parse_positive(s) {
        Ok(v) if v <= 10_000_000.0 => Ok(v),
        _ => Err(format!("{s:?}: expected requests per second, > 0 and at most 10,000,000")),
    }
}
