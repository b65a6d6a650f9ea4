//! Ctrl+C: stops a reply being generated (or a conversion, which removes its partial file);
//! at an idle prompt it quits.

use std::sync::atomic::{AtomicBool, Ordering};

pub static STOP: AtomicBool = AtomicBool::new(false);
static BUSY: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if BUSY.load(Ordering::SeqCst) {
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

/// While this lives (a reply being generated, a conversion), Ctrl+C sets [`STOP`] instead of
/// quitting, so the work stops at its next check and cleans up.
pub struct Interruptible;

impl Interruptible {
    pub fn start() -> Interruptible {
        STOP.store(false, Ordering::SeqCst);
        BUSY.store(true, Ordering::SeqCst);
        Interruptible
    }
}

impl Drop for Interruptible {
    fn drop(&mut self) {
        BUSY.store(false, Ordering::SeqCst);
    }
}
