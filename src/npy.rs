//! Writing float32 arrays as NumPy `.npy` files (format version 1.0).

use std::io::Write;
use std::path::Path;

/// Write `data` as a little-endian float32 array of `shape`, through a temporary file renamed
/// into place (a failed write leaves nothing that looks complete).
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of
    // 64 and ended by a newline
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    while 10 + header.len() + 1 < total {
        header.push(' ');
    }
    header.push('\n');
    crate::out_file::check_destination(path)?;
    let tmp = path.with_extension("npy.partial");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        f.write_all(b"\x93NUMPY\x01\x00")?;
        f.write_all(&(header.len() as u16).to_le_bytes())?;
        f.write_all(header.as_bytes())?;
        for v in data {
            f.write_all(&v.to_le_bytes())?;
        }
        f.flush()?;
    }
    std::fs::rename(&tmp, path)
}
