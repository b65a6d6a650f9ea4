//! The q4 lanes kernel's decode of rows not in lane order (`avx512_q4_rows.rs`): one token
//! over a 16-row block read straight from the chunks, each row's chunk sums reduced into one
//! vector a block with the rows in its lanes, then the tile's float steps in its order.

use std::arch::x86_64::*;

use super::avx512::QMat;
use super::avx512_q4_rows::{LANES, chunk_at};
use crate::quant::ROW_BLOCK;

/// One token times rows `r0..r0 + k` (k <= 16), with `bs` holding the rows' scales
/// (`avx512_q4_rows.rs`'s `gather_scales`). Decode transposes sums rather than words: each row's chunk meets the
/// permuted activations (`m.ap`, the order of `avx512.rs`'s tiles) in one int32 vector whose
/// lane `l` holds 8 products of block `l / 4`, and the 16 rows' vectors are reduced into one
/// vector a block with the rows in its lanes ([`block_sums`]: 32 shuffles and 12 adds a chunk,
/// where transposing the words took 64 shuffles). The same integer sums as the tile's, then
/// its float operations in its order, so the same bits.
///
/// # Safety
/// As `q4_rows`'s, for rows `r0..r0 + k` and one token; `m.ap` holds the token permuted;
/// `sums` holds `m.cols / 128 * 1024` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn decode_block<const IL: usize>(
    m: &QMat<'_>,
    r0: usize,
    k: usize,
    bs: &[f32],
    sums: &mut [u8],
) -> [f32; LANES] {
    let a = m.a;
    let chunks = m.cols / 128;
    let blocks = a.group / 32;
    let nibble = _mm512_set1_epi8(0x0F);
    // first every row's chunk sums into `sums` (chunk c of row i at (16 c + i) * 64), the rows
    // read in memory order: the 4-row blocks of x4 one after another, each one stream with the
    // prefetch along it (all 16 rows chunk by chunk were four streams at once: decode lost 6%)
    let sp = sums.as_mut_ptr() as *mut __m512i;
    for blk in 0..LANES / ROW_BLOCK {
        // the scales of the same 4 rows a block on, a few lines a chunk: the gather reads them
        // a row at a time, each a cache miss unless asked for; all 16 rows' at once (64 lines
        // at groups of 32) filled the line buffers and stalled the weights' stream
        let (sb, sl) = (m.scales_at(r0 + LANES + blk * ROW_BLOCK, 0) as usize, ROW_BLOCK * m.scale_span(m.ng));
        for c in 0..chunks {
            let mut l = (sb + c * sl / chunks) & !63;
            while l < sb + (c + 1) * sl / chunks {
                crate::prefetch::line(l as *const u8, 0);
                l += 64;
            }
            // SAFETY: the token's permuted chunk c
            let (al, ah) = unsafe {
                let p = m.ap.as_ptr().add(c * 128);
                (_mm512_loadu_si512(p as *const _), _mm512_loadu_si512(p.add(64) as *const _))
            };
            for i in blk * ROW_BLOCK..(blk + 1) * ROW_BLOCK {
                let v = if i < k {
                    // SAFETY: the caller's guarantees: the chunk lies inside the matrix
                    let w = unsafe { _mm512_loadu_si512(chunk_at::<IL>(m, r0 + i, c) as *const _) };
                    let (lo, hi) = (_mm512_and_si512(w, nibble), _mm512_and_si512(_mm512_srli_epi16::<4>(w), nibble));
                    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, al), hi, ah)
                } else {
                    _mm512_setzero_si512()
                };
                // SAFETY: `sums` holds chunks * 16 vectors
                unsafe { _mm512_storeu_si512(sp.add(16 * c + i) as *mut _, v) };
            }
        }
    }
    let mut f = _mm512_setzero_ps();
    let mut isum = _mm512_setzero_si512();
    let mut rv = [_mm512_setzero_si512(); LANES];
    for c in 0..chunks {
        for (i, v) in rv.iter_mut().enumerate() {
            // SAFETY: written above
            *v = unsafe { _mm512_loadu_si512(sp.add(16 * c + i) as *const _) };
        }
        for (bb, v) in block_sums(&rv).into_iter().enumerate() {
            let b = 4 * c + bb;
            let g = b / blocks;
            if b.is_multiple_of(blocks) {
                isum = _mm512_set1_epi32(-8 * a.sums[g]);
            }
            isum = _mm512_add_epi32(isum, v);
            if (b + 1).is_multiple_of(blocks) {
                // SAFETY: group g's 16 scales
                let ws = unsafe { _mm512_loadu_ps(bs.as_ptr().add(16 * g)) };
                let sc = _mm512_mul_ps(ws, _mm512_set1_ps(a.scales[g]));
                f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, f);
            }
        }
    }
    let mut out = [0f32; LANES];
    // SAFETY: 16 floats
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), f) };
    out
}

/// 16 rows' chunk sums (`rv[i]`: lane `l` holds products of 32-value block `l / 4`) as one
/// vector a block: lane `i` of output `b` is the sum of lanes `4 b..4 b + 4` of `rv[i]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn block_sums(rv: &[__m512i; LANES]) -> [__m512i; 4] {
    let z = _mm512_setzero_si512();
    // pairs of rows (A, B): per 128-bit lane [A0 + A2, B0 + B2, A1 + A3, B1 + B3]
    let mut x = [z; 8];
    for (k, x) in x.iter_mut().enumerate() {
        let (a, b) = (rv[2 * k], rv[2 * k + 1]);
        *x = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    }
    // quads: per 128-bit lane (a block) the four rows' whole sums
    let mut q = [z; 4];
    for (h, q) in q.iter_mut().enumerate() {
        let (a, b) = (x[2 * h], x[2 * h + 1]);
        *q = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    }
    // the 4 x 4 transpose of 128-bit lanes: block b's lanes of every quad, in row order
    let p0 = _mm512_shuffle_i32x4::<0b10_00_10_00>(q[0], q[1]);
    let p1 = _mm512_shuffle_i32x4::<0b11_01_11_01>(q[0], q[1]);
    let p2 = _mm512_shuffle_i32x4::<0b10_00_10_00>(q[2], q[3]);
    let p3 = _mm512_shuffle_i32x4::<0b11_01_11_01>(q[2], q[3]);
    [
        _mm512_shuffle_i32x4::<0b10_00_10_00>(p0, p2),
        _mm512_shuffle_i32x4::<0b10_00_10_00>(p1, p3),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(p0, p2),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(p1, p3),
    ]
}
