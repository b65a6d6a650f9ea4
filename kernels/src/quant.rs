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

use half::bf16;

/// Storage format of one matrix (or vector).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    Bf16,
    Q8 { group: usize },
    Q4 { group: usize },
}

/// The groups a quantized format may use, largest first.
pub const GROUPS: [usize; 4] = [128, 64, 32, 16];

/// Largest of 128/64/32/16 (not above `max_group`) that divides `cols`.
pub fn pick_group(cols: usize, max_group: usize) -> Option<usize> {
    GROUPS.into_iter().find(|&g| g <= max_group && cols % g == 0)
}

impl Format {
    pub fn name(&self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::Bf16 => "bf16",
            Format::Q8 { .. } => "q8",
            Format::Q4 { .. } => "q4",
        }
    }

    pub fn group(&self) -> Option<usize> {
        match self {
            Format::Q8 { group } | Format::Q4 { group } => Some(*group),
            _ => None,
        }
    }

    /// Name of the in-row layout, recorded in the package so a reader never guesses.
    pub fn layout(&self) -> &'static str {
        match self {
            Format::Q4 { .. } => "q4_lohi32",
            _ => "row_major",
        }
    }

    /// Whether `cols` can be stored in this format (a group must divide the row).
    pub fn fits(&self, cols: usize) -> bool {
        match self.group() {
            Some(g) => g > 0 && cols % g == 0 && (!matches!(self, Format::Q4 { .. }) || g % 2 == 0),
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
        }
    }

    /// Bytes of the f32 scales of a `[rows, cols]` matrix.
    pub fn scale_bytes(&self, rows: usize, cols: usize) -> usize {
        match self.group() {
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

/// Dequantize one q8 row.
pub fn dequantize_q8_row(q: &[i8], scales: &[f32], group: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = scales[i / group] * q[i] as f32;
    }
}

/// Dequantize one q4 row.
pub fn dequantize_q4_row(q: &[u8], scales: &[f32], group: usize, out: &mut [f32]) {
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

    #[test]
    fn q4_round_trip_and_extreme_maps_to_minus_8() {
        let mut s = 7;
        for group in GROUPS {
            let x: Vec<f32> = (0..group * 2).map(|_| lcg(&mut s)).collect();
            let mut q = vec![0u8; x.len() / 2];
            let mut d = vec![0f32; 2];
            quantize_q4_row(&x, group, &mut q, &mut d);
            let mut y = vec![0f32; x.len()];
            dequantize_q4_row(&q, &d, group, &mut y);
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
