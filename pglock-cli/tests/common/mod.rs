//! Helpers shared by the command's tests: running the binary, and the lock crate's own test
//! helpers for the database (shared rather than copied).
#![allow(dead_code, unused_imports)]

pub mod cli;
#[path = "../../../tests/common/db.rs"]
mod db;
#[path = "../../../tests/common/views.rs"]
mod views;
#[path = "../../../tests/common/wait.rs"]
mod wait;

pub use db::*;
pub use views::*;
pub use wait::*;
