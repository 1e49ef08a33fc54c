//! hbdnn-sys (work in progress)
