//! Helpers shared by the migration tests, one file per concern.
#![allow(dead_code, unused_imports)]

// The root crate's bounded reader of a child's output and its OpenTelemetry capture, shared
// rather than copied.
#[path = "../../../tests/common/child.rs"]
pub mod child;
mod db;
mod fenced;
mod flaky;
mod harness;
#[path = "../../../tests/common/held.rs"]
mod held;
#[path = "../../../tests/common/otel.rs"]
pub mod otel;
mod plugins;
#[path = "../../../tests/common/roles.rs"]
pub mod roles;

pub use db::*;
pub use fenced::Fenced;
pub use flaky::{Fault, FlakyStore};
pub use harness::*;
pub use held::*;
pub use plugins::*;

/// Turns each scenario `async fn name(backend: Backend)` of the calling test file into two
/// tests, `memory::name` and `postgres::name`.
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Backend::Memory).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Backend::Postgres).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_backends;
