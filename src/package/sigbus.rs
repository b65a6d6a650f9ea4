//! A package file truncated (or its disk gone) while it is mapped: the kernel answers the next
//! touch of a lost page with SIGBUS, which would end the process with no word of why. The
//! `moescope` binary installs [`install`]'s handler: one line naming the file last mapped, then
//! exit status 1. Reads of expert blobs through `pread` (streaming) fail as errors instead and
//! need none of this; the dense weights, and resident experts, are always read through the
//! mapping, so for them this is the whole story: the process cannot go on, but it says why.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// The message the handler writes: set by [`note_mapped`], never freed (a handler may be
/// reading the previous one).
static MSG: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static MSG_LEN: AtomicUsize = AtomicUsize::new(0);

/// Remember `path` as the file mapped last, for the handler's message.
pub fn note_mapped(path: &std::path::Path) {
    let msg = format!(
        "error: {}: the file shrank or could not be read while mapped (SIGBUS); moescope cannot continue\n",
        path.display()
    );
    let leaked: &'static mut [u8] = Box::leak(msg.into_bytes().into_boxed_slice());
    MSG_LEN.store(0, Ordering::SeqCst);
    MSG.store(leaked.as_mut_ptr(), Ordering::SeqCst);
    MSG_LEN.store(leaked.len(), Ordering::SeqCst);
}

extern "C" fn on_sigbus(_: libc::c_int) {
    let (p, n) = (MSG.load(Ordering::SeqCst), MSG_LEN.load(Ordering::SeqCst));
    // SAFETY: write(2) and _exit(2) are async-signal-safe; p..p + n is a leaked, immutable
    // message (or n is 0)
    unsafe {
        if !p.is_null() && n > 0 {
            libc::write(2, p as *const libc::c_void, n);
        } else {
            let m = b"error: a mapped file became unreadable (SIGBUS); moescope cannot continue\n";
            libc::write(2, m.as_ptr() as *const libc::c_void, m.len());
        }
        libc::_exit(1);
    }
}

/// Install the SIGBUS handler (the binary does, at start; a library user keeps its own).
pub fn install() {
    // SAFETY: a plain handler that only calls async-signal-safe functions
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}
