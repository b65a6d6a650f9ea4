//! f32 rows quantized into GGUF blocks of Q4_K, Q2_K and IQ4_XS (what `convert --quant q4_k |
//! q2_k | iq4_xs` writes): the same bytes a GGUF file of that type holds, read back by
//! [`crate::ggml::dequantize`]. No importance matrix: each sub-block's scale (and min) is the
//! best of a small search under a weighted squared error, the weights `rms + |x|` of the
//! super-block favouring the larger values, as K-quant quantizers do without one.
//!
//! | type   | super-block | sub-blocks             | value                                   |
//! |--------|-------------|------------------------|-----------------------------------------|
//! | Q4_K   | 256 / 144 B | 8 x 32, 6-bit sc and m | d sc q - dmin m, q in 0..15              |
//! | Q2_K   | 256 / 84 B  | 16 x 16, 4-bit sc and m| d sc q - dmin m, q in 0..3               |
//! | IQ4_XS | 256 / 136 B | 8 x 32, 6-bit sc - 32  | d (sc - 32) v[q], v the IQ4 codebook      |

use half::f16;

use crate::ggml::{BlockType, IQ4_VALUES, QK_K};

/// The types [`quantize_row`] writes.
pub const TYPES: [BlockType; 3] = [BlockType::Q4K, BlockType::Q2K, BlockType::Iq4Xs];

/// `x` (a whole number of 256-value super-blocks) as blocks of `t` appended to `out`.
///
/// # Panics
/// For a type not in [`TYPES`] or a length not a multiple of 256 (a caller's bug).
pub fn quantize_row(t: BlockType, x: &[f32], out: &mut Vec<u8>) {
    assert!(x.len().is_multiple_of(QK_K), "{} values are not whole super-blocks", x.len());
    for sb in x.chunks_exact(QK_K) {
        let w = weights(sb);
        match t {
            BlockType::Q4K => q4_k(sb, &w, out),
            BlockType::Q2K => q2_k(sb, &w, out),
            BlockType::Iq4Xs => iq4_xs(sb, &w, out),
            _ => panic!("{} has no quantizer", t.name()),
        }
    }
}

/// Error weights of a super-block: its rms plus each value's magnitude.
fn weights(x: &[f32]) -> Vec<f32> {
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    x.iter().map(|v| rms + v.abs()).collect()
}

fn round_clamp(v: f32, hi: i32) -> u8 {
    (v.round() as i32).clamp(0, hi) as u8
}

/// Scale `s >= 0` and min `m >= 0` of `x` as `s q - m` with `q` in `0..=nmax`, minimizing the
/// weighted squared error over a search of starting scales, each refined by least squares.
fn scale_min(x: &[f32], w: &[f32], nmax: i32) -> (f32, f32) {
    let lo = x.iter().copied().fold(0f32, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if hi <= lo {
        return (0.0, -lo);
    }
    let n = nmax as f32;
    let err = |s: f32, m: f32| -> f32 {
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        x.iter().zip(w).map(|(&v, &wi)| wi * (s * round_clamp((v + m) * inv, nmax) as f32 - m - v).powi(2)).sum()
    };
    let (mut best_s, mut best_m) = ((hi - lo) / n, -lo);
    let mut best = err(best_s, best_m);
    let mut q = vec![0u8; x.len()];
    for step in -10..=10 {
        // a starting scale around the range's, codes from it, then s and m fitted to the codes
        let s0 = (hi - lo) / (n + 0.1 * step as f32);
        if s0 <= 0.0 {
            continue;
        }
        for (c, &v) in q.iter_mut().zip(x) {
            *c = round_clamp((v - lo) / s0, nmax);
        }
        let (mut sw, mut sq, mut sqq, mut sx, mut sqx) = (0f32, 0f32, 0f32, 0f32, 0f32);
        for ((&c, &v), &wi) in q.iter().zip(x).zip(w) {
            let c = c as f32;
            sw += wi;
            sq += wi * c;
            sqq += wi * c * c;
            sx += wi * v;
            sqx += wi * c * v;
        }
        let det = sw * sqq - sq * sq;
        if det <= 0.0 {
            continue;
        }
        let s = (sw * sqx - sq * sx) / det;
        // the fitted offset is -m; a positive one (all values above zero) clamps to m = 0
        let mut m = -(sqq * sx - sq * sqx) / det;
        let s = if m < 0.0 {
            m = 0.0;
            if sqq > 0.0 { sqx / sqq } else { 0.0 }
        } else {
            s
        };
        if s <= 0.0 {
            continue;
        }
        let e = err(s, m);
        if e < best {
            (best, best_s, best_m) = (e, s, m);
        }
    }
    (best_s, best_m)
}

/// `v` scales (>= 0) as `d` times integers in `0..=levels`: (d, the integers).
fn super_scale(v: &[f32], levels: i32) -> (f16, Vec<u8>) {
    let max = v.iter().copied().fold(0f32, f32::max);
    if max <= 0.0 {
        return (f16::ZERO, vec![0; v.len()]);
    }
    let d = f16::from_f32(max / levels as f32);
    let inv = 1.0 / d.to_f32();
    (d, v.iter().map(|&s| round_clamp(s * inv, levels)).collect())
}

fn q4_k(x: &[f32], w: &[f32], out: &mut Vec<u8>) {
    let (mut s, mut m) = ([0f32; 8], [0f32; 8]);
    for j in 0..8 {
        (s[j], m[j]) = scale_min(&x[32 * j..32 * j + 32], &w[32 * j..32 * j + 32], 15);
    }
    let ((d, sc), (dmin, mn)) = (super_scale(&s, 63), super_scale(&m, 63));
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = sc[j] | (sc[j + 4] >> 4) << 6;
        packed[j + 4] = mn[j] | (mn[j + 4] >> 4) << 6;
        packed[j + 8] = (sc[j + 4] & 15) | (mn[j + 4] & 15) << 4;
    }
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    out.extend_from_slice(&packed);
    let codes = codes_of(x, &sc, &mn, d.to_f32(), dmin.to_f32(), 32, 15);
    // sub-blocks 2g and 2g + 1 share 32 bytes: the first in the low nibbles
    for g in 0..4 {
        out.extend((0..32).map(|l| codes[64 * g + l] | codes[64 * g + 32 + l] << 4));
    }
}

fn q2_k(x: &[f32], w: &[f32], out: &mut Vec<u8>) {
    let (mut s, mut m) = ([0f32; 16], [0f32; 16]);
    for j in 0..16 {
        (s[j], m[j]) = scale_min(&x[16 * j..16 * j + 16], &w[16 * j..16 * j + 16], 3);
    }
    let ((d, sc), (dmin, mn)) = (super_scale(&s, 15), super_scale(&m, 15));
    out.extend((0..16).map(|j| sc[j] | mn[j] << 4));
    let codes = codes_of(x, &sc, &mn, d.to_f32(), dmin.to_f32(), 16, 3);
    // value i: bits 2 ((i / 32) % 4) of byte 32 (i / 128) + i % 32
    for h in 0..2 {
        out.extend((0..32).map(|l| (0..4).fold(0u8, |b, s| b | codes[128 * h + 32 * s + l] << (2 * s))));
    }
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
}

/// Each value's code under its sub-block's stored scale and min (`len` values a sub-block).
fn codes_of(x: &[f32], sc: &[u8], mn: &[u8], d: f32, dmin: f32, len: usize, nmax: i32) -> Vec<u8> {
    let mut codes = vec![0u8; x.len()];
    for (j, (c, v)) in codes.chunks_exact_mut(len).zip(x.chunks_exact(len)).enumerate() {
        let (s, m) = (d * sc[j] as f32, dmin * mn[j] as f32);
        if s > 0.0 {
            for (c, &v) in c.iter_mut().zip(v) {
                *c = round_clamp((v + m) / s, nmax);
            }
        }
    }
    codes
}

/// The IQ4 codebook index nearest `v` (values in units of the scale).
fn nearest_iq4(v: f32) -> u8 {
    let mut best = 0;
    for (i, &k) in IQ4_VALUES.iter().enumerate() {
        if (v - k as f32).abs() < (v - IQ4_VALUES[best] as f32).abs() {
            best = i;
        }
    }
    best as u8
}

/// A sub-block's IQ4 scale (either sign: the codebook is not symmetric), the best of a search
/// around `max / 127`, each refined by least squares on its codes.
fn iq4_scale(x: &[f32], w: &[f32]) -> f32 {
    let amax = x.iter().copied().fold(0f32, |a, v| if v.abs() > a.abs() { v } else { a });
    if amax == 0.0 {
        return 0.0;
    }
    let err = |s: f32| -> f32 {
        x.iter().zip(w).map(|(&v, &wi)| wi * (s * IQ4_VALUES[nearest_iq4(v / s) as usize] as f32 - v).powi(2)).sum()
    };
    let (mut best_s, mut best) = (amax / -127.0, f32::INFINITY);
    for step in -10..=10 {
        let s0 = amax / (-127.0 + step as f32);
        let (mut num, mut den) = (0f32, 0f32);
        for (&v, &wi) in x.iter().zip(w) {
            let k = IQ4_VALUES[nearest_iq4(v / s0) as usize] as f32;
            num += wi * k * v;
            den += wi * k * k;
        }
        for s in [s0, if den > 0.0 { num / den } else { s0 }] {
            let e = err(s);
            if s != 0.0 && e < best {
                (best, best_s) = (e, s);
            }
        }
    }
    best_s
}

fn iq4_xs(x: &[f32], w: &[f32], out: &mut Vec<u8>) {
    let s: Vec<f32> = (0..8).map(|j| iq4_scale(&x[32 * j..32 * j + 32], &w[32 * j..32 * j + 32])).collect();
    // d (sc - 32) with sc in 0..=63: the largest scale in magnitude at -32
    let amax = s.iter().copied().fold(0f32, |a, v| if v.abs() > a.abs() { v } else { a });
    let d = f16::from_f32(-amax / 32.0);
    let dv = d.to_f32();
    let ls: Vec<u8> =
        s.iter().map(|&v| if dv == 0.0 { 32 } else { ((v / dv).round() as i32).clamp(-32, 31) + 32 } as u8).collect();
    out.extend_from_slice(&d.to_le_bytes());
    let high = (0..8).fold(0u16, |h, j| h | ((ls[j] >> 4) as u16) << (2 * j));
    out.extend_from_slice(&high.to_le_bytes());
    out.extend((0..4).map(|k| (ls[2 * k] & 15) | (ls[2 * k + 1] & 15) << 4));
    for j in 0..8 {
        let sj = dv * (ls[j] as i32 - 32) as f32;
        let q: Vec<u8> =
            x[32 * j..32 * j + 32].iter().map(|&v| if sj == 0.0 { 8 } else { nearest_iq4(v / sj) }).collect();
        out.extend((0..16).map(|l| q[l] | q[l + 16] << 4));
    }
}
