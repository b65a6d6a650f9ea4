//! Ctrl+C: stops a reply that is being generated; at an idle prompt it quits.

use std::sync::atomic::{AtomicBool, Ordering};

pub static STOP: AtomicBool = AtomicBool::new(false);
static GENERATING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
    } else {
        // only async-signal-safe calls here
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, b"\n".as_ptr().cast(), 1);
            libc::_exit(130);
        }
    }
}

pub fn install() {
    // SAFETY: installing a handler that only touches atomics and async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}

/// Marks a reply in progress for as long as it lives; Ctrl+C then stops the reply.
pub struct Generating;

impl Generating {
    pub fn start() -> Generating {
        STOP.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        Generating
    }
}

impl Drop for Generating {
    fn drop(&mut self) {
        GENERATING.store(false, Ordering::SeqCst);
    }
}
