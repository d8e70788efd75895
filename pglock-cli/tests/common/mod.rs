//! Helpers shared by the command's tests: running the binary, and the lock crate's own test
//! helpers for the database (shared rather than copied).
#![allow(dead_code, unused_imports)]

#[path = "../../../tests/common/ages.rs"]
mod ages;
pub mod cli;
#[path = "../../../tests/common/db.rs"]
mod db;
#[path = "../../../tests/common/held.rs"]
mod held;
#[path = "../../../tests/common/views.rs"]
mod views;
#[path = "../../../tests/common/wait.rs"]
mod wait;

pub use ages::*;
pub use db::*;
pub use held::*;
pub use views::*;
pub use wait::*;
