//! hbdnn (work in progress)
