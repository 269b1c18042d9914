//! Placeholder: filled by the lock-service/client issue.
