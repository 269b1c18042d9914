//! `GET /readyz`: whether the service can take writes now.
//!
//! `/healthz` says the process answers (liveness: restart it if not);
//! `/readyz` says its stores work (readiness: send it writes only if so). After
//! a disk failure the redb files are closed and reopened (see
//! [`fencing_layer::store::ReopeningDatabase`]); each probe tries a reopen that is
//! due, so readiness comes back on its own once the disk does. PostgreSQL
//! storage is always ready here: its pool reconnects by itself and each write
//! reports its own failure.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fencing_layer::MarkStore;

use crate::app::App;
use crate::backend::Backend;
use crate::problem::Problem;

/// 200 `ready`, or 503 problem+json `not-ready` naming the store and why.
pub(crate) async fn readyz(State(app): State<App>) -> Response {
    let checked = tokio::task::spawn_blocking(move || check(&app.data, app.marks.as_ref())).await;
    match checked {
        Ok(Ok(())) => "ready".into_response(),
        Ok(Err(why)) => Problem::new(StatusCode::SERVICE_UNAVAILABLE, "not-ready", "Not ready")
            .detail(why)
            .retry_after(1)
            .into_response(),
        Err(error) => Problem::internal(error).into_response(),
    }
}

/// Both stores, each trying a due reopen (blocking).
fn check(data: &Backend, marks: Option<&MarkStore>) -> Result<(), String> {
    match data {
        Backend::Redb(data) => data.ready().map_err(|fault| format!("data store: {fault}"))?,
        // The database's readiness is each write's own: a 503 when it is away.
        #[cfg(feature = "postgres")]
        Backend::Postgres(_) => {}
    }
    if let Some(marks) = marks {
        marks.ready().map_err(|error| format!("mark store: {error}"))?;
    }
    Ok(())
}
