//! Draws a run.
