//! What the cluster fault tests share: one recorder of every handler's entry
//! and exit, replicas serving behind the layer, a load of raises, equal and
//! stale tokens, and the warnings the stores logged.

pub(crate) mod load;
pub(crate) mod logs;
pub(crate) mod recorder;
pub(crate) mod replicas;

use std::time::Duration;

/// The longest any single wait of these tests may take.
pub(crate) const BOUND: Duration = Duration::from_secs(20);

/// One scenario at a time: each starts a cluster of its own, and on two cores
/// two of them at once would measure each other, not their faults.
pub(crate) async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}
