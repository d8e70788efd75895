//! A chaos suite for pglock, in the manner of Jepsen's lock tests.
//!
//! Worker processes take locks and do fenced work while a seeded nemesis injects faults. Every
//! operation is recorded in a history of JSON lines ([`history`]), and a checker reads the
//! whole history afterwards ([`checker`]): safety anomalies, and how long the workload took to
//! make progress again after each fault healed.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`history`] | the records of a run, one JSON object per line |
//! | [`checker`] | anomalies, the model's verdict and liveness, from a history |
//! | [`linearize`] | whether lock operations fit a model: mutex, reader-writer, semaphore |
//! | [`svg`] | a picture of a run's timeline, with its faults |
//! | [`report`] | a checked run as markdown tables, for the docs |

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod checker;
pub mod history;
pub mod linearize;
pub mod report;
pub mod svg;

// The run: the servers, the workers and their workload, the nemesis.
pub mod broken;
pub mod cluster;
pub mod collect;
pub mod nemesis;
pub mod resource;
pub mod rng;
pub mod run;
pub mod spec;
pub mod worker;
pub mod workers;
pub mod workload;
