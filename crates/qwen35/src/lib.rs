//! qwen35 (work in progress)
