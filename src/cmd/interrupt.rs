//! Ctrl+C: stops a reply being generated (or a conversion, which removes its partial file);
//! at an idle prompt it quits.

use std::sync::atomic::{AtomicBool, Ordering};

pub static STOP: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl+C at an idle prompt: the REPL ends as if its input had ended (so a trace is
/// still written).
pub static QUIT: AtomicBool = AtomicBool::new(false);
static BUSY: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if BUSY.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
    } else if !QUIT.swap(true, Ordering::SeqCst) {
        // the REPL sees QUIT at its next poll
    } else {
        // a second Ctrl+C while something does not poll: leave now
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, b"\n".as_ptr().cast(), 1);
            libc::_exit(130);
        }
    }
}

/// Lines from stdin, read in short polls so a Ctrl+C at the prompt (QUIT) is noticed while
/// waiting (std's buffered stdin would retry the interrupted read and keep waiting).
#[derive(Default)]
pub struct StdinLines {
    buf: Vec<u8>,
    eof: bool,
}

impl StdinLines {
    /// The next line without its newline; None at the end of input or on Ctrl+C.
    pub fn next_line(&mut self) -> std::io::Result<Option<String>> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..i]).into_owned()));
            }
            if self.eof {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let rest = std::mem::take(&mut self.buf);
                return Ok(Some(String::from_utf8_lossy(&rest).into_owned()));
            }
            if QUIT.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let mut fds = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd for the duration of the call.
            let r = unsafe { libc::poll(&mut fds, 1, 100) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                continue;
            }
            let mut chunk = [0u8; 4096];
            // SAFETY: reading into a local buffer of the given length.
            let n = unsafe { libc::read(0, chunk.as_mut_ptr().cast(), chunk.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                self.eof = true;
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
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
