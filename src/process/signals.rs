//! SIGINT and SIGTERM. The first asks for the orderly stop (`node::run`'s shutdown: the
//! model load or warm-up is interrupted at its next step, cache buffer or graph call, live
//! requests are cancelled and answered, exit 0). A second one ends the process at once, for
//! an operator who will not wait for a graph call or a board's model load to finish: exit
//! code 128 + the signal number, what a shell shows for a death by that signal
//! ([`EXIT_SECOND_SIGINT`], [`EXIT_SECOND_SIGTERM`]).

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Exit code after a second SIGINT (128 + 2).
pub const EXIT_SECOND_SIGINT: i32 = 130;

/// Exit code after a second SIGTERM (128 + 15).
pub const EXIT_SECOND_SIGTERM: i32 = 143;

/// The installed handlers.
pub struct Signals {
    sigint: Signal,
    sigterm: Signal,
}

impl Signals {
    /// Installs both handlers; do it before any ROS entity exists, so an early signal still
    /// gets the orderly stop.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            sigint: signal(SignalKind::interrupt())?,
            sigterm: signal(SignalKind::terminate())?,
        })
    }

    /// Completes at the first SIGINT or SIGTERM. From then on, a second one exits the
    /// process at once (a task on the current runtime watches for it).
    pub async fn first(mut self) {
        let name = tokio::select! {
            _ = self.sigint.recv() => "SIGINT",
            _ = self.sigterm.recv() => "SIGTERM",
        };
        tracing::info!("{name} received: stopping (a second SIGINT or SIGTERM exits at once)");
        tokio::spawn(async move {
            let (name, code) = tokio::select! {
                _ = self.sigint.recv() => ("SIGINT", EXIT_SECOND_SIGINT),
                _ = self.sigterm.recv() => ("SIGTERM", EXIT_SECOND_SIGTERM),
            };
            tracing::warn!("second signal ({name}) during shutdown: exiting at once, code {code}");
            // `_exit`: atexit handlers of rcl/DDS would run under their live threads.
            signal_hook::low_level::exit(code);
        });
    }
}
