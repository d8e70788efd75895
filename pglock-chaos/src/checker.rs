//! Checks a history.
