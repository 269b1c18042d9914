//! What the fault tests share (this crate's and demo-resource's, which includes
//! this file by path): finding the tools, starting a service under one of them,
//! switching libfiu failure points (and the rig and load of the disk-fault
//! tests), moving a process's clock with libfaketime, the `kill -9` loops'
//! knobs, and a small seeded random source.

#![allow(dead_code)] // Each test file uses its own part.

// A module of its own, not re-exported: a test binary that uses none of it
// (fencing-client's) would find the re-export unused.
pub(crate) mod rig;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use test_support::ChildServer;

/// Whether `tool` is on PATH. Missing: prints SKIPPED (and fails under `CI=true`).
pub(crate) fn have(tool: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        let message = format!("SKIPPED: `{tool}` is not installed (apt-get install {package})");
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}; CI=true requires it");
        eprintln!("\n*** {message} ***\n");
    }
    found
}

/// How many fault rounds to run: `FENCING_FAULT_ROUNDS`, else `default`.
pub(crate) fn rounds(default: usize) -> usize {
    std::env::var("FENCING_FAULT_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(default)
}

/// A `kill -9` loop's knobs: how many cycles (`cycles_var`, default 50) and the
/// seed of its moments (`FENCING_KILL_SEED`, default 0x5eed), printed so that a
/// run can be repeated. A value that is not a number fails the test.
pub(crate) fn kill_cycles_and_seed(cycles_var: &str) -> (usize, u64) {
    let cycles = env_u64(cycles_var).unwrap_or(50) as usize;
    let seed = env_u64("FENCING_KILL_SEED").unwrap_or(0x5eed);
    eprintln!("FENCING_KILL_SEED={seed} {cycles_var}={cycles}");
    (cycles, seed)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// A disk fault libfiu injects: a failure point and the errno it sets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DiskFault {
    /// What the results table calls it.
    pub(crate) name: &'static str,
    /// The libfiu failure point.
    pub(crate) point: &'static str,
    /// The errno (`failinfo`), or 0 for the point's default.
    pub(crate) errno: i32,
}

/// The faults switched on and off at random: failing fsync and fdatasync,
/// failing writes (EIO, ENOSPC), short writes.
pub(crate) const DISK_FAULTS: [DiskFault; 5] = [
    DiskFault { name: "fsync EIO", point: "posix/io/sync/fsync", errno: 5 },
    DiskFault { name: "fdatasync EIO", point: "posix/io/sync/fdatasync", errno: 5 },
    DiskFault { name: "pwrite EIO", point: "posix/io/rw/pwrite", errno: 5 },
    DiskFault { name: "pwrite ENOSPC", point: "posix/io/rw/pwrite", errno: 28 },
    DiskFault { name: "short pwrite", point: "posix/io/rw/pwrite/reduce", errno: 0 },
];

/// A service process (test-support's child server: SIGKILLed when dropped).
pub(crate) struct Service {
    process: ChildServer,
    /// `http://ADDR`.
    pub(crate) url: String,
    /// `fiu-run -f`'s base name: the process listens on `BASE-PID.in`.
    fiu_base: Option<PathBuf>,
}

impl Service {
    /// Starts `bin args…`, under `fiu-run -x` (remote control in `fiu_ctrl_dir`) if
    /// given, and waits for its `listening on ADDR` line. Its log (stderr) goes to
    /// `log` if given, else nowhere.
    pub(crate) fn start(
        bin: &str,
        args: &[&str],
        fiu_ctrl_dir: Option<&Path>,
        env: &[(&str, String)],
        log: Option<&Path>,
    ) -> Self {
        let mut command = match fiu_ctrl_dir {
            Some(dir) => {
                let mut command = Command::new("fiu-run");
                command.arg("-x").arg("-f").arg(dir.join("fiu")).arg(bin);
                command
            }
            None => Command::new(bin),
        };
        command.env("RUST_LOG", "warn").args(args).envs(env.iter().map(|(k, v)| (k, v)));
        let stderr = log.map_or_else(Stdio::null, |log| std::fs::File::create(log).unwrap().into());
        let process = ChildServer::start(command.stderr(stderr));
        Self { url: process.base(), process, fiu_base: fiu_ctrl_dir.map(|dir| dir.join("fiu")) }
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Enables `fault` in the running process (`fiu-ctrl -c 'enable …'`).
    pub(crate) fn enable(&self, fault: DiskFault) {
        let info = if fault.errno == 0 { String::new() } else { format!(",failinfo={}", fault.errno) };
        self.fiu_ctrl(&format!("enable name={}{info}", fault.point));
    }

    /// Disables `fault`'s failure point.
    pub(crate) fn disable(&self, fault: DiskFault) {
        self.fiu_ctrl(&format!("disable name={}", fault.point));
    }

    fn fiu_ctrl(&self, command: &str) {
        let base = self.fiu_base.as_ref().expect("started under fiu-run");
        let status = Command::new("fiu-ctrl")
            .arg("-f")
            .arg(base)
            .arg("-c")
            .arg(command)
            .arg(self.pid().to_string())
            .status()
            .expect("run fiu-ctrl");
        assert!(status.success(), "fiu-ctrl -c {command:?} failed");
    }

    /// `kill -9` and reap.
    pub(crate) fn kill9(mut self) {
        self.process.kill_9();
    }

    /// Switches the [`DISK_FAULTS`] on in turn, `rounds` times, each at a random
    /// moment and off again after a random while, as the caller's load runs and
    /// counts the requests refused in `refused`. Meanwhile `/healthz` must stay
    /// 200; after each fault, `/readyz` must be 200 again and `probe` (a request
    /// of the load's kind) succeed within [`RECOVERY_BOUND`], without a restart.
    pub(crate) async fn switch_disk_faults<F, Fut>(
        &self,
        http: &reqwest::Client,
        rounds: usize,
        refused: &AtomicU64,
        mut probe: F,
    ) -> FaultRounds
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let url = &self.url;
        let mut rng = Rng::new();
        let mut run = FaultRounds { rounds, outcome: BTreeMap::new(), not_ready_seen: 0 };
        for round in 0..rounds {
            tokio::time::sleep(rng.millis(50, 250)).await;
            let fault = DISK_FAULTS[round % DISK_FAULTS.len()];
            let refused_before = refused.load(Ordering::Relaxed);
            self.enable(fault);
            tokio::time::sleep(rng.millis(100, 400)).await;
            // Liveness holds whatever the disk does; readiness tells the truth.
            assert_eq!(status(http, url, "/healthz").await, 200, "{}: /healthz", fault.name);
            if status(http, url, "/readyz").await == 503 {
                run.not_ready_seen += 1;
            }
            self.disable(fault);
            let recovery = until(RECOVERY_BOUND, fault.name, || {
                let ready = status(http, url, "/readyz");
                let probe = probe();
                async move { ready.await == 200 && probe.await }
            })
            .await;
            let entry = run.outcome.entry(fault.name).or_default();
            entry.0 += 1;
            entry.1 += refused.load(Ordering::Relaxed) - refused_before;
            entry.2 = entry.2.max(recovery);
        }
        run
    }
}

/// A cleared disk fault must be recovered from within this (the services reopen
/// their stores every 250 ms).
pub(crate) const RECOVERY_BOUND: Duration = Duration::from_secs(3);

/// What [`Service::switch_disk_faults`] saw.
pub(crate) struct FaultRounds {
    /// How many faults were switched on.
    pub(crate) rounds: usize,
    /// Per fault: (injections, requests refused until recovered, slowest recovery).
    pub(crate) outcome: BTreeMap<&'static str, (usize, u64, Duration)>,
    /// In how many rounds `/readyz` answered 503 while the fault was on.
    pub(crate) not_ready_seen: usize,
}

impl FaultRounds {
    /// One line per fault: `WHO, FAULT: N injections, N REFUSED refused, slowest recovery N ms`.
    pub(crate) fn print(&self, who: &str, refused: &str) {
        for (name, (injections, count, recovery)) in &self.outcome {
            eprintln!(
                "{who}, {name}: {injections} injections, {count} {refused} refused, slowest recovery {} ms",
                recovery.as_millis()
            );
        }
    }
}

/// The status of `GET {url}{path}`, 0 when the request failed.
pub(crate) async fn status(http: &reqwest::Client, url: &str, path: &str) -> u16 {
    http.get(format!("{url}{path}")).send().await.map_or(0, |r| r.status().as_u16())
}

/// A xorshift source, seeded from `FENCING_FAULT_SEED` or the clock (the seed is printed).
pub(crate) struct Rng(u64);

impl Rng {
    /// A new source; prints its seed so a run can be repeated.
    pub(crate) fn new() -> Self {
        let seed: u64 =
            std::env::var("FENCING_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .subsec_nanos()
                    .into()
            });
        eprintln!("FENCING_FAULT_SEED={seed}");
        Self(seed | 1)
    }

    /// A number in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    /// A duration between `lo` and `hi` milliseconds.
    pub(crate) fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Polls `probe` every 10 ms until it answers true; how long that took
/// (panics after `limit`: the service did not recover).
pub(crate) async fn until<F, Fut>(limit: Duration, what: &str, mut probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if probe().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// libfaketime (Debian's `faketime` package) driven through a timestamp file, so
/// the clock of a running process can be stepped and sped up: `set("-1h")`,
/// `set("+0 x10")`. The `faketime` command fixes its spec at start, so the
/// library is preloaded directly, as `faketime` itself does.
pub(crate) struct FakeClock {
    library: PathBuf,
    spec: PathBuf,
}

/// How long a process may take to see a new spec: it reads the file at every
/// clock call (`FAKETIME_NO_CACHE=1`; libfaketime's cache counts whole seconds).
pub(crate) const FAKETIME_SEEN_WITHIN: std::time::Duration = std::time::Duration::from_millis(100);

impl FakeClock {
    /// The library and a spec file (`+0`: the real time) in `dir`; `None` (and
    /// SKIPPED, or a failure under `CI=true`) without the `faketime` package.
    pub(crate) fn new(dir: &Path) -> Option<Self> {
        if !have("faketime", "faketime") {
            return None;
        }
        let library = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"]
            .iter()
            .map(|lib| Path::new(lib).join("faketime/libfaketimeMT.so.1"))
            .find(|path| path.is_file())
            .expect("the faketime package's libfaketimeMT.so.1");
        let clock = Self { library, spec: dir.join("faketime-spec") };
        clock.set("+0");
        Some(clock)
    }

    /// Moves the clock: a libfaketime spec (`-1h`, `+1h`, `+0 x2`, `+0 x0.5`), seen by
    /// the process at its next clock call.
    pub(crate) fn set(&self, spec: &str) {
        std::fs::write(&self.spec, format!("{spec}\n")).unwrap();
    }

    /// The environment of a process on this clock: the wall clock only
    /// (`FAKETIME_DONT_FAKE_MONOTONIC=1`), or the monotonic clock too.
    pub(crate) fn env(&self, wall_only: bool) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("LD_PRELOAD", self.library.display().to_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.spec.display().to_string()),
            ("FAKETIME_NO_CACHE", "1".into()),
        ];
        if wall_only {
            env.push(("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()));
        }
        env
    }
}

/// Seconds between the wall clock a log line's timestamp shows
/// (`2026-12-01T18:12:06.123Z …`) and this process's, within a day: how far the
/// service's wall clock was moved.
pub(crate) fn log_offset_secs(line: &str) -> i64 {
    let time = line.split('T').nth(1).and_then(|t| t.get(..8)).unwrap_or_else(|| panic!("log line {line:?}"));
    let parts: Vec<i64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    let theirs = parts[0] * 3600 + parts[1] * 60 + parts[2];
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let ours = i64::try_from(now % 86_400).unwrap();
    let diff = (theirs - ours).rem_euclid(86_400);
    if diff > 43_200 { diff - 86_400 } else { diff }
}
