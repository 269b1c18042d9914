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
    /// not 503s later. Over TLS to `https://` endpoints: with `marks.ca_file`'s
    /// CA, else the system's roots.
    #[cfg(feature = "etcd")]
    pub(crate) async fn etcd(marks: &crate::EtcdMarks, timing: Option<ClaimTiming>) -> Result<Self, String> {
        let endpoints = marks.endpoints.join(",");
        let https = marks.endpoints.iter().any(|e| e.starts_with("https://"));
        let options = match (&marks.ca_file, https) {
            (None, false) => fencing_etcd::connect_options(),
            (ca_file, _) => fencing_etcd::connect_options().with_tls(
                fencing_etcd::tls_options(ca_file.as_deref())
                    .map_err(|e| format!("etcd {endpoints}: {e}"))?,
            ),
        };
        // One client per member: a member that stalls is passed over, not waited on.
        let clients = fencing_etcd::member_clients(&marks.endpoints, options)
            .await
            .map_err(|e| format!("etcd {endpoints}: {e}"))?;
        let timing = timing.unwrap_or_else(|| ClaimTiming::for_term(fencing_etcd::DEFAULT_TERM));
        let store =
            fencing_etcd::EtcdSharedStore::with_members(clients.clone(), marks.prefix.clone(), timing)
                .map_err(|e| format!("etcd: {e}"))?;
        if let Err(e) = store.ready().await {
            return Err(format!("etcd {endpoints}: {e}{}", why_unreachable(clients).await));
        }
        Ok(Self::Etcd(store))
    }
}

/// What the members answer a status request, if none serves it: the cause (a refused
/// connection, a certificate the CA did not sign) that the claims' "no session" hides.
#[cfg(feature = "etcd")]
async fn why_unreachable(clients: Vec<fencing_etcd::etcd_client::Client>) -> String {
    use fencing_etcd::etcd_client::Error;
    let mut causes = Vec::new();
    for mut client in clients {
        match tokio::time::timeout(std::time::Duration::from_secs(5), client.status()).await {
            Ok(Ok(_)) => return String::new(),
            Ok(Err(Error::GRpcStatus(status))) => causes.push(status.message().to_owned()),
            Ok(Err(e)) => causes.push(e.to_string()),
            Err(_) => causes.push("no answer within 5 s".to_owned()),
        }
    }
    format!(" (asked directly: {})", causes.join("; "))
}
