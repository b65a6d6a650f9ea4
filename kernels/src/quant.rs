//! Weight formats and their quantizers.
//!
//! A matrix is `[rows, cols]` row-major (`cols` = the input dimension K of `y = W x`).
//! Quantized formats split every row into groups of `group` consecutive columns, each with
//! one f32 scale (`scales[row * cols / group + g]`):
//!
//! - `Q8`: int8 `q = round(x / d)` with `d = absmax / 127`, so `x ≈ d * q`. One byte per value.
//! - `Q4`: signed int4 in `[-8, 7]` with `d = m / -8` where `m` is the value of largest
//!   magnitude (it maps exactly to -8, as in ggml's Q4_0), so `x ≈ d * q`. Stored biased,
//!   `n = q + 8` in a nibble, two per byte. Within a group, values come in blocks of
//!   `B = min(group, 32)`: byte `j` of a block holds value `j` in its low nibble and value
//!   `j + B/2` in its high nibble, so a SIMD kernel gets the block's two halves with one mask
//!   and one shift. Layout name: `q4_lohi32`.
//! - `Q6`: signed int6 in `[-32, 31]`, `d = m / -32` as for Q4, stored biased (`n = q + 32`,
//!   in `[0, 63]`); groups are whole chunks of 128 values. A chunk is 96 bytes: 64 bytes of low
//!   nibbles exactly as a `q4_lohi32` chunk, then 32 bytes of the high two bits. Number the
//!   chunk's values in the order a 64-byte load of its low nibbles delivers them (position
//!   `p` = the byte for a low nibble, 64 + the byte for a high nibble); position `p`'s high bits
//!   are bits `2 * (p / 32)..` of high byte `p % 32`, so one 32-byte load, shifted by 4, 2, 0 and
//!   -2 bits, lines them up with the low nibbles. Layout name: `q6_lo4hi2`. This is the output
//!   layer's format in q4 packages (6.25 bits a weight; llama.cpp's Q6_K: 6.56).
//!
//! - `Mxfp4`: blocks of 32 e2m1 values under a power-of-two scale, ggml's `block_mxfp4` bytes
//!   (see [`crate::mxfp4`]); no f32 scales (the exponents are in the blocks), activations
//!   quantized in groups of 32. Layout name: `mxfp4_ggml`.
//!
//! Row-interleaved storage (`q4_lohi32_x4`, `q6_lo4hi2_x4`): a q4 or q6 matrix whose rows are a
//! multiple of [`ROW_BLOCK`] and whose row is whole 128-value chunks is stored in blocks of 4
//! rows, the blocks' chunks alternating row by row: chunk `c` of row `r` lies at
//! [`interleaved_offset`]. A kernel that works on 4 rows at once then reads one sequential
//! stream (4 rows side by side in the row-major order were 4 streams 1 KiB apart, which the
//! hardware prefetcher followed badly: `cargo bench --bench matvec` shows both layouts). Scales
//! stay `[rows, cols / group]`.
//!
//! Panel-major order (in memory only, never in a file): the same chunks as x4, superblocks of 16
//! rows stored panel by panel ([`panel_offset`]), for rows so long that the x4 decode kernel's
//! activation row fell out of L1 between two 4-row blocks ([`panels_pay`]). Scales unchanged.
//! Lane order (in memory only, q4 with symmetric groups): 16-row blocks whose rows' 4-byte
//! words lie side by side ([`lanes_offset`], [`lanes_pay`]). Scales unchanged.

use half::bf16;

/// Storage format of one matrix (or vector).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    Bf16,
    Q8 { group: usize },
    Q4 { group: usize },
    Q6 { group: usize },
    Mxfp4,
}

/// Values per q6 chunk (a group is a whole number of chunks).
pub const Q6_CHUNK: usize = CHUNK;
/// Bytes per q6 chunk: 64 of low nibbles, 32 of high bits.
pub const Q6_CHUNK_BYTES: usize = 96;

/// Rows per block of the row-interleaved layouts.
pub const ROW_BLOCK: usize = 4;
/// Values per interleaved chunk of a row.
pub const CHUNK: usize = 128;

/// Offset of 128-value chunk `c` of row `r` in a row-interleaved matrix (rows of `row_bytes`,
/// chunks of `chunk_bytes`).
#[inline]
pub fn interleaved_offset(r: usize, c: usize, row_bytes: usize, chunk_bytes: usize) -> usize {
    (r / ROW_BLOCK) * ROW_BLOCK * row_bytes + (c * ROW_BLOCK + r % ROW_BLOCK) * chunk_bytes
}

/// Rows of a panel-major superblock ([`panel_offset`]).
pub const PANEL_ROWS: usize = 16;
/// 128-value chunks of a row per panel: 2 KiB of int8 activations, which stay in L1 while the
/// superblock's 16 rows stream past them.
pub const PANEL_CHUNKS: usize = 16;

/// Offset of chunk `c` of row `r` in a panel-major matrix: superblocks of [`PANEL_ROWS`] rows
/// (the matrix's rows a multiple of it), each stored as its column panels of [`PANEL_CHUNKS`]
/// chunks (the last panel what is left) one after another, and within a panel its four
/// [`ROW_BLOCK`]-row blocks one after another, each block's chunks alternating row by row as in
/// [`interleaved_offset`]. A decode kernel that runs every block of a superblock over a panel
/// before the next panel reads one sequential stream and reuses the panel's activations four
/// times while they are in L1; over rows of thousands of values the x4 order made it fetch the
/// whole activation row again for every block (see [`panels_pay`]).
#[inline]
pub fn panel_offset(r: usize, c: usize, row_bytes: usize, chunk_bytes: usize) -> usize {
    let chunks = row_bytes / chunk_bytes;
    let p = c / PANEL_CHUNKS;
    // the panel's width: whole, or the row's last chunks
    let w = PANEL_CHUNKS.min(chunks - p * PANEL_CHUNKS);
    let panel = (r / PANEL_ROWS) * PANEL_ROWS * row_bytes + p * PANEL_CHUNKS * PANEL_ROWS * chunk_bytes;
    let block = (r % PANEL_ROWS) / ROW_BLOCK * ROW_BLOCK * w * chunk_bytes;
    panel + block + ((c % PANEL_CHUNKS) * ROW_BLOCK + r % ROW_BLOCK) * chunk_bytes
}

/// Offset of chunk `c` of row `r` of an interleaved matrix: panel-major when `panels`.
#[inline]
pub fn chunk_offset(r: usize, c: usize, row_bytes: usize, chunk_bytes: usize, panels: bool) -> usize {
    if panels { panel_offset(r, c, row_bytes, chunk_bytes) } else { interleaved_offset(r, c, row_bytes, chunk_bytes) }
}

/// Rows of at least this many chunks (12288 values) go panel-major. One thread on Zen 5
/// (`cargo bench --bench matvec`, q4 groups of 32, alternated runs), panels against x4: decode
/// from memory at 16384 values +40-55%, at 10240 +5-8%; prefill's tiles over 64 tokens -8% at
/// 10240 (each chunk's place costs more to work out).
pub const PANEL_MIN_CHUNKS: usize = 96;

/// Whether a row-interleaved `[rows, cols]` matrix in `format` goes panel-major when loaded for
/// decode: q4 or q6, rows a multiple of [`PANEL_ROWS`], rows of at least [`PANEL_MIN_CHUNKS`]
/// chunks, and groups that end on panel boundaries (so each panel's groups are whole).
pub fn panels_pay(format: Format, rows: usize, cols: usize) -> bool {
    let group_fits = format.group().is_some_and(|g| (PANEL_CHUNKS * CHUNK).is_multiple_of(g));
    matches!(format, Format::Q4 { .. } | Format::Q6 { .. })
        && format.interleaves(rows, cols)
        && rows.is_multiple_of(PANEL_ROWS)
        && cols / CHUNK >= PANEL_MIN_CHUNKS
        && group_fits
}

/// A row-interleaved matrix `src` (rows of `row_bytes`) in the panel-major order, into `out`
/// (same length; the rows a multiple of [`PANEL_ROWS`]).
pub fn panel_rows(src: &[u8], row_bytes: usize, chunk_bytes: usize, out: &mut [u8]) {
    debug_assert!(src.len() == out.len() && src.len().is_multiple_of(row_bytes * PANEL_ROWS));
    let chunks = row_bytes / chunk_bytes;
    for r in 0..src.len() / row_bytes {
        for c in 0..chunks {
            let (from, to) =
                (interleaved_offset(r, c, row_bytes, chunk_bytes), panel_offset(r, c, row_bytes, chunk_bytes));
            out[to..to + chunk_bytes].copy_from_slice(&src[from..from + chunk_bytes]);
        }
    }
}

pub use crate::lanes::{LANE_ROWS, lane_row_scales, lane_rows, lane_scale_index, lane_scales, lanes_offset, lanes_pay};

/// Row-major `src` (rows of `row_bytes`) in the row-interleaved order, into `out` (same length).
pub fn interleave_rows(src: &[u8], row_bytes: usize, chunk_bytes: usize, out: &mut [u8]) {
    debug_assert!(src.len() == out.len() && src.len().is_multiple_of(row_bytes * ROW_BLOCK));
    for (r, row) in src.chunks_exact(row_bytes).enumerate() {
        for (c, chunk) in row.chunks_exact(chunk_bytes).enumerate() {
            let at = interleaved_offset(r, c, row_bytes, chunk_bytes);
            out[at..at + chunk_bytes].copy_from_slice(chunk);
        }
    }
}

/// Row `r` of a row-interleaved matrix `q` (panel-major when `panels`, q4 in lane order when
/// `lanes`), gathered into `out` (`row_bytes` long).
pub fn gather_row(q: &[u8], r: usize, chunk_bytes: usize, (panels, lanes): (bool, bool), out: &mut [u8]) {
    let row_bytes = out.len();
    if lanes {
        for (c, chunk) in out.chunks_exact_mut(chunk_bytes).enumerate() {
            for (d, word) in chunk.chunks_exact_mut(4).enumerate() {
                let at = lanes_offset(r, c, row_bytes) + d * 64;
                word.copy_from_slice(&q[at..at + 4]);
            }
        }
        return;
    }
    for (c, chunk) in out.chunks_exact_mut(chunk_bytes).enumerate() {
        let at = chunk_offset(r, c, row_bytes, chunk_bytes, panels);
        chunk.copy_from_slice(&q[at..at + chunk_bytes]);
    }
}

/// The groups a quantized format may use, largest first.
pub const GROUPS: [usize; 4] = [128, 64, 32, 16];

/// Largest of 128/64/32/16 (not above `max_group`) that divides `cols`.
pub fn pick_group(cols: usize, max_group: usize) -> Option<usize> {
    GROUPS.into_iter().find(|&g| g <= max_group && cols.is_multiple_of(g))
}

impl Format {
    pub fn name(&self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::Bf16 => "bf16",
            Format::Q8 { .. } => "q8",
            Format::Q4 { .. } => "q4",
            Format::Q6 { .. } => "q6",
            Format::Mxfp4 => "mxfp4",
        }
    }

    /// The group the activations are quantized with (None: they stay f32).
    pub fn group(&self) -> Option<usize> {
        match self {
            Format::Q8 { group } | Format::Q4 { group } | Format::Q6 { group } => Some(*group),
            Format::Mxfp4 => Some(crate::mxfp4::BLOCK),
            _ => None,
        }
    }

    /// Name of the layout of a `[rows, cols]` matrix (or a vector: one row) in this format,
    /// recorded in the package so a reader never guesses.
    pub fn layout(&self, rows: usize, cols: usize) -> &'static str {
        match self {
            Format::Q4 { .. } if self.interleaves(rows, cols) => "q4_lohi32_x4",
            Format::Q6 { .. } if self.interleaves(rows, cols) => "q6_lo4hi2_x4",
            _ => self.row_major_layout(),
        }
    }

    /// Name of the layout with rows one after another (packages written before the
    /// interleaved layouts store every matrix so).
    pub fn row_major_layout(&self) -> &'static str {
        match self {
            Format::Q4 { .. } => "q4_lohi32",
            Format::Q6 { .. } => "q6_lo4hi2",
            Format::Mxfp4 => "mxfp4_ggml",
            _ => "row_major",
        }
    }

    /// Bytes of one 128-value chunk of a row, for the formats whose rows interleave (q4, q6).
    pub fn chunk_bytes(&self) -> Option<usize> {
        match self {
            Format::Q4 { .. } => Some(CHUNK / 2),
            Format::Q6 { .. } => Some(Q6_CHUNK_BYTES),
            _ => None,
        }
    }

    /// Whether a `[rows, cols]` matrix in this format is stored row-interleaved (see the
    /// module doc): q4 and q6, rows a multiple of [`ROW_BLOCK`], rows of whole chunks.
    pub fn interleaves(&self, rows: usize, cols: usize) -> bool {
        self.chunk_bytes().is_some() && rows.is_multiple_of(ROW_BLOCK) && cols.is_multiple_of(CHUNK)
    }

    /// Whether `cols` can be stored in this format (a group must divide the row).
    pub fn fits(&self, cols: usize) -> bool {
        match self.group() {
            // q6: whole chunks per group, or 8 groups of 16 per chunk (GGUF's Q6_K)
            Some(g) if matches!(self, Format::Mxfp4) => cols.is_multiple_of(g),
            Some(g) if matches!(self, Format::Q6 { .. }) => {
                (g.is_multiple_of(Q6_CHUNK) || g == 16) && g > 0 && cols.is_multiple_of(g.max(Q6_CHUNK))
            }
            Some(g) => {
                let unit = if matches!(self, Format::Q4 { .. }) { 2 } else { 1 };
                g > 0 && cols.is_multiple_of(g) && g % unit == 0
            }
            None => true,
        }
    }

    /// Bytes of the values of a `[rows, cols]` matrix (scales excluded).
    pub fn data_bytes(&self, rows: usize, cols: usize) -> usize {
        let n = rows * cols;
        match self {
            Format::F32 => n * 4,
            Format::Bf16 => n * 2,
            Format::Q8 { .. } => n,
            Format::Q4 { .. } => n / 2,
            Format::Q6 { .. } => n / Q6_CHUNK * Q6_CHUNK_BYTES,
            Format::Mxfp4 => n / crate::mxfp4::BLOCK * crate::mxfp4::BLOCK_BYTES,
        }
    }

    /// Bytes of the f32 scales of a `[rows, cols]` matrix (none for MXFP4: its scales are in
    /// its blocks).
    pub fn scale_bytes(&self, rows: usize, cols: usize) -> usize {
        match self.group() {
            Some(_) if *self == Format::Mxfp4 => 0,
            Some(g) => rows * (cols / g) * 4,
            None => 0,
        }
    }
}

/// bf16 bits -> f32 (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 -> bf16 bits, round to nearest even (as torch does).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// Quantize one row to int8 with one scale per `group` values.
/// `q.len() == x.len()`, `scales.len() == x.len() / group`.
pub fn quantize_q8_row(x: &[f32], group: usize, q: &mut [i8], scales: &mut [f32]) {
    debug_assert_eq!(x.len() % group, 0);
    for (gi, xs) in x.chunks_exact(group).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        scales[gi] = d;
        for (qo, &v) in q[gi * group..(gi + 1) * group].iter_mut().zip(xs) {
            *qo = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
    }
}

/// Quantize one row to biased int4 (`q4_lohi32` layout). `q.len() == x.len() / 2`.
pub fn quantize_q4_row(x: &[f32], group: usize, q: &mut [u8], scales: &mut [f32]) {
    debug_assert_eq!(x.len() % group, 0);
    let block = group.min(32);
    let half = block / 2;
    for (gi, xs) in x.chunks_exact(group).enumerate() {
        // the value of largest magnitude, with its sign
        let m = xs.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = m / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        scales[gi] = d;
        let qg = &mut q[gi * group / 2..(gi + 1) * group / 2];
        for (bi, xb) in xs.chunks_exact(block).enumerate() {
            for j in 0..half {
                let lo = ((xb[j] * id).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                let hi = ((xb[j + half] * id).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                qg[bi * half + j] = lo | (hi << 4);
            }
        }
    }
}

/// Signed value `j` of a `q4_lohi32` group (`qg` = that group's bytes).
#[inline]
pub fn q4_value(qg: &[u8], group: usize, j: usize) -> i32 {
    let block = group.min(32);
    let half = block / 2;
    let (b, i) = (j / block, j % block);
    let byte = qg[b * half + (i % half)];
    let n = if i < half { byte & 0x0F } else { byte >> 4 };
    n as i32 - 8
}

/// Position of value `j` (0..128) of a q6 chunk in the order its low nibbles load: the
/// low-nibble byte for the first 16 values of each 32-value block, 64 + that byte for the rest.
#[inline]
fn q6_position(j: usize) -> usize {
    let (b, i) = (j / 32, j % 32);
    if i < 16 { b * 16 + i } else { 64 + b * 16 + i - 16 }
}

/// Quantize one row to biased int6 (`q6_lo4hi2` layout). `q.len() == x.len() / 128 * 96`.
pub fn quantize_q6_row(x: &[f32], group: usize, q: &mut [u8], scales: &mut [f32]) {
    debug_assert!(Format::Q6 { group }.fits(x.len()));
    q.fill(0);
    for (gi, xs) in x.chunks_exact(group).enumerate() {
        let m = xs.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = m / -32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        scales[gi] = d;
        for (j, &v) in xs.iter().enumerate() {
            put_q6(q, gi * group + j, ((v * id).round().clamp(-32.0, 31.0) as i32 + 32) as u8);
        }
    }
}

/// Store the biased code `n` (0..=63, value `n - 32`) of value `j` into a q6 row `q` whose
/// place for it is still zero.
#[inline]
pub fn put_q6(q: &mut [u8], j: usize, n: u8) {
    let chunk = &mut q[j / Q6_CHUNK * Q6_CHUNK_BYTES..][..Q6_CHUNK_BYTES];
    let p = q6_position(j % Q6_CHUNK);
    chunk[p % 64] |= (n & 0x0F) << (4 * (p / 64));
    chunk[64 + p % 32] |= (n >> 4) << (2 * (p / 32));
}

/// Signed value `j` of a q6 row (`q` = the row's bytes).
#[inline]
pub fn q6_value(q: &[u8], j: usize) -> i32 {
    let chunk = &q[j / Q6_CHUNK * Q6_CHUNK_BYTES..][..Q6_CHUNK_BYTES];
    let p = q6_position(j % Q6_CHUNK);
    let lo = (chunk[p % 64] >> (4 * (p / 64))) & 0x0F;
    let hi = (chunk[64 + p % 32] >> (2 * (p / 32))) & 0x03;
    (lo | (hi << 4)) as i32 - 32
}

/// Dequantize one q6 row.
pub fn dequantize_q6_row(q: &[u8], scales: &[f32], group: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = scales[j / group] * q6_value(q, j) as f32;
    }
}

/// Dequantize one q8 row.
pub fn dequantize_q8_row(q: &[i8], scales: &[f32], group: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = scales[i / group] * q[i] as f32;
    }
}

/// Dequantize one q4 row.
pub fn dequantize_q4_row(q: &[u8], scales: &[f32], group: usize, out: &mut [f32]) {
    if group.is_multiple_of(32) {
        // a 32-value block at a time: its 16 bytes' low nibbles are its first 16 values, the
        // high nibbles the rest (what `q4_value` reads one value at a time), in loops the
        // compiler vectorizes (per value: latent attention's prompt form dequantizes every
        // head's up-projections each pass)
        for (bi, (ob, qb)) in out.chunks_exact_mut(32).zip(q.chunks_exact(16)).enumerate() {
            let s = scales[bi * 32 / group];
            let (lo, hi) = ob.split_at_mut(16);
            for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(qb) {
                *l = s * ((b & 0x0F) as i32 - 8) as f32;
                *h = s * ((b >> 4) as i32 - 8) as f32;
            }
        }
        return;
    }
    for (gi, og) in out.chunks_exact_mut(group).enumerate() {
        let qg = &q[gi * group / 2..(gi + 1) * group / 2];
        for (j, o) in og.iter_mut().enumerate() {
            *o = scales[gi] * q4_value(qg, group, j) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn q8_round_trip_error_is_at_most_half_a_step() {
        let mut s = 1;
        for group in GROUPS {
            let x: Vec<f32> = (0..group * 3).map(|_| lcg(&mut s) * 3.0).collect();
            let mut q = vec![0i8; x.len()];
            let mut d = vec![0f32; 3];
            quantize_q8_row(&x, group, &mut q, &mut d);
            let mut y = vec![0f32; x.len()];
            dequantize_q8_row(&q, &d, group, &mut y);
            for (i, (a, b)) in x.iter().zip(&y).enumerate() {
                assert!((a - b).abs() <= d[i / group] * 0.5 + 1e-6, "{a} {b}");
            }
        }
    }

    /// `groups` groups of random values, quantized to q4 and dequantized: `(x, q, scales, y)`.
    fn q4_round_trip(seed: &mut u64, group: usize, groups: usize) -> (Vec<f32>, Vec<u8>, Vec<f32>, Vec<f32>) {
        let x: Vec<f32> = (0..group * groups).map(|_| lcg(seed)).collect();
        let (mut q, mut d) = (vec![0u8; x.len() / 2], vec![0f32; groups]);
        quantize_q4_row(&x, group, &mut q, &mut d);
        let mut y = vec![0f32; x.len()];
        dequantize_q4_row(&q, &d, group, &mut y);
        (x, q, d, y)
    }

    #[test]
    fn q4_rows_dequantize_to_each_values_nibble_times_its_scale() {
        let mut s = 11;
        for group in GROUPS {
            let (_, q, d, y) = q4_round_trip(&mut s, group, 8);
            for (j, &v) in y.iter().enumerate() {
                let (g, qg) = (j / group, &q[j / group * group / 2..(j / group + 1) * group / 2]);
                assert_eq!(
                    v.to_bits(),
                    (d[g] * q4_value(qg, group, j % group) as f32).to_bits(),
                    "group {group} value {j}"
                );
            }
        }
    }

    #[test]
    fn q4_round_trip_and_extreme_maps_to_minus_8() {
        let mut s = 7;
        for group in GROUPS {
            let (x, _, d, y) = q4_round_trip(&mut s, group, 2);
            for g in 0..2 {
                let xs = &x[g * group..(g + 1) * group];
                let (im, _) = xs
                    .iter()
                    .enumerate()
                    .fold((0, 0f32), |(bi, bm), (i, v)| if v.abs() > bm { (i, v.abs()) } else { (bi, bm) });
                // the extreme value is exact
                assert!((y[g * group + im] - xs[im]).abs() < 1e-6);
                for j in 0..group {
                    // within half a step, except the side opposite the extreme, clipped at
                    // +7 steps (8 steps exist only towards the extreme): at most one step
                    let clipped = xs[j] / d[g] > 7.5;
                    let bound = if clipped { d[g].abs() } else { d[g].abs() * 0.5 };
                    assert!((xs[j] - y[g * group + j]).abs() <= bound + 1e-6);
                }
            }
        }
    }

    #[test]
    fn q4_layout_low_then_high_nibbles_per_32_block() {
        // values 0..32 of one group of 32: value j in the low nibble of byte j, value j+16 high
        let x: Vec<f32> = (0..32).map(|j| if j == 20 { -8.0 } else { (j % 8) as f32 - 4.0 }).collect();
        let mut q = vec![0u8; 16];
        let mut d = vec![0f32; 1];
        quantize_q4_row(&x, 32, &mut q, &mut d);
        assert_eq!(d[0], 1.0);
        assert_eq!(q[4] >> 4, 0); // value 20 = -8 -> nibble 0, high half of byte 4
        assert_eq!(q[3] & 0x0F, (3 - 4 + 8) as u8); // value 3 -> -1
        assert_eq!(q[3] >> 4, ((19 % 8) - 4 + 8) as u8);
    }

    #[test]
    fn q6_round_trip_within_half_a_step_and_extreme_exact() {
        let mut s = 9;
        for group in [128, 256] {
            let x: Vec<f32> = (0..group * 3).map(|_| lcg(&mut s) * 2.0).collect();
            let mut q = vec![0u8; x.len() / 128 * 96];
            let mut d = vec![0f32; 3];
            quantize_q6_row(&x, group, &mut q, &mut d);
            let mut y = vec![0f32; x.len()];
            dequantize_q6_row(&q, &d, group, &mut y);
            for g in 0..3 {
                let xs = &x[g * group..(g + 1) * group];
                let m = xs.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                assert_eq!(d[g], m / -32.0);
                for j in 0..group {
                    let (a, b) = (xs[j], y[g * group + j]);
                    if a == m {
                        assert!((a - b).abs() < 1e-6);
                    }
                    // +31 steps on the side opposite the extreme: one step at most there
                    let bound = if a / d[g] > 31.5 { d[g].abs() } else { d[g].abs() * 0.5 };
                    assert!((a - b).abs() <= bound + 1e-6, "g={group} j={j}: {a} {b}");
                }
            }
        }
    }

    #[test]
    fn q6_layout_low_nibbles_as_q4_high_bits_by_load_position() {
        // values n = q + 32 of one chunk chosen so every field is distinct where it matters
        let vals: Vec<i32> = (0..128).map(|j| ((j * 37 + 5) % 64) - 32).collect();
        let mut x: Vec<f32> = vals.iter().map(|v| *v as f32).collect();
        x[0] = -32.0; // the extreme: scale exactly 1
        let mut q = vec![0u8; 96];
        let mut d = vec![0f32; 1];
        quantize_q6_row(&x, 128, &mut q, &mut d);
        assert_eq!(d[0], 1.0);
        let n = |j: usize| (x[j] as i32 + 32) as u8;
        // value 40 = block 1, index 8 (low half): low nibble of byte 24 -> position 24
        assert_eq!(q[24] & 0x0F, n(40) & 0x0F);
        assert_eq!(q[64 + 24] & 0x03, n(40) >> 4);
        // value 59 = block 1, index 27 (high half): high nibble of byte 27 -> position 91
        assert_eq!(q[27] >> 4, n(59) & 0x0F);
        assert_eq!((q[64 + 91 % 32] >> (2 * (91 / 32))) & 0x03, n(59) >> 4);
        for j in 0..128 {
            assert_eq!(q6_value(&q, j), x[j] as i32, "value {j}");
        }
    }

    #[test]
    fn q6_fits_only_whole_chunks() {
        assert!(Format::Q6 { group: 128 }.fits(2048));
        assert!(!Format::Q6 { group: 64 }.fits(2048));
        assert!(!Format::Q6 { group: 128 }.fits(192));
        assert_eq!(Format::Q6 { group: 128 }.data_bytes(2, 256), 2 * 2 * 96);
    }

    #[test]
    fn zero_rows_quantize_to_zero() {
        let x = vec![0f32; 64];
        let mut q = vec![0u8; 32];
        let mut d = vec![1f32; 1];
        quantize_q4_row(&x, 64, &mut q, &mut d);
        assert_eq!(d[0], 0.0);
        let mut y = vec![1f32; 64];
        dequantize_q4_row(&q, &d, 64, &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
    }
}
