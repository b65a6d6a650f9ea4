//! The real binary in a pseudo-terminal, driven like a person, its screen kept by a VT100
//! parser (the workbench tests and the workbench soak).

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize, native_pty_system};

pub const ROWS: u16 = 40;
pub const COLS: u16 = 120;

pub struct Pty {
    pub screen: Arc<Mutex<vt100::Parser>>,
    pub writer: Box<dyn Write + Send>,
    pub child: Box<dyn portable_pty::Child + Send + Sync>,
}

impl Pty {
    pub fn text(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    /// Wait until `cond` holds for the screen; panic with the screen after `secs`.
    pub fn wait_for(&self, what: &str, secs: u64, cond: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.text();
            if cond(&s) {
                return s;
            }
            if Instant::now() > end {
                panic!("timed out waiting for {what}; the screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn send(&mut self, bytes: &str) {
        self.writer.write_all(bytes.as_bytes()).unwrap();
        self.writer.flush().unwrap();
    }
}

/// The status line's "decoding · N tok".
pub fn decoded(s: &str) -> Option<usize> {
    let i = s.find("decoding · ")?;
    s[i + "decoding · ".len()..].split_whitespace().next()?.parse().ok()
}

/// The binary with `args` in a pseudo-terminal, its working folder `dir`.
pub fn spawn(args: &[&str], dir: &std::path::Path) -> Pty {
    let pair = native_pty_system()
        .openpty(PtySize { rows: ROWS, cols: COLS, pixel_width: 0, pixel_height: 0 })
        .expect("a pseudo-terminal");
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_moescope"));
    cmd.args(args);
    cmd.cwd(dir);
    cmd.env("MOESCOPE_CACHE_DIR", dir.join("cache"));
    cmd.env("TERM", "xterm-256color");
    cmd.env_remove("NO_COLOR");
    let child = pair.slave.spawn_command(cmd).expect("spawn moescope");
    drop(pair.slave);
    let screen = Arc::new(Mutex::new(vt100::Parser::new(ROWS, COLS, 0)));
    let mut reader = pair.master.try_clone_reader().unwrap();
    let s2 = screen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            s2.lock().unwrap().process(&buf[..n]);
        }
    });
    let writer = pair.master.take_writer().unwrap();
    Pty { screen, writer, child }
}

impl Pty {
    /// Wait for the process to end (after `q`); its exit status.
    pub fn exit(&mut self) -> portable_pty::ExitStatus {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > end {
                self.child.kill().ok();
                panic!("moescope did not quit on q:\n{}", self.text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
