//! camera-frame (work in progress)
