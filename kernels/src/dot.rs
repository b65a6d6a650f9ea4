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

/// `w · a` with `w` a q6 row (`q6_lo4hi2` layout) and `a` quantized with the same group.
#[inline]
pub fn dot_q6(isa: Isa, wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
    debug_assert_eq!(wq.len() / 96 * 128, a.q.len());
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: as above; groups are whole 128-value chunks (the format's rule).
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
    if isa.has_avx2() && a.group.is_multiple_of(32) {
        // SAFETY: AVX2 and FMA were detected; the block holds 4 rows of a.q.len() values; every
        // block is 32 values (q6 groups are whole chunks)
        return unsafe {
            if six { avx2::dot_x4::<true>(block, wd, a, pf) } else { avx2::dot_x4::<false>(block, wd, a, pf) }
        };
    }
    let cb = if six { Q6_CHUNK_BYTES } else { CHUNK / 2 };
    let mut row = vec![0u8; block.len() / ROW_BLOCK];
    std::array::from_fn(|i| {
        gather_row(block, i, cb, &mut row);
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
mod avx2 {
    use super::*;
    use crate::quant::interleaved_offset;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum_ps(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum_epi32(v: __m256i) -> i32 {
        let lo = _mm256_castsi256_si128(v);
        let hi = _mm256_extracti128_si256(v, 1);
        let s = _mm_add_epi32(lo, hi);
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32], pf: usize) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: every load reads 8 floats below n; a prefetch never faults.
        unsafe {
            while i + 16 <= n {
                if pf != 0 {
                    // 16 floats: one 64-byte line of `a` a step
                    crate::prefetch::line(pa.add(i).cast(), pf);
                }
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), _mm256_loadu_ps(pb.add(i + 8)), acc1);
                i += 16;
            }
            if i + 8 <= n {
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
                i += 8;
            }
        }
        let mut s = hsum_ps(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
        let n = w.len();
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: every load reads 8 values below n.
        unsafe {
            while i + 16 <= n {
                let w0 = _mm256_cvtepu16_epi32(_mm_loadu_si128(pw.add(i) as *const __m128i));
                let w1 = _mm256_cvtepu16_epi32(_mm_loadu_si128(pw.add(i + 8) as *const __m128i));
                let f0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
                let f1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
                acc0 = _mm256_fmadd_ps(f0, _mm256_loadu_ps(px.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(f1, _mm256_loadu_ps(px.add(i + 8)), acc1);
                i += 16;
            }
            if i + 8 <= n {
                let w0 = _mm256_cvtepu16_epi32(_mm_loadu_si128(pw.add(i) as *const __m128i));
                let f0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
                acc0 = _mm256_fmadd_ps(f0, _mm256_loadu_ps(px.add(i)), acc0);
                i += 8;
            }
        }
        let mut s = hsum_ps(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += bf16_to_f32(w[i]) * x[i];
            i += 1;
        }
        s
    }

    /// Signed int8 x signed int8, 32 lanes -> 8 x i32 (maddubs needs an unsigned operand:
    /// |w| times a with w's sign moved onto a).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn mul_i8_pairs(w: __m256i, a: __m256i) -> __m256i {
        let aw = _mm256_sign_epi8(w, w);
        let sa = _mm256_sign_epi8(a, w);
        _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), _mm256_set1_epi16(1))
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_q8(wq: &[i8], wd: &[f32], a: QuantRow<'_>) -> f32 {
        let g = a.group;
        let mut acc = 0f32;
        for gi in 0..wd.len() {
            let mut v = _mm256_setzero_si256();
            let base = gi * g;
            let mut j = 0;
            while j < g {
                // SAFETY: base + j + 32 <= (gi + 1) * g <= len.
                let (w, x) = unsafe {
                    (
                        _mm256_loadu_si256(wq.as_ptr().add(base + j) as *const __m256i),
                        _mm256_loadu_si256(a.q.as_ptr().add(base + j) as *const __m256i),
                    )
                };
                v = _mm256_add_epi32(v, mul_i8_pairs(w, x));
                j += 32;
            }
            acc += hsum_epi32(v) as f32 * (wd[gi] * a.scales[gi]);
        }
        acc
    }

    /// One 32-value block of `q4_lohi32` (16 bytes at `p`) as 32 unsigned values in `[0, 15]`:
    /// the 16 bytes in both halves of a register (one broadcast load), the upper half shifted
    /// down 4 bits (a per-lane shift of whole 32-bit words: the bits that cross into a byte's
    /// high nibble are masked off with it), 3 instructions where splitting and joining halves
    /// took 5.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn q4_block(p: *const u8) -> __m256i {
        // SAFETY: the caller's 16 bytes
        let b = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(p as *const __m128i) });
        _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0)), _mm256_set1_epi8(0x0F))
    }

    /// Block `b` (0..4) of the q6 chunk at `p` (96 bytes) as 32 unsigned values in `[0, 63]`:
    /// its low-nibble values sit at load positions `16 b..`, so their high bits are field `b / 2`
    /// of high bytes `16 (b % 2)..`, and its high-nibble values' field `2 + b / 2`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn q6_block(p: *const u8, b: usize) -> __m256i {
        let mask = _mm_set1_epi8(0x0F);
        let two = _mm_set1_epi8(0x03);
        // SAFETY: the caller's chunk of 96 bytes
        let (lob, hib) = unsafe {
            (
                _mm_loadu_si128(p.add(b * 16) as *const __m128i),
                _mm_loadu_si128(p.add(64 + (b % 2) * 16) as *const __m128i),
            )
        };
        let f = _mm_cvtsi32_si128(2 * (b / 2) as i32);
        let fh = _mm_cvtsi32_si128(2 * (2 + b / 2) as i32);
        let hl = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hib, f), two), 4);
        let hh = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hib, fh), two), 4);
        let lo = _mm_or_si128(_mm_and_si128(lob, mask), hl);
        let hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(lob, 4), mask), hh);
        _mm256_set_m128i(hi, lo)
    }

    // q4_pairs_fit: a maddubs pair of q4 values (0..15) and int8 activations is at most
    // 2 * 15 * 128 = 3840 in magnitude, so the 16-bit sums of up to 8 blocks (a group of 256)
    // cannot saturate; q4 groups are at most 128. q6 pairs reach 2 * 63 * 128 and widen per
    // block.
    const _: () = assert!(8 * 2 * 15 * 128 <= i16::MAX as i32);

    /// `v + sum n * x` over pairs and quads of the 32 unsigned values `n` and activations `x`
    /// (q6: a maddubs pair is at most 2 * 63 * 127, no saturation).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn block_dot(v: __m256i, n: __m256i, x: __m256i) -> __m256i {
        _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(n, x), _mm256_set1_epi16(1)))
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_q4(wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
        let g = a.group;
        let mut acc = 0f32;
        for gi in 0..wd.len() {
            // a group's pairs summed in 16 bits (q4_pairs_fit), widened once
            let mut v16 = _mm256_setzero_si256();
            let mut j = gi * g;
            while j < (gi + 1) * g {
                // SAFETY: 16 weight bytes hold values j..j+32, all inside the row.
                let (n, x) = unsafe {
                    (q4_block(wq.as_ptr().add(j / 2)), _mm256_loadu_si256(a.q.as_ptr().add(j) as *const __m256i))
                };
                v16 = _mm256_add_epi16(v16, _mm256_maddubs_epi16(n, x));
                j += 32;
            }
            let v = _mm256_madd_epi16(v16, _mm256_set1_epi16(1));
            let isum = hsum_epi32(v) - 8 * a.sums[gi];
            acc += isum as f32 * (wd[gi] * a.scales[gi]);
        }
        acc
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_q6(wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
        let g = a.group;
        let mut acc = 0f32;
        for gi in 0..wd.len() {
            let mut v = _mm256_setzero_si256();
            for ch in 0..g / 128 {
                let at = (gi * g / 128 + ch) * 96;
                for b in 0..4 {
                    let x0 = gi * g + ch * 128 + b * 32;
                    // SAFETY: the chunk's 96 bytes and the block's 32 activations are in the row
                    let (n, x) = unsafe {
                        (q6_block(wq.as_ptr().add(at), b), _mm256_loadu_si256(a.q.as_ptr().add(x0) as *const __m256i))
                    };
                    v = block_dot(v, n, x);
                }
            }
            let isum = hsum_epi32(v) - 32 * a.sums[gi];
            acc += isum as f32 * (wd[gi] * a.scales[gi]);
        }
        acc
    }

    /// `dot_q4` / `dot_q6` (`SIX`) of the 4 rows of an interleaved block at once, reading the
    /// block's bytes in order: per group, each row's int32 lanes, the four summed together
    /// (exact), then per lane the same f32 operations in the same order as the one-row kernels.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_x4<const SIX: bool>(block: &[u8], wd: &[f32], a: QuantRow<'_>, pf: usize) -> [f32; 4] {
        let g = a.group;
        let ng = a.q.len() / g;
        let cb = if SIX { Q6_CHUNK_BYTES } else { CHUNK / 2 };
        let rb = a.q.len() / CHUNK * cb;
        let bias = _mm_set1_epi32(if SIX { 32 } else { 8 });
        let mut acc = _mm_setzero_ps();
        for gi in 0..ng {
            let mut v = [_mm256_setzero_si256(); 4];
            // q4: each row's pairs summed in 16 bits over the group (q4_pairs_fit), widened once
            let mut v16 = [_mm256_setzero_si256(); 4];
            let mut j = gi * g;
            while j < (gi + 1) * g {
                // SAFETY: values j..j + 32 of the activations and of each row's chunk j / 128
                let x = unsafe { _mm256_loadu_si256(a.q.as_ptr().add(j) as *const __m256i) };
                for i in 0..4 {
                    let p = unsafe { block.as_ptr().add(interleaved_offset(i, j / CHUNK, rb, cb)) };
                    if pf != 0 && j.is_multiple_of(CHUNK) {
                        // once per row chunk (64 bytes; q6: 96)
                        crate::prefetch::line(p, pf);
                        if SIX {
                            crate::prefetch::line(p, pf + 64);
                        }
                    }
                    if SIX {
                        v[i] = block_dot(v[i], unsafe { q6_block(p, (j % CHUNK) / 32) }, x);
                    } else {
                        let n = unsafe { q4_block(p.add((j % CHUNK) / 2)) };
                        v16[i] = _mm256_add_epi16(v16[i], _mm256_maddubs_epi16(n, x));
                    }
                }
                j += 32;
            }
            if !SIX {
                for i in 0..4 {
                    v[i] = _mm256_madd_epi16(v16[i], _mm256_set1_epi16(1));
                }
            }
            acc = fold_group(acc, &v, bias, wd, gi, ng, a);
        }
        let mut out = [0f32; 4];
        // SAFETY: 4 floats into a 4-float array
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }

    /// `acc + (the four rows' sums of group gi - bias * the activations' sum) * scales`, lane i
    /// for row i: the one sequence of f32 operations every caller of a block uses.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn fold_group(
        acc: __m128,
        v: &[__m256i; 4],
        bias: __m128i,
        wd: &[f32],
        gi: usize,
        ng: usize,
        a: QuantRow<'_>,
    ) -> __m128 {
        let h = |v: __m256i| _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_hadd_epi32(_mm_hadd_epi32(h(v[0]), h(v[1])), _mm_hadd_epi32(h(v[2]), h(v[3])));
        let isum = _mm_sub_epi32(s, _mm_mullo_epi32(bias, _mm_set1_epi32(a.sums[gi])));
        let w = _mm_set_ps(wd[3 * ng + gi], wd[2 * ng + gi], wd[ng + gi], wd[gi]);
        _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(w, _mm_set1_ps(a.scales[gi]))))
    }

    /// [`dot_x4`] (q4) for two tokens: each 32-value block of the 4 rows decoded once and
    /// multiplied with both tokens' activations (prefill decoded the block again per token).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_x4_q4_pair(block: &[u8], wd: &[f32], a0: QuantRow<'_>, a1: QuantRow<'_>) -> [[f32; 4]; 2] {
        let g = a0.group;
        let ng = a0.q.len() / g;
        let cb = CHUNK / 2;
        let rb = a0.q.len() / CHUNK * cb;
        let bias = _mm_set1_epi32(8);
        let (mut acc0, mut acc1) = (_mm_setzero_ps(), _mm_setzero_ps());
        for gi in 0..ng {
            // each row's pairs summed in 16 bits over the group (q4_pairs_fit)
            let (mut v0, mut v1) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            let mut j = gi * g;
            while j < (gi + 1) * g {
                // SAFETY: values j..j + 32 of both activation rows and of each row's chunk j / 128
                let (x0, x1) = unsafe {
                    (
                        _mm256_loadu_si256(a0.q.as_ptr().add(j) as *const __m256i),
                        _mm256_loadu_si256(a1.q.as_ptr().add(j) as *const __m256i),
                    )
                };
                for i in 0..4 {
                    let n = unsafe {
                        q4_block(block.as_ptr().add(interleaved_offset(i, j / CHUNK, rb, cb) + (j % CHUNK) / 2))
                    };
                    v0[i] = _mm256_add_epi16(v0[i], _mm256_maddubs_epi16(n, x0));
                    v1[i] = _mm256_add_epi16(v1[i], _mm256_maddubs_epi16(n, x1));
                }
                j += 32;
            }
            let ones = _mm256_set1_epi16(1);
            let w0 = [0, 1, 2, 3].map(|i| _mm256_madd_epi16(v0[i], ones));
            let w1 = [0, 1, 2, 3].map(|i| _mm256_madd_epi16(v1[i], ones));
            acc0 = fold_group(acc0, &w0, bias, wd, gi, ng, a0);
            acc1 = fold_group(acc1, &w1, bias, wd, gi, ng, a1);
        }
        let mut out = [[0f32; 4]; 2];
        // SAFETY: 4 floats into each 4-float array
        unsafe {
            _mm_storeu_ps(out[0].as_mut_ptr(), acc0);
            _mm_storeu_ps(out[1].as_mut_ptr(), acc1);
        }
        out
    }
}

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

    /// f64 brute force of what the integer kernels compute from the quantized values.
    fn brute_q(wv: &[i32], wd: &[f32], a: &QuantAct, g: usize) -> f64 {
        let r = a.row(0);
        (0..wd.len())
            .map(|gi| {
                let s: i64 = (gi * g..(gi + 1) * g).map(|j| wv[j] as i64 * r.q[j] as i64).sum();
                s as f64 * wd[gi] as f64 * r.scales[gi] as f64
            })
            .sum()
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
                let tol = |x: f64| 1e-5 * (1.0 + x.abs());
                let b8 = brute_q(&v8, &d8, &a, g);
                let b4 = brute_q(&v4, &d4, &a, g);
                assert!((ref8 as f64 - b8).abs() <= tol(b8), "q8 g={g}");
                assert!((ref4 as f64 - b4).abs() <= tol(b4), "q4 g={g}");
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
        for g in [128, 256] {
            for ngroups in [1, 2, 3, 7] {
                let k = g * ngroups;
                let w = rnd(&mut s, k);
                let x: Vec<f32> = rnd(&mut s, k).iter().map(|v| v * 4.0).collect();
                let mut a = QuantAct::default();
                a.quantize(&x, k, g, Isa::detect());
                let mut q6 = vec![0u8; k / 128 * 96];
                let mut d6 = vec![0f32; ngroups];
                quantize_q6_row(&w, g, &mut q6, &mut d6);
                let v6: Vec<i32> = (0..k).map(|j| q6_value(&q6, j)).collect();
                let want = brute_q(&v6, &d6, &a, g);
                let got = scalar::dot_q6(&q6, &d6, a.row(0));
                assert!((got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "g={g}: {got} vs {want}");
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
