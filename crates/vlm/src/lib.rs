//! vlm (work in progress)
