//! bpu-sim (work in progress)
