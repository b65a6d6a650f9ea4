//! Dot products of one weight row with one activation row, per format, per ISA tier.
//!
//! The quantized kernels compute each group's integer sum exactly and then combine the groups
//! with the same f32 operations in the same order on every tier, so a SIMD result is
//! bit-identical to the scalar one. The f32/bf16 kernels differ from the scalar reference only
//! by summation order.

use crate::act::QuantRow;
use crate::isa::Isa;
use crate::quant::{CHUNK, Q6_CHUNK_BYTES, ROW_BLOCK, bf16_to_f32, gather_row};

/// `a · b` in f32.
#[inline]
pub fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    dot_f32_streamed(isa, a, b, 0)
}

/// `a · b` where `a` is a weight row streamed from memory: the SIMD tiers also prefetch the
/// line `pf` bytes past each line of `a` they read ([`crate::prefetch`]; 0: not at all). Same
/// result as [`dot_f32`].
#[inline]
pub fn dot_f32_streamed(isa: Isa, a: &[f32], b: &[f32], pf: usize) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: the tier says AVX2 and FMA are present.
        return unsafe { avx2::dot_f32(a, b, pf) };
    }
    let _ = (isa, pf);
    scalar::dot_f32(a, b)
}

/// `out[t] = a · x[t]` for the rows `x[t]` of `x` (`[out.len(), a.len()]`): each the bits of
/// [`dot_f32`], four tokens at a time where the tier allows (one weight row against several
/// tokens: a prompt's router).
pub fn dot_f32_tokens(isa: Isa, a: &[f32], x: &[f32], out: &mut [f32]) {
    let c = a.len();
    debug_assert_eq!(x.len(), out.len() * c);
    let mut t = 0;
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        while t + 4 <= out.len() {
            let b: [&[f32]; 4] = std::array::from_fn(|k| &x[(t + k) * c..(t + k + 1) * c]);
            // SAFETY: the tier says AVX2 and FMA are present; every row as long as `a`
            out[t..t + 4].copy_from_slice(&unsafe { avx2::dot_f32_many(a, b) });
            t += 4;
        }
    }
    for (t, o) in out.iter_mut().enumerate().skip(t) {
        *o = dot_f32(isa, a, &x[t * c..(t + 1) * c]);
    }
}

/// `out[i stride + t] = w[i] · x[t]` for the rows `w[i]` of `w` (`[rows, c]`) and `x[t]` of
/// `x` (`[tokens, c]`): each the bits of [`dot_f32`]; AVX-512 register tiles of 4 rows x 4
/// tokens where the tier has them, else [`dot_f32_tokens`] row by row.
pub fn dot_f32_rows_tokens(isa: Isa, c: usize, w: &[f32], x: &[f32], out: &mut [f32], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && c > 0 {
        return rows_tokens_avx512(c, w, x, out, stride);
    }
    let (rows, tn) = rows_tokens_shape(c, w.len(), x.len(), out.len(), stride);
    for i in 0..rows {
        dot_f32_tokens(isa, &w[i * c..(i + 1) * c], x, &mut out[i * stride..i * stride + tn]);
    }
}

/// [`dot_f32_rows_tokens`] for bf16 rows (bits): each product the bits of [`dot_bf16`], so a
/// row gets the same bits whatever batch of tokens it is in.
pub fn dot_bf16_rows_tokens(isa: Isa, c: usize, w: &[u16], x: &[f32], out: &mut [f32], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && c > 0 {
        return rows_tokens_avx512(c, w, x, out, stride);
    }
    let (rows, tn) = rows_tokens_shape(c, w.len(), x.len(), out.len(), stride);
    for i in 0..rows {
        for t in 0..tn {
            out[i * stride + t] = dot_bf16(isa, &w[i * c..(i + 1) * c], &x[t * c..(t + 1) * c]);
        }
    }
}

/// Rows and tokens of a rows x tokens product, checked against the output's length.
fn rows_tokens_shape(c: usize, w: usize, x: usize, out: usize, stride: usize) -> (usize, usize) {
    let (rows, tn) = (w / c.max(1), x / c.max(1));
    assert!(
        w == rows * c && x == tn * c && (rows == 0 || tn == 0 || out >= (rows - 1) * stride + tn),
        "rows x tokens shapes"
    );
    (rows, tn)
}

/// The AVX-512 register tiles over every row and token (tiles of 4 x 4 and their edges).
#[cfg(target_arch = "x86_64")]
fn rows_tokens_avx512<W: avx512::Lanes>(c: usize, w: &[W], x: &[f32], out: &mut [f32], stride: usize) {
    use avx512::{TILE_ROWS as R, TILE_TOKENS as T, tile};
    let (rows, tn) = rows_tokens_shape(c, w.len(), x.len(), out.len(), stride);
    let mut i = 0;
    while i < rows {
        let (r_n, w) = ((rows - i).min(R), &w[i * c..]);
        let mut t = 0;
        while t < tn {
            let (t_n, x, o) = ((tn - t).min(T), &x[t * c..], &mut out[i * stride + t..]);
            // SAFETY: the caller checked the tier has AVX-512 F (and so AVX2 and FMA); the
            // tile's rows and tokens lie inside `w`, `x`, and its products inside `out`
            // (checked above)
            unsafe {
                match (r_n, t_n) {
                    (R, T) => tile::<W, R, T>(c, w, x, o, stride),
                    (R, _) => (0..t_n).for_each(|k| tile::<W, R, 1>(c, w, &x[k * c..], &mut o[k..], stride)),
                    (_, T) => (0..r_n).for_each(|k| tile::<W, 1, T>(c, &w[k * c..], x, &mut o[k * stride..], stride)),
                    _ => (0..r_n).for_each(|k| {
                        (0..t_n).for_each(|j| {
                            tile::<W, 1, 1>(c, &w[k * c..], &x[j * c..], &mut o[k * stride + j..], stride)
                        })
                    }),
                }
            }
            t += t_n;
        }
        i += r_n;
    }
}

/// `w · x` with `w` in bf16 bits.
#[inline]
pub fn dot_bf16(isa: Isa, w: &[u16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: as above.
        return unsafe { avx2::dot_bf16(w, x) };
    }
    let _ = isa;
    scalar::dot_bf16(w, x)
}

/// `w · a` with `w` a q8 row (`wq`, `wd` scales) and `a` quantized with the same group.
#[inline]
pub fn dot_q8(isa: Isa, wq: &[i8], wd: &[f32], a: QuantRow<'_>) -> f32 {
    debug_assert_eq!(wq.len(), a.q.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && a.group.is_multiple_of(32) {
        // SAFETY: as above; the group is a whole number of 32-byte vectors.
        return unsafe { avx2::dot_q8(wq, wd, a) };
    }
    let _ = isa;
    scalar::dot_q8(wq, wd, a)
}

/// `w · a` with `w` a q4 row (`q4_lohi32` layout) and `a` quantized with the same group.
#[inline]
pub fn dot_q4(isa: Isa, wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
    debug_assert_eq!(wq.len() * 2, a.q.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && a.group.is_multiple_of(32) {
        // SAFETY: as above; every block is 32 values (16 bytes).
        return unsafe { avx2::dot_q4(wq, wd, a) };
    }
    let _ = isa;
    scalar::dot_q4(wq, wd, a)
}

/// `w · a` with `w` an MXFP4 row (`mxfp4_ggml` blocks) and `a` quantized in groups of 32.
#[inline]
pub fn dot_mxfp4(isa: Isa, w: &[u8], a: QuantRow<'_>) -> f32 {
    debug_assert!(a.group == crate::mxfp4::BLOCK && w.len() / crate::mxfp4::BLOCK_BYTES * 32 == a.q.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: as above; the row is whole blocks, one activation group each.
        return unsafe { avx2::dot_mxfp4(w, a) };
    }
    let _ = isa;
    scalar::dot_mxfp4(w, a)
}

/// The four accumulators of an MXFP4 dot product summed lane by lane, `(0 + 1) + (2 + 3)`,
/// then the 8 lanes pairwise: `l + (l + 4)`, then `l + (l + 2)`, then the two. Every tier ends
/// with this, on the lanes it stored.
#[inline]
pub(crate) fn mxfp4_reduce(acc: [[f32; 8]; 4]) -> f32 {
    let mut v = [0f32; 8];
    for l in 0..8 {
        v[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    }
    let q = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (q[0] + q[2]) + (q[1] + q[3])
}

/// `w · a` with `w` a q6 row (`q6_lo4hi2` layout) and `a` quantized with the same group.
#[inline]
pub fn dot_q6(isa: Isa, wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
    debug_assert_eq!(wq.len() / 96 * 128, a.q.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && (a.group.is_multiple_of(128) || a.group == 16) {
        // SAFETY: as above; groups are whole 128-value chunks, or 8 to a chunk.
        return unsafe { avx2::dot_q6(wq, wd, a) };
    }
    let _ = isa;
    scalar::dot_q6(wq, wd, a)
}

/// Rows `0..4` of one block of a row-interleaved q4 matrix (`q4_lohi32_x4`; `six`: q6,
/// `q6_lo4hi2_x4`): `block` is the block's bytes (4 rows), `wd` its rows' scales one row after
/// another. Each value is what [`dot_q4`] / [`dot_q6`] give for that row at this tier, bit for bit
/// (AVX2 reads the block in order; the scalar reference gathers each row). `pf`: how far ahead
/// the SIMD tiers prefetch the block's stream ([`crate::prefetch`]; 0: not at all).
pub fn dot_x4(isa: Isa, six: bool, block: &[u8], wd: &[f32], a: QuantRow<'_>, pf: usize) -> [f32; 4] {
    let ng = wd.len() / ROW_BLOCK;
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && a.group.is_multiple_of(if six { 128 } else { 32 }) {
        // SAFETY: AVX2 and FMA were detected; the block holds 4 rows of a.q.len() values; every
        // block is 32 values (q6: groups of whole chunks)
        return unsafe {
            if six { avx2::dot_x4::<true>(block, wd, a, pf) } else { avx2::dot_x4::<false>(block, wd, a, pf) }
        };
    }
    let cb = if six { Q6_CHUNK_BYTES } else { CHUNK / 2 };
    let mut row = vec![0u8; block.len() / ROW_BLOCK];
    std::array::from_fn(|i| {
        gather_row(block, i, cb, (false, false), &mut row);
        let wd = &wd[i * ng..(i + 1) * ng];
        if six { dot_q6(isa, &row, wd, a) } else { dot_q4(isa, &row, wd, a) }
    })
}

/// [`dot_x4`] of a q4 block for two tokens at once (prefill): on AVX2 the block's nibbles are
/// decoded once for both. Each value is the one [`dot_x4`] gives, bit for bit.
pub fn dot_x4_q4_pair(isa: Isa, block: &[u8], wd: &[f32], a0: QuantRow<'_>, a1: QuantRow<'_>) -> [[f32; 4]; 2] {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && a0.group.is_multiple_of(32) && a0.group == a1.group && a0.q.len() == a1.q.len() {
        // SAFETY: as dot_x4's, for both rows of activations
        return unsafe { avx2::dot_x4_q4_pair(block, wd, a0, a1) };
    }
    [dot_x4(isa, false, block, wd, a0, 0), dot_x4(isa, false, block, wd, a1, 0)]
}

/// The reference kernels.
pub mod scalar {
    use super::*;
    use crate::quant::q6_value;

    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        // eight partial sums: the order the SIMD kernels use, and what lets the compiler
        // vectorize this loop on its own
        let mut acc = [0f32; 8];
        let n8 = a.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            for l in 0..8 {
                acc[l] += a[i + l] * b[i + l];
            }
        }
        let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for i in n8..a.len() {
            s += a[i] * b[i];
        }
        s
    }

    pub fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
        let mut acc = [0f32; 8];
        let n8 = w.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            for l in 0..8 {
                acc[l] += bf16_to_f32(w[i + l]) * x[i + l];
            }
        }
        let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for i in n8..w.len() {
            s += bf16_to_f32(w[i]) * x[i];
        }
        s
    }

    pub fn dot_q8(wq: &[i8], wd: &[f32], a: QuantRow<'_>) -> f32 {
        let g = a.group;
        let mut acc = 0f32;
        for gi in 0..wd.len() {
            let mut isum = 0i32;
            for j in gi * g..(gi + 1) * g {
                isum += wq[j] as i32 * a.q[j] as i32;
            }
            acc += isum as f32 * (wd[gi] * a.scales[gi]);
        }
        acc
    }

    pub fn dot_q4(wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
        let g = a.group;
        let mut acc = 0f32;
        // blocks of B values: byte j holds value j (low nibble) and value j + B/2 (high)
        let block = g.min(32);
        let half = block / 2;
        for gi in 0..wd.len() {
            let mut isum = 0i32;
            for b in 0..g / block {
                let base = gi * g + b * block;
                let bytes = &wq[base / 2..base / 2 + half];
                let x = &a.q[base..base + block];
                for j in 0..half {
                    let lo = (bytes[j] & 0x0F) as i32 - 8;
                    let hi = (bytes[j] >> 4) as i32 - 8;
                    isum += lo * x[j] as i32 + hi * x[j + half] as i32;
                }
            }
            acc += isum as f32 * (wd[gi] * a.scales[gi]);
        }
        acc
    }

    /// The SIMD tiers' order, value for value: each block's doubled codes times the
    /// activations in 8 exact integer sums of 4 consecutive values (a vector's lanes), each
    /// fused-multiply-added with `2^(e - 128) * activation scale` into lane `l` of accumulator
    /// `block % 4`; then [`super::mxfp4_reduce`].
    pub fn dot_mxfp4(w: &[u8], a: QuantRow<'_>) -> f32 {
        use crate::mxfp4::{BLOCK_BYTES, E2M1_X2, half_scale};
        let mut acc = [[0f32; 8]; 4];
        for (gi, b) in w.chunks_exact(BLOCK_BYTES).enumerate() {
            let x = &a.q[gi * 32..(gi + 1) * 32];
            let code = |i: usize| if i < 16 { b[1 + i] & 0x0F } else { b[1 + i - 16] >> 4 };
            let s = half_scale(b[0]) * a.scales[gi];
            for (l, lane) in acc[gi % 4].iter_mut().enumerate() {
                let isum: i32 = (4 * l..4 * l + 4).map(|i| E2M1_X2[code(i) as usize] as i32 * x[i] as i32).sum();
                *lane = (isum as f32).mul_add(s, *lane);
            }
        }
        super::mxfp4_reduce(acc)
    }

    pub fn dot_q6(wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
        let g = a.group;
        let mut acc = 0f32;
        for gi in 0..wd.len() {
            let isum: i32 = (gi * g..(gi + 1) * g).map(|j| q6_value(wq, j) * a.q[j] as i32).sum();
            acc += isum as f32 * (wd[gi] * a.scales[gi]);
        }
        acc
    }
}

/// The AVX2 + FMA forms (the AVX-512 tiles of whole matrices are in `mat/avx512.rs`).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
/// f32 rows x tokens in AVX-512 register tiles, each product the AVX2 dot's bits.
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::QuantAct;
    use crate::quant::{GROUPS, f32_to_bf16, q4_value, q6_value, quantize_q4_row, quantize_q6_row, quantize_q8_row};

    fn rnd(seed: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// f64 brute force of what the integer kernels compute from the quantized values, and the
    /// bound on the scalar kernel's rounding error derived for its order of operations: per
    /// group an exact integer sum (asserted to convert to f32 exactly), `wd * as` (one rounding),
    /// the product with the sum (one) and the running sum (one per group after the first), so
    /// each term is off by at most (1 + u)^(ng + 1) - 1 <= gamma(ng + 1) of its magnitude
    /// (Higham, Accuracy and Stability of Numerical Algorithms, 3.1 and 4.2).
    fn brute_q(wv: &[i32], wd: &[f32], a: &QuantAct, g: usize) -> (f64, f64) {
        let r = a.row(0);
        let (mut sum, mut mag) = (0f64, 0f64);
        for gi in 0..wd.len() {
            let s: i64 = (gi * g..(gi + 1) * g).map(|j| wv[j] as i64 * r.q[j] as i64).sum();
            assert!(s.abs() < 1 << 24, "a group's integer sum {s} is not exact in f32");
            let t = s as f64 * wd[gi] as f64 * r.scales[gi] as f64;
            sum += t;
            mag += t.abs();
        }
        (sum, gamma(wd.len() + 1) * mag)
    }

    /// gamma(k) = k u / (1 - k u), u = 2^-24: the relative error bound of k f32 roundings.
    fn gamma(k: usize) -> f64 {
        let ku = k as f64 * f64::powi(2.0, -24);
        ku / (1.0 - ku)
    }

    #[test]
    fn float_kernels_match_f64_on_awkward_sizes() {
        let mut s = 3;
        for isa in Isa::available() {
            for n in [1, 7, 8, 15, 16, 17, 31, 33, 100, 257, 1000] {
                let a = rnd(&mut s, n);
                let b = rnd(&mut s, n);
                let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
                let got = dot_f32(isa, &a, &b);
                assert!((got as f64 - exact).abs() <= 1e-5 * (1.0 + n as f64).sqrt(), "{isa} n={n}");
                for pf in [64, 4096] {
                    let streamed = dot_f32_streamed(isa, &a, &b, pf);
                    assert_eq!(streamed.to_bits(), got.to_bits(), "{isa} n={n}: prefetching {pf} B ahead");
                }
                let wb: Vec<u16> = a.iter().map(|v| f32_to_bf16(*v)).collect();
                let exact: f64 = wb.iter().zip(&b).map(|(w, y)| bf16_to_f32(*w) as f64 * *y as f64).sum();
                let got = dot_bf16(isa, &wb, &b) as f64;
                assert!((got - exact).abs() <= 1e-5 * (1.0 + n as f64).sqrt(), "{isa} bf16 n={n}");
            }
        }
    }

    #[test]
    fn quantized_kernels_are_bit_identical_across_tiers() {
        let mut s = 11;
        for g in GROUPS {
            for ngroups in [1, 2, 3, 5, 16] {
                let k = g * ngroups;
                let w = rnd(&mut s, k);
                let x: Vec<f32> = rnd(&mut s, k).iter().map(|v| v * 4.0).collect();
                let mut a = QuantAct::default();
                a.quantize(&x, k, g, Isa::detect());
                let mut q8 = vec![0i8; k];
                let mut d8 = vec![0f32; ngroups];
                quantize_q8_row(&w, g, &mut q8, &mut d8);
                let mut q4 = vec![0u8; k / 2];
                let mut d4 = vec![0f32; ngroups];
                quantize_q4_row(&w, g, &mut q4, &mut d4);
                let ref8 = scalar::dot_q8(&q8, &d8, a.row(0));
                let ref4 = scalar::dot_q4(&q4, &d4, a.row(0));
                let v8: Vec<i32> = q8.iter().map(|v| *v as i32).collect();
                let v4: Vec<i32> = (0..ngroups)
                    .flat_map(|gi| {
                        let qg = &q4[gi * g / 2..(gi + 1) * g / 2];
                        (0..g).map(move |j| q4_value(qg, g, j))
                    })
                    .collect();
                let (b8, tol8) = brute_q(&v8, &d8, &a, g);
                let (b4, tol4) = brute_q(&v4, &d4, &a, g);
                assert!((ref8 as f64 - b8).abs() <= tol8, "q8 g={g}: {ref8} vs {b8} (bound {tol8:e})");
                assert!((ref4 as f64 - b4).abs() <= tol4, "q4 g={g}: {ref4} vs {b4} (bound {tol4:e})");
                for isa in Isa::available() {
                    assert_eq!(dot_q8(isa, &q8, &d8, a.row(0)).to_bits(), ref8.to_bits(), "{isa} q8 g={g}");
                    assert_eq!(dot_q4(isa, &q4, &d4, a.row(0)).to_bits(), ref4.to_bits(), "{isa} q4 g={g}");
                }
            }
        }
    }

    #[test]
    fn q6_kernels_match_brute_force_bit_identically_across_tiers() {
        let mut s = 23;
        // groups of whole chunks, and of 16 (8 to a chunk: GGUF's Q6_K)
        for g in [128, 256, 16] {
            let counts: &[usize] = if g == 16 { &[8, 16, 56] } else { &[1, 2, 3, 7] };
            for &ngroups in counts {
                let k = g * ngroups;
                let w = rnd(&mut s, k);
                let x: Vec<f32> = rnd(&mut s, k).iter().map(|v| v * 4.0).collect();
                let mut a = QuantAct::default();
                a.quantize(&x, k, g, Isa::detect());
                let mut q6 = vec![0u8; k / 128 * 96];
                let mut d6 = vec![0f32; ngroups];
                quantize_q6_row(&w, g, &mut q6, &mut d6);
                let v6: Vec<i32> = (0..k).map(|j| q6_value(&q6, j)).collect();
                let (want, tol) = brute_q(&v6, &d6, &a, g);
                let got = scalar::dot_q6(&q6, &d6, a.row(0));
                assert!((got as f64 - want).abs() <= tol, "g={g}: {got} vs {want} (bound {tol:e})");
                for isa in Isa::available() {
                    assert_eq!(dot_q6(isa, &q6, &d6, a.row(0)).to_bits(), got.to_bits(), "{isa} q6 g={g}");
                }
            }
        }
        // every weight at +31 and -32 against int8 extremes: the largest pair sums
        for (wv, xv) in [(31.0f32, 1.0f32), (-32.0, -1.0)] {
            let w = vec![wv; 128];
            let mut q6 = vec![0u8; 96];
            let mut d6 = vec![0f32; 1];
            quantize_q6_row(&w, 128, &mut q6, &mut d6);
            let mut a = QuantAct::default();
            a.quantize(&vec![xv; 128], 128, 128, Isa::detect());
            let want = (wv * xv * 128.0) as f64;
            for isa in Isa::available() {
                let got = dot_q6(isa, &q6, &d6, a.row(0)) as f64;
                assert!((got - want).abs() <= 1e-4 * want.abs(), "{isa}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn mxfp4_kernels_match_brute_force_bit_identically_across_tiers() {
        use crate::mxfp4::{BLOCK_BYTES, E2M1_X2, half_scale, quantize_row};
        let mut s = 29;
        // odd and even counts (the AVX-512 kernel takes blocks in pairs), 8 rows of each
        for blocks in [1, 2, 3, 5, 90, 91].into_iter().flat_map(|b| [b; 8]) {
            let k = 32 * blocks;
            // scales far apart block to block, so the per-block float step matters
            let w: Vec<f32> =
                rnd(&mut s, k).iter().enumerate().map(|(i, v)| v * 4f32.powi((i / 32 % 5) as i32 - 2)).collect();
            let x: Vec<f32> = rnd(&mut s, k).iter().map(|v| v * 4.0).collect();
            let mut a = QuantAct::default();
            a.quantize(&x, k, 32, Isa::detect());
            let mut q = vec![0u8; blocks * BLOCK_BYTES];
            quantize_row(&w, &mut q);
            // the doubled codes as integers, the half scales as the groups' scales
            let codes: Vec<i32> = q
                .chunks_exact(BLOCK_BYTES)
                .flat_map(|b| {
                    let lo = b[1..].iter().map(|&c| E2M1_X2[(c & 15) as usize] as i32);
                    let hi = b[1..].iter().map(|&c| E2M1_X2[(c >> 4) as usize] as i32);
                    lo.chain(hi).collect::<Vec<_>>()
                })
                .collect();
            let d: Vec<f32> = q.chunks_exact(BLOCK_BYTES).map(|b| half_scale(b[0])).collect();
            let (want, _) = brute_q(&codes, &d, &a, 32);
            // the lane order rounds each lane's term (4 values' exact sum times the scales):
            // the scales' product, the fused add into its accumulator (a chain of blocks / 4),
            // then 2 + 3 levels of the reduction; gamma(blocks + 8) of the lanes' magnitudes
            let r = a.row(0);
            let lanes: f64 = (0..blocks * 8)
                .map(|l| {
                    let isum: i64 = (4 * l..4 * l + 4).map(|j| codes[j] as i64 * r.q[j] as i64).sum();
                    (isum as f64 * d[l / 8] as f64 * r.scales[l / 8] as f64).abs()
                })
                .sum();
            let tol = gamma(blocks + 8) * lanes;
            let got = scalar::dot_mxfp4(&q, a.row(0));
            assert!((got as f64 - want).abs() <= tol, "{blocks} blocks: {got} vs {want} (bound {tol:e})");
            for isa in Isa::available() {
                assert_eq!(dot_mxfp4(isa, &q, a.row(0)).to_bits(), got.to_bits(), "{isa} mxfp4, {blocks} blocks");
            }
        }
        // every code at its largest against int8 extremes: the largest pair sums
        for (wv, xv) in [(6.0f32, 1.0f32), (-6.0, 1.0), (6.0, -1.0)] {
            let mut q = vec![0u8; BLOCK_BYTES];
            quantize_row(&[wv; 32], &mut q);
            let mut a = QuantAct::default();
            a.quantize(&[xv; 32], 32, 32, Isa::detect());
            let want = (wv * xv * 32.0) as f64;
            for isa in Isa::available() {
                let got = dot_mxfp4(isa, &q, a.row(0)) as f64;
                assert!((got - want).abs() <= 1e-4 * want.abs(), "{isa}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn extreme_int8_values_do_not_overflow() {
        // all +127 / -127: the maddubs pair sums sit at their largest
        for g in [32, 128] {
            let q8 = vec![-127i8; g];
            let d8 = vec![1.0f32];
            let x = vec![-1.0f32; g];
            let mut a = QuantAct::default();
            a.quantize(&x, g, g, Isa::detect());
            let want = (127 * 127 * g) as f32 * (1.0 / 127.0);
            for isa in Isa::available() {
                let got = dot_q8(isa, &q8, &d8, a.row(0));
                assert!((got - want).abs() <= want * 1e-6, "{isa}: {got} vs {want}");
            }
        }
    }
}
