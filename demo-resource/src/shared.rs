//! The marks every replica shares, when the layer decides through them instead
//! of its own: replica claims in PostgreSQL (`--postgres --shared-marks`) or in
//! etcd (`--etcd`). Each is a feature; with neither, there is nothing to share.

use fencing_layer::FencingLayer;
#[cfg(feature = "etcd")]
use fencing_layer::claims::ClaimTiming;

/// One replica's handle on the shared marks.
#[derive(Debug, Clone)]
pub(crate) enum SharedMarks {
    #[cfg(feature = "postgres")]
    Postgres(fencing_postgres::PgSharedStore),
    #[cfg(feature = "etcd")]
    Etcd(fencing_etcd::EtcdSharedStore),
}

impl SharedMarks {
    /// `layer`, deciding through these marks.
    // With neither feature there are no shared marks, and nothing uses `layer`.
    #[cfg_attr(not(any(feature = "postgres", feature = "etcd")), allow(unused_variables))]
    pub(crate) fn on(&self, layer: FencingLayer) -> FencingLayer {
        match *self {
            #[cfg(feature = "postgres")]
            Self::Postgres(ref store) => layer.shared_store(store.clone()),
            #[cfg(feature = "etcd")]
            Self::Etcd(ref store) => layer.shared_store(store.clone()),
        }
    }

    /// Claims in etcd at `marks` (`timing`, else fencing-etcd's default), the
    /// replica's watch open: a cluster out of reach is an error at start-up,
    /// not 503s later.
    #[cfg(feature = "etcd")]
    pub(crate) async fn etcd(marks: &crate::EtcdMarks, timing: Option<ClaimTiming>) -> Result<Self, String> {
        // One client per member: a member that stalls is passed over, not waited on.
        let clients = fencing_etcd::member_clients(&marks.endpoints, fencing_etcd::connect_options())
            .await
            .map_err(|e| format!("etcd {}: {e}", marks.endpoints.join(",")))?;
        let timing = timing.unwrap_or_else(|| ClaimTiming::for_term(fencing_etcd::DEFAULT_TERM));
        let store = fencing_etcd::EtcdSharedStore::with_members(clients, marks.prefix.clone(), timing)
            .map_err(|e| format!("etcd: {e}"))?;
        store.ready().await.map_err(|e| format!("etcd {}: {e}", marks.endpoints.join(",")))?;
        Ok(Self::Etcd(store))
    }
}
