//! The AVX2 + FMA forms of the dot products (the AVX-512 tiles of whole matrices are in
//! `mat/avx512.rs`): the same integer sums and the same f32 operations in the same order as the
//! scalar reference, so the same bits.

use super::*;
use crate::quant::interleaved_offset;
use std::arch::x86_64::*;

/// The eight lanes summed in the f32 dots' order (the AVX-512 tiles of `avx512.rs` keep it).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
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

/// `[a · b[0], .., a · b[K - 1]]`, each exactly as [`dot_f32`] computes it (its two
/// accumulators, its steps, its sums: the same bits), the K products side by side: one dot's
/// two FMA chains leave the unit waiting on their latency, 2K chains keep it busy, and `a` is
/// loaded once for all of them (a prompt's router: one weight row against several tokens).
///
/// # Safety
/// AVX2 and FMA; every `b[k]` as long as `a`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_f32_many<const K: usize>(a: &[f32], b: [&[f32]; K]) -> [f32; K] {
    let n = a.len();
    debug_assert!(b.iter().all(|b| b.len() == n));
    let pa = a.as_ptr();
    let pb = b.map(|b| b.as_ptr());
    let mut acc0 = [_mm256_setzero_ps(); K];
    let mut acc1 = [_mm256_setzero_ps(); K];
    let mut i = 0;
    // SAFETY: every load reads 8 floats below n of `a` or of a `b[k]`
    unsafe {
        while i + 16 <= n {
            let (x0, x1) = (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pa.add(i + 8)));
            for k in 0..K {
                acc0[k] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(pb[k].add(i)), acc0[k]);
                acc1[k] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(pb[k].add(i + 8)), acc1[k]);
            }
            i += 16;
        }
        if i + 8 <= n {
            let x0 = _mm256_loadu_ps(pa.add(i));
            for k in 0..K {
                acc0[k] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(pb[k].add(i)), acc0[k]);
            }
            i += 8;
        }
    }
    std::array::from_fn(|k| {
        let mut s = hsum_ps(_mm256_add_ps(acc0[k], acc1[k]));
        for j in i..n {
            s += a[j] * b[k][j];
        }
        s
    })
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
        (_mm_loadu_si128(p.add(b * 16) as *const __m128i), _mm_loadu_si128(p.add(64 + (b % 2) * 16) as *const __m128i))
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

/// The table of the MXFP4 codes' doubled values, in both 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn mxfp4_lut() -> __m256i {
    let t = crate::mxfp4::E2M1_X2;
    _mm256_setr_epi8(
        t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12], t[13], t[14], t[15], t[0],
        t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12], t[13], t[14], t[15],
    )
}

/// Block `gi` of an MXFP4 row (`b`: its 17 bytes onward) times its 32 activations: lane `l`
/// the exact sum of values `4l..4l + 4`, as f32.
///
/// # Safety
/// AVX2 and FMA must be present; `b` holds the block and `a` its group's activations.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn mxfp4_block_lanes(b: &[u8], a: QuantRow<'_>, gi: usize) -> __m256 {
    // SAFETY: the block's 16 code bytes follow its exponent; group gi's 32 activations are in
    // the row (the caller's)
    let (n, x) =
        unsafe { (q4_block(b.as_ptr().add(1)), _mm256_loadu_si256(a.q.as_ptr().add(gi * 32) as *const __m256i)) };
    let wv = _mm256_shuffle_epi8(mxfp4_lut(), n);
    // maddubs(|w|, sign(x, w)): each pair at most 2 * 12 * 127, no saturation
    let p = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(x, wv)),
        _mm256_set1_epi16(1),
    );
    _mm256_cvtepi32_ps(p)
}

/// [`super::scalar::dot_mxfp4`]: a block's codes through a table of their doubled values
/// (signed bytes), then `maddubs(|w|, sign(x, w))` and `madd` with ones: lane `l` holds the
/// exact sum of values `4l..4l + 4` ([`mxfp4_block_lanes`]), fused-multiply-added into
/// accumulator `block % 4`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_mxfp4(w: &[u8], a: QuantRow<'_>) -> f32 {
    use crate::mxfp4::{BLOCK_BYTES, half_scale};
    let mut acc = [_mm256_setzero_ps(); 4];
    for (gi, b) in w.chunks_exact(BLOCK_BYTES).enumerate() {
        // SAFETY: the caller's shapes
        let v = unsafe { mxfp4_block_lanes(b, a, gi) };
        let s = _mm256_set1_ps(half_scale(b[0]) * a.scales[gi]);
        acc[gi % 4] = _mm256_fmadd_ps(v, s, acc[gi % 4]);
    }
    mxfp4_reduce_lanes(acc)
}

/// The four accumulators (blocks 0-3 mod 4) of an MXFP4 row, reduced as every tier does
/// ([`super::mxfp4_reduce`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn mxfp4_reduce_lanes(acc: [__m256; 4]) -> f32 {
    let mut lanes = [[0f32; 8]; 4];
    for (l, v) in lanes.iter_mut().zip(acc) {
        // SAFETY: 8 f32 into an array of 8
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
    }
    super::mxfp4_reduce(lanes)
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q6(wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
    let g = a.group;
    if g == 16 {
        // SAFETY: the caller's guarantees
        return unsafe { dot_q6_g16(wq, wd, a) };
    }
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

/// [`dot_q6`] at groups of 16 (GGUF's Q6_K): a 32-value block's low 128 bits are one group,
/// its high 128 bits the next; the groups in order, as the scalar reference.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q6_g16(wq: &[u8], wd: &[f32], a: QuantRow<'_>) -> f32 {
    let sum4 = |v: __m128i| {
        let s = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b01_00_11_10));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
    };
    let mut acc = 0f32;
    for blk in 0..wd.len() / 2 {
        // SAFETY: block blk's 32 values lie in chunk blk / 4 of the row and of the activations
        let (n, x) = unsafe {
            (
                q6_block(wq.as_ptr().add(blk / 4 * 96), blk % 4),
                _mm256_loadu_si256(a.q.as_ptr().add(blk * 32) as *const __m256i),
            )
        };
        let v = block_dot(_mm256_setzero_si256(), n, x);
        for (k, s) in [sum4(_mm256_castsi256_si128(v)), sum4(_mm256_extracti128_si256(v, 1))].into_iter().enumerate() {
            let gi = 2 * blk + k;
            let isum = s - 32 * a.sums[gi];
            acc += isum as f32 * (wd[gi] * a.scales[gi]);
        }
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
                let n =
                    unsafe { q4_block(block.as_ptr().add(interleaved_offset(i, j / CHUNK, rb, cb) + (j % CHUNK) / 2)) };
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
