//! `fencing-load`, one job per module: the command line ([`args`]), where
//! requests go ([`target`], [`template`]), what they carry ([`request`],
//! [`schedule`]), what is asked before the rounds ([`probe`]), sending them
//! ([`runner`], [`compare`], [`progress`]), and the results ([`tally`],
//! [`report`], [`validity`], [`thresholds`], [`plot`], [`json`]). The in-process
//! stand-ins are in [`inprocess`]; the binary `src/bin/fencing-load.rs` ties them together.

pub mod args;
pub mod compare;
pub mod inprocess;
pub mod json;
pub mod plot;
pub mod probe;
pub mod progress;
pub mod report;
pub mod request;
pub mod runner;
pub mod schedule;
pub mod tally;
pub mod target;
pub mod template;
pub mod thresholds;
pub mod validity;
