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
