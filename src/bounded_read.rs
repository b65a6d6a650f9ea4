//! Reads whose size a file cannot choose: a whole file up to a limit, and a line up to a limit.
//! A path may name a device or a pipe that never ends (`/dev/zero` as a routing trace grew one
//! line until the allocation aborted the process); past the limit the read fails, naming it.

use std::io::{BufRead, Read};
use std::path::Path;

/// The whole of `path`, or an error if it holds more than `max` bytes.
pub fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    f.take(max + 1).read_to_end(&mut out).map_err(|e| format!("{}: {e}", path.display()))?;
    if out.len() as u64 > max {
        return Err(format!("{}: larger than {} MiB", path.display(), max >> 20));
    }
    Ok(out)
}

/// The next line of `r` without its line end (`None` at the end of input), or an error if it
/// runs past `max` bytes. Invalid UTF-8 is an error, as `BufRead::lines` gives.
pub fn read_line(r: &mut dyn BufRead, max: u64) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = r.take(max + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    } else if n as u64 > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a line longer than {max} bytes")));
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_as_bufread_lines_does_and_stop_at_the_limit() {
        let text = b"ab\r\ncd\n\nlast";
        let mut r: &[u8] = text;
        let mut got = vec![];
        while let Some(l) = read_line(&mut r, 8).expect("short lines") {
            got.push(l);
        }
        let want: Vec<String> = text.lines().map(|l| l.expect("utf-8")).collect();
        assert_eq!(got, want);
        let mut long: &[u8] = b"0123456789\nx";
        assert!(read_line(&mut long, 8).is_err(), "10 bytes before the line end, limit 8");
        let mut exact: &[u8] = b"01234567\n";
        assert_eq!(read_line(&mut exact, 8).expect("8 bytes fit").as_deref(), Some("01234567"));
    }

    #[test]
    fn a_device_without_end_is_refused_at_the_limit() {
        let e = read_file(Path::new("/dev/zero"), 1 << 20).expect_err("/dev/zero never ends");
        assert!(e.contains("/dev/zero") && e.contains("larger than 1 MiB"), "{e}");
        let mut z = std::io::BufReader::new(std::fs::File::open("/dev/zero").expect("/dev/zero"));
        assert!(read_line(&mut z, 1 << 20).is_err());
    }
}
