//! The AVX-512 forms of attention's [`scores`](super::scores) and [`weighted`](super::weighted):
//! the same sums in the same order as the scalar tier, with fused multiply-adds (so within
//! rounding of it, not bit for bit), 16 lanes at a time.

use std::arch::x86_64::*;

use super::{KEY_BLOCK, KvRead, VCHUNK};

const _: () = assert!(KEY_BLOCK == 4 * 16 && VCHUNK == 16);

/// The first `V` vectors of 16 lanes of [`super::scores`].
///
/// # Safety
/// AVX-512 F present.
#[target_feature(enable = "avx512f")]
pub unsafe fn scores<const Q: usize, const V: usize, K: KvRead>(
    idx: &[usize; Q],
    q: &[f32],
    kt: K,
    hd: usize,
) -> [[f32; KEY_BLOCK]; Q] {
    assert!(V <= 4 && kt.len() >= hd * KEY_BLOCK && idx.iter().all(|&i| (i + 1) * hd <= q.len()));
    let mut acc = [[_mm512_setzero_ps(); V]; Q];
    for d in 0..hd {
        // SAFETY (the loads): inside `kt` and `q`, as asserted
        let k: [__m512; V] = std::array::from_fn(|r| unsafe { kt.load16(d * KEY_BLOCK + 16 * r) });
        for (a, &i) in acc.iter_mut().zip(idx) {
            let qd = _mm512_set1_ps(unsafe { *q.get_unchecked(i * hd + d) });
            for (a, &k) in a.iter_mut().zip(&k) {
                *a = _mm512_fmadd_ps(qd, k, *a);
            }
        }
    }
    let mut out = [[0f32; KEY_BLOCK]; Q];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (r, &v) in a.iter().enumerate() {
            // SAFETY: 16 floats at 16 r of a 64-float array
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(16 * r), v) };
        }
    }
    out
}

/// # Safety
/// AVX-512 F present.
#[target_feature(enable = "avx512f")]
pub unsafe fn weighted<const C: usize, V: KvRead>(o: &mut [f32], alpha: f32, p: &[f32], vb: V, hd: usize) -> usize {
    let n = C * VCHUNK;
    assert!(o.len() >= n && (p.is_empty() || vb.len() >= (p.len() - 1) * hd + n));
    let al = _mm512_set1_ps(alpha);
    let mut acc = [_mm512_setzero_ps(); C];
    for (c, a) in acc.iter_mut().enumerate() {
        // SAFETY: inside `o`, as asserted
        *a = _mm512_mul_ps(unsafe { _mm512_loadu_ps(o.as_ptr().add(16 * c)) }, al);
    }
    for (j, &pj) in p.iter().enumerate() {
        let pv = _mm512_set1_ps(pj);
        for (c, a) in acc.iter_mut().enumerate() {
            // SAFETY: row j's first n values are inside `vb`, as asserted
            *a = _mm512_fmadd_ps(pv, unsafe { vb.load16(j * hd + 16 * c) }, *a);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        // SAFETY: inside `o`, as asserted
        unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(16 * c), *a) };
    }
    n
}

/// [`weighted`] for `Q` queries over the same value rows at once: query `k`'s output chunk at
/// `o[at[k]..][..C * 16]`, its weights `p[k]` (all as long). Each value vector is loaded once
/// for the `Q` queries (a lone query reloads a block's values for every one: 128 KiB of them
/// at DeepSeek-V3's 512-wide latent values); each query's own sums are [`weighted`]'s, in its
/// order, so the same bits.
///
/// # Safety
/// AVX-512 F present.
#[target_feature(enable = "avx512f")]
pub unsafe fn weighted_shared<const Q: usize, const C: usize, V: KvRead>(
    o: &mut [f32],
    at: [usize; Q],
    alpha: [f32; Q],
    p: [&[f32]; Q],
    vb: V,
    hd: usize,
) -> usize {
    let (n, len) = (C * VCHUNK, p[0].len());
    assert!(at.iter().all(|&a| a + n <= o.len()) && p.iter().all(|pk| pk.len() == len));
    assert!(len == 0 || vb.len() >= (len - 1) * hd + n);
    let mut acc = [[_mm512_setzero_ps(); C]; Q];
    for k in 0..Q {
        let al = _mm512_set1_ps(alpha[k]);
        for (c, a) in acc[k].iter_mut().enumerate() {
            // SAFETY: inside `o`, as asserted
            *a = _mm512_mul_ps(unsafe { _mm512_loadu_ps(o.as_ptr().add(at[k] + 16 * c)) }, al);
        }
    }
    for j in 0..len {
        // SAFETY: row j's first n values are inside `vb`, and j inside every `p[k]`, as asserted
        let pv: [__m512; Q] = std::array::from_fn(|k| _mm512_set1_ps(unsafe { *p[k].get_unchecked(j) }));
        for c in 0..C {
            let x = unsafe { vb.load16(j * hd + 16 * c) };
            for k in 0..Q {
                acc[k][c] = _mm512_fmadd_ps(pv[k], x, acc[k][c]);
            }
        }
    }
    for k in 0..Q {
        for (c, a) in acc[k].iter().enumerate() {
            // SAFETY: inside `o`, as asserted
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(at[k] + 16 * c), *a) };
        }
    }
    n
}
