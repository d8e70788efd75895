//! pglock's benchmarks live in `benches/`; this library is empty. See the repository's
//! `docs/benchmarks.md` for what they measure and how to run them:
//! `cargo bench -p pglock-bench --bench lockbench`.
