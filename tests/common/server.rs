//! `moescope serve` as a child process, and an HTTP/1.1 client over `std::net::TcpStream` that
//! reads exactly what the server wrote (status, headers, chunked bodies, SSE events), so the
//! tests check the wire format rather than a client library's reading of it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Server {
    child: Child,
    pub port: u16,
    /// What the server printed on stderr so far.
    pub log: Arc<Mutex<String>>,
    client: Client,
}

/// Requests to a server on 127.0.0.1 at `port`.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    pub port: u16,
}

impl std::ops::Deref for Server {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Server {
    /// `moescope serve --port 0 ARGS`, waiting until /health answers 200.
    pub fn start(args: &[&str], cache: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_moescope"))
            .args(["serve", "--port", "0"])
            .args(args)
            .env("MOESCOPE_CACHE_DIR", cache)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting moescope serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (err, l2) = (child.stderr.take().expect("stderr"), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut g = l2.lock().unwrap();
                g.push_str(&line);
                g.push('\n');
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("reading the port");
        let port = line
            .trim()
            .strip_prefix("listening on 127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}; log: {}", log.lock().unwrap()));
        let s = Server { child, port, log, client: Client { port } };
        let t0 = Instant::now();
        loop {
            if let Ok(r) = s.try_request("GET", "/health", &[], b"")
                && r.status == 200
            {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "server not ready: {}", s.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    /// Send SIGINT (Ctrl+C) and wait for the exit, with what it printed on stderr.
    pub fn interrupt(&mut self) -> (std::process::ExitStatus, String) {
        // SAFETY: kill(2) on our own child's pid
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().expect("waiting for the server");
        // the stderr reader ends with the pipe
        thread::sleep(Duration::from_millis(100));
        (status, self.log.lock().unwrap().clone())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Client {
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("connecting");
        s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
        s
    }

    /// Send a request (the connection closes after the response).
    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<TcpStream> {
        let mut s = self.connect();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        if !body.is_empty() {
            head.push_str("Content-Type: application/json\r\n");
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        Ok(s)
    }

    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        let s = self.send(method, path, headers, body)?;
        Response::read(s)
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        self.try_request(method, path, headers, body).expect("HTTP request")
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        self.request("POST", path, &[], body.to_string().as_bytes())
    }

    /// A streaming request: the response's head read, its events still to come.
    pub fn stream(&self, path: &str, body: &Value) -> Sse {
        let s = self.send("POST", path, &[], body.to_string().as_bytes()).expect("sending");
        let mut r = BufReader::new(s);
        let (status, headers) = read_head(&mut r).expect("response head");
        Sse { status, headers, body: Chunked { r, left: 0, done: false }, line: String::new() }
    }

    /// /metrics as name -> value.
    pub fn metrics(&self) -> HashMap<String, f64> {
        let r = self.request("GET", "/metrics", &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        r.text()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.parse().expect("a number")))
            .collect()
    }

    /// Wait until `f(metrics)` holds (or fail after `secs`).
    pub fn wait_metrics(
        &self,
        secs: u64,
        what: &str,
        f: impl Fn(&HashMap<String, f64>) -> bool,
    ) -> HashMap<String, f64> {
        let t0 = Instant::now();
        loop {
            let m = self.metrics();
            if f(&m) {
                return m;
            }
            assert!(t0.elapsed() < Duration::from_secs(secs), "waited {secs} s for {what}: {m:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Response {
    fn read(s: TcpStream) -> std::io::Result<Response> {
        let mut r = BufReader::new(s);
        let (status, headers) = read_head(&mut r)?;
        let mut body = Vec::new();
        if headers.get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            Chunked { r, left: 0, done: false }.read_to_end(&mut body)?;
        } else if let Some(n) = headers.get("content-length") {
            body.resize(n.parse().expect("content-length"), 0);
            r.read_exact(&mut body)?;
        } else {
            r.read_to_end(&mut body)?;
        }
        Ok(Response { status, headers, body })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

fn read_head(r: &mut impl BufRead) -> std::io::Result<(u16, HashMap<String, String>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = HashMap::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    Ok((status, headers))
}

/// A chunked body (RFC 9112 7.1) as a reader.
pub struct Chunked<R> {
    r: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.r.read_line(&mut line)?;
            if line.is_empty() {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "chunked body cut short"));
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
        let want = buf.len().min(self.left);
        let n = self.r.read(&mut buf[..want])?;
        self.left -= n;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.r.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// Server-Sent Events from a streaming response.
pub struct Sse {
    pub status: u16,
    pub headers: HashMap<String, String>,
    body: Chunked<BufReader<TcpStream>>,
    line: String,
}

impl Sse {
    /// The next event's `data:` payload (comments such as keep-alives skipped); None at the end.
    pub fn next_data(&mut self) -> Option<String> {
        let mut data: Option<String> = None;
        loop {
            let l = self.read_line()?;
            if l.is_empty() {
                if data.is_some() {
                    return data;
                }
                continue;
            }
            if let Some(d) = l.strip_prefix("data: ").or(l.strip_prefix("data:")) {
                data.get_or_insert_with(String::new).push_str(d);
            }
        }
    }

    /// Every remaining payload, to the end of the body.
    pub fn all(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next_data()).collect()
    }

    fn read_line(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.line.find('\n') {
                let l: String = self.line.drain(..=i).collect();
                return Some(l.trim_end_matches(['\r', '\n']).to_string());
            }
            let mut buf = [0u8; 4096];
            match self.body.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.line.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
    }

    /// Hang up without reading further: the socket closes with a reset (linger 0), so the
    /// server's next write fails instead of the one after.
    pub fn hang_up(self) {
        use std::os::fd::AsRawFd;
        let s = self.body.r.into_inner();
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: a valid socket and a linger struct of the size passed
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        drop(s);
    }
}
