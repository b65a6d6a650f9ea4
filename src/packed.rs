//! Files kept in the repository compressed, so the tracked tree stays small enough to carry
//! whole (the test fixtures, the demo's weights, the real tokenizers): `NAME.xz` holds `NAME`
//! in xz, a safetensors file with each tensor's bytes split into byte planes first (the f32 and
//! bf16 exponent bytes, alike across values, then compress together). The packing is
//! `tests/reference/pack_fixtures.py`; `MANIFEST` beside packed files gives each unpacked
//! file's size and CRC-32, checked here, so a reader gets the very bytes that were packed.
//!
//! Byte planes of a tensor of `n` values `w` bytes wide: plane `i` is byte `i` of every value,
//! the planes one after another (`[b0 of v0, b0 of v1, ..., b1 of v0, ...]`); the header and any
//! bytes outside the tensors stay where they are.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The extension of a packed file.
pub const EXT: &str = "xz";

/// What an xz file starts with.
pub const XZ_MAGIC: [u8; 6] = [0xfd, b'7', b'z', b'X', b'Z', 0];

/// The most bytes a packed file unpacks to.
const MOST: usize = 1 << 30;

/// The bytes of the xz stream `xz`, refused once past `most` bytes (a small file can claim to
/// hold any amount).
pub fn xz_decompress(xz: &[u8], most: usize) -> Result<Vec<u8>, String> {
    struct Capped {
        out: Vec<u8>,
        most: usize,
    }
    impl std::io::Write for Capped {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.out.len() + b.len() > self.most {
                return Err(std::io::Error::other(format!("unpacks to more than {} bytes", self.most)));
            }
            self.out.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Capped { out: Vec::new(), most };
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(xz), &mut out).map_err(|e| format!("xz: {e}"))?;
    Ok(out.out)
}

/// The bytes `name` (the unpacked file's name) was packed from, given its packed bytes.
pub fn unpack(name: &str, packed: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = xz_decompress(packed, MOST).map_err(|e| format!("{name}.{EXT}: {e}"))?;
    if name.ends_with(".safetensors") {
        out = planes_to_values(&out).map_err(|e| format!("{name}.{EXT}: {e}"))?;
    }
    Ok(out)
}

/// A safetensors file's tensors from byte planes back to values (see the module's doc).
pub fn planes_to_values(b: &[u8]) -> Result<Vec<u8>, String> {
    regroup(b, |data, w| {
        let n = data.len() / w;
        let mut out = vec![0u8; data.len()];
        for (i, plane) in data.chunks_exact(n.max(1)).take(w).enumerate() {
            for (j, &x) in plane.iter().enumerate() {
                out[j * w + i] = x;
            }
        }
        out
    })
}

/// A safetensors file's tensors from values to byte planes (the inverse; for tests).
pub fn values_to_planes(b: &[u8]) -> Result<Vec<u8>, String> {
    regroup(b, |data, w| {
        let n = data.len() / w;
        let mut out = Vec::with_capacity(data.len());
        for i in 0..w {
            out.extend((0..n).map(|j| data[j * w + i]));
        }
        out
    })
}

/// `b` with each tensor's bytes rearranged by `f(bytes, width)`; a tensor whose length is not
/// a multiple of its width is left as it is.
fn regroup(b: &[u8], f: impl Fn(&[u8], usize) -> Vec<u8>) -> Result<Vec<u8>, String> {
    let n = b.get(..8).map(|h| u64::from_le_bytes(h.try_into().unwrap_or_default())).ok_or("no header")?;
    let start = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&s| s <= b.len())
        .ok_or("header past the end")?;
    let header: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&b[8..start]).map_err(|e| format!("header: {e}"))?;
    let mut out = b.to_vec();
    for (name, t) in &header {
        if name == "__metadata__" {
            continue;
        }
        let width = match t["dtype"].as_str() {
            Some("F64" | "I64" | "U64") => 8,
            Some("F32" | "I32" | "U32") => 4,
            Some("F16" | "BF16" | "I16" | "U16") => 2,
            _ => 1,
        };
        let at = |i: usize| t["data_offsets"][i].as_u64().and_then(|o| usize::try_from(o).ok());
        let (Some(s), Some(e)) = (at(0), at(1)) else { return Err(format!("{name}: no data_offsets")) };
        let (s, e) = (start + s, start + e);
        if s > e || e > b.len() {
            return Err(format!("{name}: data_offsets past the end"));
        }
        if width > 1 && (e - s).is_multiple_of(width) {
            out[s..e].copy_from_slice(&f(&b[s..e], width));
        }
    }
    Ok(out)
}

/// CRC-32 (IEEE, as zlib's) of `b`.
pub fn crc32(b: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(b);
    c.sum()
}

/// What a `MANIFEST` says: each unpacked file's path (relative to the manifest's folder), size
/// and CRC-32.
pub type Manifest = HashMap<PathBuf, (u64, u32)>;

/// The `MANIFEST` at `path`.
pub fn read_manifest(path: &Path) -> Result<Manifest, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_manifest(&text, &path.display().to_string())
}

/// A `MANIFEST`'s text (`origin` names it in errors): lines of `CRC32 SIZE PATH`, `#` comments.
pub fn parse_manifest(text: &str, origin: &str) -> Result<Manifest, String> {
    let mut m = HashMap::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#')) {
        let mut w = line.split_whitespace();
        let (Some(crc), Some(size), Some(name)) = (w.next(), w.next(), w.next()) else {
            return Err(format!("{origin}:{}: expected 'CRC32 SIZE PATH'", i + 1));
        };
        let crc = u32::from_str_radix(crc, 16).map_err(|_| format!("{origin}:{}: CRC '{crc}'", i + 1))?;
        let size = size.parse().map_err(|_| format!("{origin}:{}: size '{size}'", i + 1))?;
        m.insert(PathBuf::from(name), (size, crc));
    }
    Ok(m)
}

/// The file `plain` (its path in `manifest`) unpacked from `packed`, checked against its line.
pub fn unpack_checked(plain: &Path, packed: &[u8], manifest: &Manifest) -> Result<Vec<u8>, String> {
    let name = plain.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let b = unpack(&name, packed)?;
    let Some(&(size, crc)) = manifest.get(plain) else {
        return Err(format!("{}: not in its MANIFEST", plain.display()));
    };
    if b.len() as u64 != size || crc32(&b) != crc {
        return Err(format!("{}: unpacked, not the bytes its MANIFEST names", plain.display()));
    }
    Ok(b)
}

/// A key of the state of the folder `from`: a CRC-32 over each file's path, size and
/// modification time (links followed), so a copy made from it can tell it is stale.
pub fn tree_key(from: &Path) -> Result<u32, String> {
    fn walk(dir: &Path, rel: &Path, c: &mut flate2::Crc) -> Result<(), String> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        entries.sort();
        for name in entries {
            let (p, r) = (dir.join(&name), rel.join(&name));
            let m = std::fs::metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            if m.is_dir() {
                walk(&p, &r, c)?;
                continue;
            }
            let t = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
            c.update(format!("{} {} {}\n", r.display(), m.len(), t.as_nanos()).as_bytes());
        }
        Ok(())
    }
    let mut c = flate2::Crc::new();
    walk(from, Path::new(""), &mut c)?;
    Ok(c.sum())
}

/// The folder `from` as its readers see it, in `to`: every packed file unpacked (checked
/// against `from/MANIFEST`), every other file copied (links followed). Made once: a `to` that
/// is complete is kept; a new one is made beside it and renamed into place, so processes
/// making it at once each finish with a whole copy.
pub fn unpack_tree(from: &Path, to: &Path) -> Result<(), String> {
    if to.join(".complete").exists() {
        return Ok(());
    }
    let manifest = read_manifest(&from.join("MANIFEST"))?;
    let tmp = to.with_extension(format!("tmp-{}-{:?}", std::process::id(), std::thread::current().id()));
    let _ = std::fs::remove_dir_all(&tmp);
    copy_dir(from, &tmp, Path::new(""), &manifest)?;
    std::fs::write(tmp.join(".complete"), b"").map_err(|e| format!("{}: {e}", tmp.display()))?;
    if std::fs::rename(&tmp, to).is_err() {
        // another process finished first (or left a stale folder behind): keep a complete one
        let _ = std::fs::remove_dir_all(&tmp);
        if !to.join(".complete").exists() {
            return Err(format!("{}: could not put the unpacked fixtures in place", to.display()));
        }
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path, rel: &Path, manifest: &Manifest) -> Result<(), String> {
    let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(to.join(rel)).map_err(|e| err(to, e))?;
    let dir = from.join(rel);
    for entry in std::fs::read_dir(&dir).map_err(|e| err(&dir, e))? {
        let entry = entry.map_err(|e| err(&dir, e))?;
        let (name, path) = (entry.file_name(), entry.path());
        let r = rel.join(&name);
        // metadata follows links: a linked file is read through its link
        let meta = std::fs::metadata(&path).map_err(|e| err(&path, e))?;
        if meta.is_dir() {
            copy_dir(from, to, &r, manifest)?;
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| err(&path, e))?;
        let (out, bytes) = match name.to_str().and_then(|n| n.strip_suffix(&format!(".{EXT}"))) {
            Some(stem) => {
                let plain = rel.join(stem);
                let b = unpack_checked(&plain, &bytes, manifest).map_err(|e| format!("{}: {e}", path.display()))?;
                (to.join(plain), b)
            }
            None => (to.join(&r), bytes),
        };
        std::fs::write(&out, bytes).map_err(|e| err(&out, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_past_its_cap_is_refused() {
        // a megabyte of zeros in xz
        let mut xz = Vec::new();
        lzma_rs::xz_compress(&mut &vec![0u8; 1 << 20][..], &mut xz).unwrap();
        assert_eq!(xz_decompress(&xz, 1 << 20).unwrap(), vec![0u8; 1 << 20]);
        assert!(xz_decompress(&xz, (1 << 20) - 1).unwrap_err().contains("more than"));
    }

    /// A safetensors file of an f32, a bf16 and an i64 tensor (with a gap of padding).
    fn sample() -> Vec<u8> {
        let header = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]},"c":{"dtype":"I64","shape":[1],"data_offsets":[20,28]}}"#;
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend((0u8..28).map(|i| i.wrapping_mul(37)));
        b
    }

    #[test]
    fn planes_group_each_values_bytes_and_go_back() {
        let b = sample();
        let p = values_to_planes(&b).unwrap();
        let d = 8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        // tensor a: byte 0 of its three values first
        assert_eq!(&p[d..d + 3], &[b[d], b[d + 4], b[d + 8]]);
        // the padding between a and b is untouched
        assert_eq!(&p[d + 12..d + 16], &b[d + 12..d + 16]);
        assert_ne!(p, b);
        assert_eq!(planes_to_values(&p).unwrap(), b);
    }

    #[test]
    fn a_damaged_header_is_an_error_not_a_panic() {
        for b in [vec![], vec![200, 0, 0, 0, 0, 0, 0, 0, b'{'], b"\x02\0\0\0\0\0\0\0{x".to_vec()] {
            assert!(planes_to_values(&b).is_err());
        }
        assert!(unpack("x.safetensors", b"not xz").unwrap_err().contains("xz"));
    }
}
