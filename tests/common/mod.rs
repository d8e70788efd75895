//! Helpers shared by the integration tests, one file per concern.
#![allow(dead_code, unused_imports, unused_macros)]

mod ages;
pub mod child;
pub mod clock;
pub mod cycle;
mod db;
mod held;
pub mod hooked;
pub mod jobs;
pub mod meters;
pub mod otel;
pub mod pgbouncer;
pub mod proxy;
pub mod roles;
pub mod stages;
pub mod turnover;
mod version;
mod views;
mod wait;

pub use ages::*;
pub use db::*;
pub use held::*;
pub use version::*;
pub use views::*;
pub use wait::*;
