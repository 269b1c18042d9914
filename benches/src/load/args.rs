//! `fencing-load`'s command line.

use std::path::PathBuf;

use clap::Parser;

use super::thresholds::Thresholds;

/// Load-test a fenced HTTP service over loopback, against its unfenced baseline:
/// throughput, latency (open loop: corrected for coordinated omission), thresholds, a plot.
#[derive(Debug, Clone, Parser)]
#[command(name = "fencing-load", version, about)]
pub struct Args {
    /// URL of a running fenced target, with an optional path template
    /// (`http://127.0.0.1:8080/api/docs/{key}`; placeholders `{conn}`, `{seq}`, `{key}`),
    /// or several replicas separated by commas (connections spread evenly); loopback only.
    /// Without a path: `/logs/load-{key}` (`demo-resource`'s route). Without `--url`,
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
    /// Every connection writes to one key (`--keys 1`; default path `/logs/hot`).
    #[arg(long, conflicts_with = "keys")]
    pub hot_key: bool,
    /// A new holder every N valid requests to a key: its token rises by one, so
    /// raises and drains happen under load. Default: one holder per key, token 1000.
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
    /// In-process only: a third target, the unfenced stand-in behind a layer
    /// that burns this many nanoseconds of CPU per request and does nothing
    /// else: how much a known cost moves the figures.
    #[arg(long, conflicts_with = "url", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub calibrate_ns: Option<u64>,
    /// In-process only: run just this target (`unfenced`, `fenced`, `spin` or `shared`),
    /// for a profiler.
    #[arg(long, conflicts_with = "url")]
    pub only: Option<String>,
    /// In-process only: the fenced stand-in's layer leaves the token out of the
    /// request extensions (`FencingLayer::token_extension(false)`).
    #[arg(long, conflicts_with = "url")]
    pub no_token_extension: bool,
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
        if self.hot_key { "/logs/hot" } else { "/logs/load-{key}" }
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
