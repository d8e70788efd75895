//! A clock a test and its child processes share.

/// Microseconds of `CLOCK_MONOTONIC`, which a test and its children share.
pub fn now_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).expect("time") * 1_000_000
        + u64::try_from(t.tv_nsec).expect("time") / 1_000
}
