//! How the node ends when it cannot go on, and the exit codes that say why.
//!
//! A failure no request can recover from (the BPU backend lost to a timeout, a model that
//! could not be reopened after an internal error, a panic outside any request) is *raised*
//! here once, from any thread, the panic hook included. The node's main task waits for it,
//! reports ERROR on `/diagnostics`, answers what is queued, shuts down and exits with
//! [`EXIT_RUNTIME`], so a supervisor (the launch file's respawn, systemd) starts a fresh
//! process. A configuration that cannot work exits with [`EXIT_CONFIG`] instead: restarting
//! with the same parameters and files fails the same way, so the launch file does not respawn
//! after it (launch/vlm.launch.py, `NO_RESPAWN_EXIT_CODES`).

use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::Notify;

/// Exit code of a configuration error: a parameter, a ROS argument or name, or a model that
/// cannot be loaded as given (sysexits `EX_CONFIG`). A restart does not help; fix the setting.
pub const EXIT_CONFIG: u8 = 78;

/// Exit code of a runtime failure: the BPU backend lost (a task timed out), a model that could
/// not be reopened after an internal error, a panic outside any request, a worker or ROS
/// thread gone (sysexits `EX_SOFTWARE`). A restart is the remedy.
pub const EXIT_RUNTIME: u8 = 70;

struct Fatal {
    reason: OnceLock<String>,
    raised: Notify,
}

static FATAL: Fatal = Fatal {
    reason: OnceLock::new(),
    raised: Notify::const_new(),
};

/// Records a failure the node cannot recover from and wakes [`wait`]. The first reason is
/// kept; later ones only go to the log. Safe from any thread and from a panic hook (it
/// neither blocks nor allocates beyond the reason).
pub(crate) fn raise(reason: impl Into<String>) {
    let reason = reason.into();
    if FATAL.reason.set(reason.clone()).is_ok() {
        tracing::error!("runtime failure, the node stops (exit code {EXIT_RUNTIME}): {reason}");
    } else {
        tracing::error!("another runtime failure while stopping: {reason}");
    }
    // A stored permit: a waiter that comes later still wakes.
    FATAL.raised.notify_one();
}

/// The failure raised, if any.
pub(crate) fn reason() -> Option<&'static str> {
    FATAL.reason.get().map(String::as_str)
}

/// Completes once a failure is raised; returns its reason.
pub(crate) async fn wait() -> String {
    loop {
        if let Some(r) = reason() {
            return r.to_owned();
        }
        FATAL.raised.notified().await;
    }
}

/// Ends the process with [`EXIT_RUNTIME`] if the orderly shutdown after a failure has not
/// ended it within `grace`: a thread stuck in a driver call must not keep a failed node
/// alive as a zombie.
pub(crate) fn exit_after(grace: Duration) {
    let spawned = std::thread::Builder::new()
        .name("fatal-watchdog".to_owned())
        .spawn(move || {
            std::thread::sleep(grace);
            tracing::error!(
                "the shutdown after a runtime failure did not finish within {grace:?}; exiting now"
            );
            signal_hook::low_level::exit(i32::from(EXIT_RUNTIME));
        });
    if spawned.is_err() {
        signal_hook::low_level::exit(i32::from(EXIT_RUNTIME));
    }
}
