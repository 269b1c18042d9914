//! The disk-fault tests' rig: the service under `fiu-run` on a data directory of
//! its own, restarted on the same data after `kill -9`, and the load of clients
//! that runs while the faults are switched.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{Service, have};

/// `bin args… --data-dir DIR/data` under `fiu-run -x` (its remote control in
/// `DIR`), and the HTTP client the test and its load talk to it with.
pub(crate) struct DiskFaultRig {
    /// Dropped (SIGKILLed) before the directory it writes into.
    pub(crate) service: Service,
    pub(crate) http: reqwest::Client,
    bin: &'static str,
    args: Vec<String>,
    _dir: tempfile::TempDir,
}

impl DiskFaultRig {
    /// `None` (and SKIPPED, or a failure under `CI=true`) without libfiu's tools.
    pub(crate) fn start(bin: &'static str, args: &[&str]) -> Option<Self> {
        if !have("fiu-run", "fiu-utils") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        args.extend(["--data-dir".to_owned(), data.to_str().unwrap().to_owned()]);
        let service = Service::start(bin, &Self::strs(&args), Some(dir.path()), &[], None);
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        Some(Self { service, http, bin, args, _dir: dir })
    }

    /// A load on this service, no client yet.
    pub(crate) fn load(&self) -> Load {
        Load {
            http: self.http.clone(),
            url: self.service.url.clone(),
            stop: Arc::default(),
            refused: Arc::default(),
            clients: Vec::new(),
        }
    }

    /// `kill -9`, then the same command again on the same data, not under
    /// `fiu-run`: no faults.
    pub(crate) fn restart(self) -> Self {
        let Self { service, http, bin, args, _dir } = self;
        service.kill9();
        let service = Service::start(bin, &Self::strs(&args), None, &[], None);
        Self { service, http, bin, args, _dir }
    }

    fn strs(args: &[String]) -> Vec<&str> {
        args.iter().map(String::as_str).collect()
    }
}

/// Clients, each a task that repeats its requests until the load stops, and the
/// count of the requests the service refused.
pub(crate) struct Load {
    http: reqwest::Client,
    url: String,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    clients: Vec<JoinHandle<()>>,
}

/// What a client of a [`Load`] is given: the HTTP client and the service's
/// `http://ADDR`, and what it asks the load: whether to go on, and to count a refusal.
pub(crate) struct LoadClient {
    pub(crate) http: reqwest::Client,
    pub(crate) url: String,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
}

impl LoadClient {
    /// Whether the load still runs.
    pub(crate) fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Counts a refused request, and backs off a little before the next one.
    pub(crate) async fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl Load {
    /// Spawns one more client: `client` with its [`LoadClient`].
    pub(crate) fn spawn<F, Fut>(&mut self, client: F)
    where
        F: FnOnce(LoadClient) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handle = LoadClient {
            http: self.http.clone(),
            url: self.url.clone(),
            stop: Arc::clone(&self.stop),
            refused: Arc::clone(&self.refused),
        };
        self.clients.push(tokio::spawn(client(handle)));
    }

    /// The requests refused so far.
    pub(crate) fn refused(&self) -> &AtomicU64 {
        &self.refused
    }

    /// Stops the clients and waits for them; the requests refused in all.
    pub(crate) async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            client.await.unwrap();
        }
        self.refused.load(Ordering::Relaxed)
    }
}
