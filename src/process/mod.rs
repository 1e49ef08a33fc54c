//! Process-wide failure handling: exit codes and runtime failures ([`fatal`]), the panic hook
//! and per-request containment ([`panics`]), SIGINT/SIGTERM ([`signals`]), and the panics
//! debug builds inject for the node tests (`test_hooks`). The lowest room: it uses no other.

pub mod fatal;
pub mod panics;
pub mod signals;
pub(crate) mod test_hooks;
