//! The AVX2 forms of attention's [`scores`](super::scores) and [`weighted`](super::weighted),
//! as the AVX-512 ones with 8 lanes. AVX2 has 16 registers: one query's 8 score accumulators at
//! a time, and at most 4 value chunks (8 accumulators) per pass.

use std::arch::x86_64::*;

use super::{KEY_BLOCK, KvRead, VCHUNK};

/// The first `V` vectors of 8 lanes of [`super::scores`].
///
/// # Safety
/// AVX2, FMA and F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores<const Q: usize, const V: usize, K: KvRead>(
    idx: &[usize; Q],
    q: &[f32],
    kt: K,
    hd: usize,
) -> [[f32; KEY_BLOCK]; Q] {
    assert!(V <= 8 && kt.len() >= hd * KEY_BLOCK && idx.iter().all(|&i| (i + 1) * hd <= q.len()));
    let mut out = [[0f32; KEY_BLOCK]; Q];
    for (o, &i) in out.iter_mut().zip(idx) {
        let mut acc = [_mm256_setzero_ps(); V];
        for d in 0..hd {
            // SAFETY (the loads): inside `kt` and `q`, as asserted
            let qd = _mm256_set1_ps(unsafe { *q.get_unchecked(i * hd + d) });
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qd, unsafe { kt.load8(d * KEY_BLOCK + 8 * r) }, *a);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            // SAFETY: 8 floats at 8 r of a 64-float array
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * r), *a) };
        }
    }
    out
}

/// # Safety
/// AVX2, FMA and F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn weighted<const C: usize, V: KvRead>(o: &mut [f32], alpha: f32, p: &[f32], vb: V, hd: usize) -> usize {
    let n = C * VCHUNK;
    assert!(o.len() >= n && (p.is_empty() || vb.len() >= (p.len() - 1) * hd + n));
    let al = _mm256_set1_ps(alpha);
    // passes of up to 32 dimensions (8 registers)
    let mut d0 = 0;
    while d0 < n {
        let w = (n - d0).min(32) / 8;
        let mut acc = [_mm256_setzero_ps(); 4];
        for (c, a) in acc.iter_mut().enumerate().take(w) {
            // SAFETY: inside `o`, as asserted
            *a = _mm256_mul_ps(unsafe { _mm256_loadu_ps(o.as_ptr().add(d0 + 8 * c)) }, al);
        }
        for (j, &pj) in p.iter().enumerate() {
            let pv = _mm256_set1_ps(pj);
            for (c, a) in acc.iter_mut().enumerate().take(w) {
                // SAFETY: row j's first n values are inside `vb`, as asserted
                *a = _mm256_fmadd_ps(pv, unsafe { vb.load8(j * hd + d0 + 8 * c) }, *a);
            }
        }
        for (c, a) in acc.iter().enumerate().take(w) {
            // SAFETY: inside `o`, as asserted
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(d0 + 8 * c), *a) };
        }
        d0 += 8 * w;
    }
    n
}
