//! Operating the marks: what the admin routes and `demo-resource marks` share.
//!
//! demo-resource fences twice: the layer's mark ([`MarkStore`], `marks.redb`)
//! and, in each write's own transaction, the data's fence (the highest token
//! written to the path, in `data.redb`). A key bricked by a forged token has
//! both at that token, so a reset sets both: the mark first (it is refused
//! while a raise of the key is being recorded, and then nothing has changed),
//! then the data's fence.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencing_layer::{MarkStore, store::StoreError};

use crate::store::Data;

/// Why a reset did not (fully) happen.
#[derive(Debug)]
pub enum ResetError {
    /// The key has no mark: no fenced request for it got this far. Nothing changed.
    UnknownKey,
    /// The mark store refused or failed ([`StoreError::Busy`]: a raise of the
    /// key is being recorded; try again). Nothing changed.
    Mark(StoreError),
    /// The mark was reset, but the data's fence could not be: writes below
    /// its value are still refused. Reset again.
    DataFence {
        /// The mark before the reset.
        old: u64,
        /// What the data store said.
        error: String,
    },
}

impl fmt::Display for ResetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownKey => f.write_str("no mark for this key: no fenced request for it got this far"),
            Self::Mark(error) => write!(f, "the mark is unchanged: {error}"),
            Self::DataFence { old, error } => write!(
                f,
                "the mark was reset (it was {old}) but the data's fence was not, so lower writes are still \
                 refused: {error}; reset again"
            ),
        }
    }
}

impl std::error::Error for ResetError {}

/// Why [`StoppedMarks::open`] could not open a data directory's marks, in words.
#[derive(Debug)]
pub struct OpenMarksError(String);

impl fmt::Display for OpenMarksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OpenMarksError {}

/// Resets `key`'s mark and the data's fence of the same path to `to`; the old mark.
pub(crate) fn reset(marks: &MarkStore, data: &Data, key: &str, to: u64) -> Result<u64, ResetError> {
    if marks.mark(key).is_none() {
        return Err(ResetError::UnknownKey);
    }
    // Keys are never evicted: a key with a mark still has one.
    let old = marks.reset(key, to).map_err(ResetError::Mark)?.unwrap_or(0);
    match data.reset_fence(key, to) {
        Ok(fence) => {
            tracing::warn!(key = ?key, old_fence = fence, new = to, "data fence reset");
            Ok(old)
        }
        Err(error) => Err(ResetError::DataFence { old, error: error.to_string() }),
    }
}

/// The marks of a stopped service's data directory (`demo-resource marks`):
/// `DIR/marks.redb` and the data's fences in `DIR/data.redb`, opened only if
/// both exist, and only while no `serve` holds them.
#[derive(Debug)]
pub struct StoppedMarks {
    marks: MarkStore,
    data: Arc<Data>,
}

impl StoppedMarks {
    /// Opens the marks of the data directory `dir`. Creates nothing.
    ///
    /// # Errors
    ///
    /// `DIR/marks.redb` or `DIR/data.redb` is missing (not a data directory of
    /// a fenced `serve`), or a running `serve` holds it, or it cannot be read.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, OpenMarksError> {
        let dir = dir.as_ref();
        let [marks_path, data_path]: [PathBuf; 2] = [dir.join("marks.redb"), dir.join("data.redb")];
        for path in [&marks_path, &data_path] {
            if !path.is_file() {
                return Err(OpenMarksError(format!(
                    "no {} at {}: is this the --data-dir of a fenced `demo-resource serve`?",
                    path.file_name().and_then(|n| n.to_str()).unwrap_or_default(),
                    path.display()
                )));
            }
        }
        let held = |path: &Path, error: &dyn fmt::Display| {
            OpenMarksError(format!(
                "cannot open {}: {error} (a running `demo-resource serve` holds it: stop it first, or use its \
                 --admin-listen routes)",
                path.display()
            ))
        };
        let marks = MarkStore::open(&marks_path).map_err(|e| held(&marks_path, &e))?;
        let data = Data::open(&data_path).map_err(|e| held(&data_path, &e))?;
        Ok(Self { marks, data: Arc::new(data) })
    }

    /// Every key and its mark, sorted by key.
    #[must_use]
    pub fn marks(&self) -> Vec<(String, u64)> {
        self.marks.marks()
    }

    /// `key`'s mark, if it has one.
    #[must_use]
    pub fn mark(&self, key: &str) -> Option<u64> {
        self.marks.mark(key)
    }

    /// Sets `key`'s mark (and the data's fence of that path) to `to`, durably;
    /// returns the old mark. Logged at `warn`.
    ///
    /// # Errors
    ///
    /// See [`ResetError`].
    pub fn reset(&self, key: &str, to: u64) -> Result<u64, ResetError> {
        reset(&self.marks, &self.data, key, to)
    }
}
