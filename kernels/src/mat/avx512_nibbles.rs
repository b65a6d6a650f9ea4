//! The AVX-512 q4/q6 tiles' weight unpacking: a 128-value chunk of a row (row-major, x4 or
//! panel-major) as the unsigned bytes `vpdpbusd` multiplies, low- and high-nibble lanes in the
//! permuted activation order, q6 with its high bits ORed in.

use std::arch::x86_64::*;

use super::avx512::QMat;
use crate::quant::{PANEL_ROWS, ROW_BLOCK, interleaved_offset, panel_offset};

/// Chunk `ci`'s values of rows `r0..r0 + R`: low and high nibbles (q6: with their high bits).
///
/// # Safety
/// As [`super::avx512::q_tile`]'s; chunk `ci` exists.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn row_nibbles<const R: usize, const SIX: bool, const IL: usize>(
    m: &QMat<'_>,
    r0: usize,
    ci: usize,
) -> ([__m512i; R], [__m512i; R]) {
    let (mut wl, mut wh) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
    if IL == PANEL_ROWS {
        // panel-major: the tile's rows lie in one 4-row block (R is 1, 2 from an even row, or 4
        // from a multiple of 4), their chunks one after another: one offset for them all
        let cb = if SIX { 96 } else { 64 };
        let at = panel_offset(r0, ci, m.row_bytes, cb);
        for i in 0..R {
            // SAFETY: row r0 + i exists and chunk ci is inside it
            (wl[i], wh[i]) = unsafe { nibbles_at::<SIX>(m, at + i * cb) };
        }
    } else {
        for i in 0..R {
            // SAFETY: as above
            (wl[i], wh[i]) = unsafe { chunk_nibbles::<SIX, IL>(m, r0 + i, ci) };
        }
    }
    (wl, wh)
}

/// Row `r`'s 128-value chunk `ci` as unsigned bytes for `vpdpbusd`: the low-nibble lanes and the
/// high-nibble lanes (in the permuted activation order), q6 (`SIX`) with its high bits ORed in.
/// With `m.pf`, the line `m.pf` bytes on is prefetched.
///
/// q6: a chunk's 32 high bytes, loaded into both halves of a register, give the high bits of the
/// low-nibble lanes shifted left by 4 (lanes 0-31, field 0) and 2 (lanes 32-63, field 1), and
/// those of the high-nibble lanes by 0 and -2 (fields 2 and 3); masked with 0x30 and ORed in.
/// 16-bit shifts move bits across bytes only into bits the mask drops.
///
/// # Safety
/// AVX-512 F and BW; row `r` of `m.q` exists and chunk `ci` is inside it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn chunk_nibbles<const SIX: bool, const IL: usize>(m: &QMat<'_>, r: usize, ci: usize) -> (__m512i, __m512i) {
    let chunk_bytes = if SIX { 96 } else { 64 };
    let off = if IL == 1 {
        r * m.row_bytes + ci * chunk_bytes
    } else if IL == ROW_BLOCK {
        interleaved_offset(r, ci, m.row_bytes, chunk_bytes)
    } else {
        panel_offset(r, ci, m.row_bytes, chunk_bytes)
    };
    // SAFETY: the caller's guarantee (interleaved: the chunk lies in its block)
    unsafe { nibbles_at::<SIX>(m, off) }
}

/// [`chunk_nibbles`] of the chunk at byte `off` of `m.q`.
///
/// # Safety
/// As [`chunk_nibbles`]'s, for a whole chunk at `off`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn nibbles_at<const SIX: bool>(m: &QMat<'_>, off: usize) -> (__m512i, __m512i) {
    let mask = _mm512_set1_epi8(0x0F);
    // SAFETY: the caller's guarantee (interleaved: the chunk lies in its block)
    let p = unsafe { m.q.as_ptr().add(off) };
    if m.pf != 0 {
        crate::prefetch::line(p, m.pf);
        if SIX {
            // a q6 chunk is 96 bytes: one line and a half
            crate::prefetch::line(p, m.pf + 64);
        }
    }
    let w = unsafe { _mm512_loadu_si512(p as *const _) };
    let (mut wl, mut wh) = (_mm512_and_si512(w, mask), _mm512_and_si512(_mm512_srli_epi16(w, 4), mask));
    if SIX {
        let hmask = _mm512_set1_epi8(0x30);
        // per 16-bit lane: 4 for the low 256 bits, 2 for the high (left shifts of the low-nibble
        // lanes' fields); 0 and 2 (right shifts of the high-nibble lanes' fields)
        let shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        let shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
        // SAFETY: the chunk's high bytes follow its 64 low-nibble bytes
        let h = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(64) as *const _)) };
        wl = _mm512_or_si512(wl, _mm512_and_si512(_mm512_sllv_epi16(h, shl), hmask));
        wh = _mm512_or_si512(wh, _mm512_and_si512(_mm512_srlv_epi16(h, shr), hmask));
    }
    (wl, wh)
}
