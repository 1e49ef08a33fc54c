//! Panics: contained per request, fatal anywhere else.
//!
//! The worker thread runs each request (and loading, recovery) inside `contained`: a panic
//! there — in the runtime, the sampler, a kernel assert, a message conversion — becomes an
//! `Err` carrying its message and location, and the worker fails that one request and resets
//! the backend. An `/ask` task (planning a request) runs inside `contained_async`, and what
//! it hands to the blocking pool (a schema's compile) and a camera message's header check
//! and decoding run inside `contained` on that pool's thread: a request or a frame that
//! trips a bug is refused, not the node's end. A panic anywhere else (a camera drain task, the cancel loop,
//! diagnostics, the spin thread with r2r's handlers) means part of the node is gone while the
//! rest would keep running as a zombie, so the hook installed by [`install_hook`] raises a
//! runtime failure (`crate::process::fatal::raise`): diagnostics ERROR, orderly stop, non-zero exit.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe, PanicHookInfo};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt as _;

thread_local! {
    /// Set while this thread runs inside `contained`.
    static CONTAINED: Cell<bool> = const { Cell::new(false) };
    /// Where the last contained panic of this thread happened (the hook sees it, the caller
    /// of `catch_unwind` does not).
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic caught by `contained`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Panic {
    pub message: String,
    /// `file:line:column`, when the hook saw it.
    pub location: Option<String>,
}

impl std::fmt::Display for Panic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.location {
            Some(l) => write!(f, "{} (at {l})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Runs `f`, turning a panic inside it into `Err`. Whatever `f` touched may be half-updated
/// after a panic: the caller must reset or drop it (the worker resets the backend or reopens
/// the model), which is why unwind safety is asserted here.
pub(crate) fn contained<R>(f: impl FnOnce() -> R) -> Result<R, Panic> {
    let result = {
        let _scope = Scope::enter();
        catch_unwind(AssertUnwindSafe(f))
    };
    result.map_err(|payload| Panic {
        message: payload_text(payload.as_ref()),
        location: LOCATION.with(|l| l.borrow_mut().take()),
    })
}

/// `contained` for a future (an `/ask` task): the scope holds during each poll, on
/// whichever thread polls it.
pub(crate) async fn contained_async<F: Future>(f: F) -> Result<F::Output, Panic> {
    AssertUnwindSafe(Scoped(Box::pin(f)))
        .catch_unwind()
        .await
        .map_err(|payload| Panic {
            message: payload_text(payload.as_ref()),
            location: LOCATION.with(|l| l.borrow_mut().take()),
        })
}

/// Polls its future inside the contained scope.
struct Scoped<F>(Pin<Box<F>>);

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _scope = Scope::enter();
        self.0.as_mut().poll(cx)
    }
}

/// The contained scope on this thread until dropped, unwinding included.
struct Scope {
    outer: bool,
}

impl Scope {
    fn enter() -> Self {
        Self {
            outer: CONTAINED.with(|c| c.replace(true)),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CONTAINED.with(|c| c.set(self.outer));
    }
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}

/// Installs the process's panic hook (once, from `main`, before any thread starts).
pub fn install_hook() {
    std::panic::set_hook(Box::new(hook));
}

fn hook(info: &PanicHookInfo<'_>) {
    let message = payload_text(info.payload());
    let location = info.location().map(|l| l.to_string());
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("unnamed");
    if CONTAINED.with(Cell::get) {
        tracing::warn!(
            thread,
            location = location.as_deref().unwrap_or("?"),
            "panic inside a contained scope (the worker fails the request and recovers): \
             {message}"
        );
        LOCATION.with(|l| *l.borrow_mut() = location);
        return;
    }
    let backtrace = std::backtrace::Backtrace::capture();
    let backtrace = match backtrace.status() {
        std::backtrace::BacktraceStatus::Captured => format!("\n{backtrace}"),
        _ => String::new(),
    };
    tracing::error!(
        thread,
        location = location.as_deref().unwrap_or("?"),
        "panic outside any request: {message}{backtrace}"
    );
    crate::process::fatal::raise(format!(
        "panic in thread {thread} at {}: {message}",
        location.as_deref().unwrap_or("?")
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contained_panic_is_an_error_with_its_message() {
        let r: Result<u32, Panic> = contained(|| panic!("boom {}", 7));
        let p = r.unwrap_err();
        assert_eq!(p.message, "boom 7");
        assert_eq!(contained(|| 5), Ok(5));
        // Nesting restores the outer scope.
        let outer = contained(|| {
            let inner: Result<(), Panic> = contained(|| panic!("inner"));
            assert!(CONTAINED.with(Cell::get));
            inner.unwrap_err().message
        });
        assert_eq!(outer.as_deref(), Ok("inner"));
        assert!(!CONTAINED.with(Cell::get));
    }

    #[test]
    fn a_panicking_future_is_an_error_and_leaves_no_scope_behind() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r: Result<(), Panic> = rt.block_on(contained_async(async {
            tokio::task::yield_now().await;
            panic!("in an ask task");
        }));
        assert_eq!(r.unwrap_err().message, "in an ask task");
        assert!(!CONTAINED.with(Cell::get));
        assert_eq!(rt.block_on(contained_async(async { 3 })), Ok(3));
    }
}
