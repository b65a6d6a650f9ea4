//! Q2_K and Q3_K products for a prompt at the AVX-512 tier, 16 rows in a vector's lanes: a tile
//! of 16 rows is decoded once into a buffer of u8 weights (a code times its sub-block's scale),
//! then every token's 16 activations of a sub-block, broadcast to the four 128-bit lanes, meet
//! four vectors of those weights (`vpdpbusd`: each lane four rows' 16 values), and each block's
//! integer sums end in one i32 lane per row. `k23.rs`'s float operations then run on 16 rows at
//! once, where the one-row kernel (`avx512_k23.rs`) runs them on one; the same bits.
//!
//! Q3_K's scales are signed and its codes offset: a value is `sc * (c - 4)`, `c` in 0..8. The
//! weight is `sc * c` where `sc >= 0`, else `|sc| * (7 - c)` (`sc * c = |sc| * (7 - c) - 7|sc|`),
//! both at most 224, so a u8; the offset left is `4 sc` or `3 |sc|` times the sub-block's sum
//! of activations, and joins the integer sum as Q3_K's offsets do in `k23.rs`.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512_k23::{IQ4XS, Q2K, Q3K, Q4K, block_sums, decode, load4, reduce, scale_lanes};
use super::k23::{K23_GROUP, value_at};
use crate::act::QuantAct;
use crate::ggml::{BlockType, f16_at, q3_k_scale_bytes};

/// Rows a tile holds, one per i32 lane.
pub(super) const ROWS: usize = 16;

/// 64-byte lines of a tile's block: the weights, `[16 sub-blocks][4 vectors]` (vector `m`'s
/// 128-bit lane `l` holds row `4l + m`'s 16 values, the order [`reduce`] sums into row order),
/// then the mins' weights in 8 lines (line `j`: each row's i16 pair for sub-blocks `2j`, `2j
/// + 1`), then the 16 rows' `d` and `dmin`.
pub(super) const LINES: usize = 64 + 8 + 2;
pub(super) const MINS: usize = 64;
pub(super) const D: usize = 72;
pub(super) const DMIN: usize = 73;

/// Lines of [`one_token`]'s block: 16 rows' sums of the codes, 16 of the mins, `d`, `dmin`.
const SUM_LINES: usize = 2 * ROWS + 2;

/// Tokens a tile's decoded weights serve at a time.
const TOKENS: usize = 4;

/// Bytes `e` of a 16-byte table with bit 0, 1 or 2 of `e` set.
const TABLE_BITS: [[u8; 16]; 3] = {
    let mut t = [[0u8; 16]; 3];
    let mut e = 0;
    while e < 16 {
        let mut b = 0;
        while b < 3 {
            if e & (1 << b) != 0 {
                t[b][e] = 0xFF;
            }
            b += 1;
        }
        e += 1;
    }
    t
};

/// A 64-byte line of a decoded tile, aligned for whole-vector loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line(pub(super) [u8; 64]);

thread_local! {
    /// A tile's blocks, decoded (`LINES` lines a block).
    pub(super) static TILE: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// Products of whole tiles of 16 rows from `rows.start`: `out[(r - rows.start) * n + t]` as
/// `k23::matmul_rows` has it, for the first `rows.len() / 16 * 16` rows; returns how many.
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI; `t` is Q2_K or Q3_K; `q` holds the rows of `t`'s blocks, `a` `n`
/// tokens quantized in groups of 256, `sums` their sums per 16, `out` `rows.len() * n` products.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn matmul_tiles(
    t: BlockType,
    (q, cols): (&[u8], usize),
    a: &QuantAct,
    sums: &[i16],
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) -> usize {
    let nb = cols / K23_GROUP;
    let tiles = rows.len() / ROWS;
    let lanes = scale_lanes();
    TILE.with(|buf| {
        let buf = &mut *buf.borrow_mut();
        buf.resize(nb * LINES, Line([0; 64]));
        for tile in 0..tiles {
            let r0 = rows.start + tile * ROWS;
            // SAFETY (both): the caller's features; rows r0..r0 + 16 are among the matrix's,
            // the buffer holds nb blocks, the tokens as the caller promises
            unsafe { decode_tile(t, q, cols, r0, &lanes, buf) };
            let o = &mut out[tile * ROWS * n..(tile + 1) * ROWS * n];
            for (t0, w) in token_spans::<TOKENS>(n) {
                // SAFETY: as above, tokens t0..t0 + w
                unsafe {
                    match (w, t) {
                        (TOKENS, BlockType::Q2K) => tokens::<TOKENS, true>(buf, nb, a, sums, t0, n, o),
                        (TOKENS, _) => tokens::<TOKENS, false>(buf, nb, a, sums, t0, n, o),
                        (2, BlockType::Q2K) => tokens::<2, true>(buf, nb, a, sums, t0, n, o),
                        (2, _) => tokens::<2, false>(buf, nb, a, sums, t0, n, o),
                        (_, BlockType::Q2K) => tokens::<1, true>(buf, nb, a, sums, t0, n, o),
                        (_, _) => tokens::<1, false>(buf, nb, a, sums, t0, n, o),
                    }
                }
            }
        }
    });
    tiles * ROWS
}

/// Rows `r0..r0 + 16`'s blocks into `buf` as [`LINES`] describes.
///
/// # Safety
/// As [`matmul_tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_tile(t: BlockType, q: &[u8], cols: usize, r0: usize, lanes: &[__m512i; 12], buf: &mut [Line]) {
    let (rb, bb, nb) = (t.bytes_of(cols), t.block_bytes(), cols / K23_GROUP);
    for r in 0..ROWS {
        let row = &q[(r0 + r) * rb..(r0 + r + 1) * rb];
        let (m, l) = (r % 4, r / 4);
        for (b, lines) in buf.chunks_exact_mut(LINES).take(nb).enumerate() {
            let blk = &row[b * bb..(b + 1) * bb];
            // SAFETY: the caller's features; a whole block
            let (codes, mins, d, dm) = unsafe {
                if t == BlockType::Q2K {
                    let x = decode(t, blk, lanes);
                    (x.codes, x.mins, x.d, x.dm)
                } else {
                    q3k_weights(blk, lanes)
                }
            };
            for (k, c) in codes.iter().enumerate() {
                // SAFETY: a 64-byte vector stored whole into its 4 lanes' lines
                let lane: [[u8; 16]; 4] = unsafe { std::mem::transmute(*c) };
                for (qq, v) in lane.iter().enumerate() {
                    // 128-bit lane qq of code vector k: the 16 values of one sub-block
                    let g = value_at(t, k, 16 * qq) / 16;
                    lines[4 * g + m].0[16 * l..16 * l + 16].copy_from_slice(v);
                }
            }
            // SAFETY: 16 i16 from one vector
            let mins: [u32; 8] = unsafe { std::mem::transmute(mins) };
            for (j, pair) in mins.iter().enumerate() {
                lines[MINS + j].0[4 * r..4 * r + 4].copy_from_slice(&pair.to_le_bytes());
            }
            lines[D].0[4 * r..4 * r + 4].copy_from_slice(&d.to_le_bytes());
            lines[DMIN].0[4 * r..4 * r + 4].copy_from_slice(&dm.to_le_bytes());
        }
    }
}

/// A Q3_K block's u8 weights in the order of `decode`'s code vectors, the offsets' weights per
/// sub-block (`4 sc` or `3 |sc|`, as the module says), and `d` twice.
///
/// # Safety
/// AVX-512 F, BW and VL; `b` is a whole block.
#[inline(always)]
unsafe fn q3k_weights(b: &[u8], lanes: &[__m512i; 12]) -> ([__m512i; 4], __m256i, f32, f32) {
    // SAFETY: the caller's features; loads within the block's bytes
    unsafe {
        let bp = b.as_ptr();
        let [first, second] = q3_k_scale_bytes(&b[96..108]);
        let sc = _mm_sub_epi8(_mm_set_epi64x(second as i64, first as i64), _mm_set1_epi8(32));
        let neg = _mm_cmpgt_epi8(_mm_setzero_si128(), sc);
        let mag = _mm_abs_epi8(sc);
        let mag16 = _mm256_cvtepu8_epi16(mag);
        let offsets = _mm256_add_epi16(
            _mm256_mullo_epi16(mag16, _mm256_set1_epi16(3)),
            _mm256_andnot_si256(_mm256_cvtepi8_epi16(neg), mag16),
        );
        let (magb, flipb) = (_mm512_broadcast_i32x4(mag), _mm512_broadcast_i32x4(_mm_and_si128(neg, _mm_set1_epi8(7))));
        // table byte e of a lane: e * |sc| for e in 0..8, by e's three bits (no closures here:
        // they would not inherit the caller's features, and the intrinsics would be calls)
        let m1 = _mm512_broadcast_i32x4(_mm_loadu_si128(TABLE_BITS[0].as_ptr() as *const __m128i));
        let m2 = _mm512_broadcast_i32x4(_mm_loadu_si128(TABLE_BITS[1].as_ptr() as *const __m128i));
        let m4 = _mm512_broadcast_i32x4(_mm_loadu_si128(TABLE_BITS[2].as_ptr() as *const __m128i));
        let qs = _mm512_loadu_si512(bp.add(32) as *const _);
        let hm = _mm256_loadu_si256(bp as *const __m256i);
        let high = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(hm), _mm256_srli_epi16::<4>(hm));
        let (three, four) = (_mm512_set1_epi8(3), _mm512_set1_epi8(4));
        let mut codes = [_mm512_setzero_si512(); 4];
        for (k, code) in codes.iter_mut().enumerate() {
            let mut c = _mm512_and_si512(_mm512_srl_epi16(qs, _mm_cvtsi32_si128(2 * k as i32)), three);
            let set = _mm512_test_epi8_mask(high, _mm512_set1_epi8(1 << k));
            c = _mm512_mask_add_epi8(c, set, c, four);
            // each lane's sub-block: its |sc| and whether c becomes 7 - c (= c ^ 7)
            let s = _mm512_shuffle_epi8(magb, lanes[4 + k]);
            c = _mm512_xor_si512(c, _mm512_shuffle_epi8(flipb, lanes[4 + k]));
            let s2 = _mm512_add_epi8(s, s);
            let table = _mm512_add_epi8(
                _mm512_add_epi8(_mm512_and_si512(s, m1), _mm512_and_si512(s2, m2)),
                _mm512_and_si512(_mm512_add_epi8(s2, s2), m4),
            );
            *code = _mm512_shuffle_epi8(table, c);
        }
        let d = f16_at(b, 108);
        (codes, offsets, d, d)
    }
}

/// Tokens `t0..t0 + T` against a decoded tile (`Q2`: Q2_K's separate mins, else Q3_K's offsets).
///
/// # Safety
/// As [`matmul_tiles`]; `buf` a decoded tile, `o` the tile's `16 * n` products.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tokens<const T: usize, const Q2: bool>(
    buf: &[Line],
    nb: usize,
    a: &QuantAct,
    sums: &[i16],
    t0: usize,
    n: usize,
    o: &mut [f32],
) {
    let cols = nb * K23_GROUP;
    let mut acc = [_mm512_setzero_ps(); T];
    for (b, lines) in buf.chunks_exact(LINES).take(nb).enumerate() {
        // SAFETY (both): the caller's features; the tile's lines, the tokens' codes, sums and
        // scales within the caller's spans
        unsafe {
            let at = a.q.as_ptr().add(t0 * cols + K23_GROUP * b) as *const u8;
            let isum = tile_sums::<T, 16>(lines, at, cols);
            block_floats::<T, Q2>(&mut acc, isum, lines, (a, sums), t0, b, nb);
        }
    }
    store_tile(&acc, t0, n, o);
}

/// Block `b`'s part of tokens `t0..t0 + T`'s products with a tile, from its integer sums
/// `isum` (lane `r`: row `r`'s): the mins' (`Q2`: Q2_K's and Q4_K's, with `dmin`) or offsets'
/// term from the lines at [`MINS`] against the tokens' sums per 16, then `k23::dot_scalar`'s
/// float operations, a row a lane, into `acc`.
///
/// # Safety
/// AVX-512 F, BW and VNNI; `lines` a decoded block with [`MINS`], [`D`] and [`DMIN`] lines;
/// tokens `t0..t0 + T` and block `b` within `a` and `sums` (`nb` blocks a token).
#[inline(always)]
pub(super) unsafe fn block_floats<const T: usize, const Q2: bool>(
    acc: &mut [__m512; T],
    isum: [__m512i; T],
    lines: &[Line],
    (a, sums): (&QuantAct, &[i16]),
    t0: usize,
    b: usize,
    nb: usize,
) {
    let cols = nb * K23_GROUP;
    let line = |i: usize| lines[i].0.as_ptr();
    // SAFETY (all): the caller's features and spans
    unsafe {
        let (d, dm) = (_mm512_load_ps(line(D) as *const f32), _mm512_load_ps(line(DMIN) as *const f32));
        for tt in 0..T {
            let tok = t0 + tt;
            let mut s = isum[tt];
            let mut mins = _mm512_setzero_si512();
            let bs = sums.as_ptr().add(tok * cols / 16 + 16 * b) as *const i32;
            for j in 0..8 {
                let pair = _mm512_set1_epi32(bs.add(j).read_unaligned());
                mins = _mm512_dpwssd_epi32(mins, _mm512_load_si512(line(MINS + j) as *const _), pair);
            }
            if !Q2 {
                s = _mm512_sub_epi32(s, mins);
            }
            let scale = _mm512_set1_ps(*a.scales.get_unchecked(tok * nb + b));
            acc[tt] = _mm512_add_ps(acc[tt], _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, scale)));
            if Q2 {
                let m = _mm512_mul_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dm, scale));
                acc[tt] = _mm512_sub_ps(acc[tt], m);
            }
        }
    }
}

/// The token spans a tile's products take, in order: `(first token, width)` with widths of `T`
/// while `T` tokens remain, then 2, then 1, so that each width has its own unrolled kernel.
pub(super) fn token_spans<const T: usize>(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut t0 = 0;
    std::iter::from_fn(move || {
        let w = match n - t0 {
            0 => return None,
            r if r >= T => T,
            r if r >= 2 => 2,
            _ => 1,
        };
        t0 += w;
        Some((t0 - w, w))
    })
}

/// A tile's products with tokens `t0..t0 + T` (`acc[tt]`'s lane `r`: row `r`'s) into `o`, a
/// row's `n` after another's.
#[inline(always)]
pub(super) fn store_tile<const T: usize>(acc: &[__m512; T], t0: usize, n: usize, o: &mut [f32]) {
    for (tt, v) in acc.iter().enumerate() {
        // SAFETY: 16 lanes into 16 floats
        let v: [f32; ROWS] = unsafe { std::mem::transmute(*v) };
        for (r, x) in v.into_iter().enumerate() {
            o[r * n + t0 + tt] = x;
        }
    }
}

/// A decoded block's integer sums with tokens `t0..t0 + T`, lane `r` row `r`'s: `G` groups of
/// 16 activation bytes from `at` (token `t0`'s first, the next token's `stride` bytes on; i8
/// codes against u8 weights by `vpdpbusd`), each broadcast to the four 128-bit lanes against
/// the block's lines `4g..4g + 4`.
///
/// # Safety
/// AVX-512 F, BW and VNNI; `lines` holds `4 G` lines, `at` `T` tokens' `16 G` bytes.
#[inline(always)]
unsafe fn tile_sums<const T: usize, const G: usize>(lines: &[Line], at: *const u8, stride: usize) -> [__m512i; T] {
    // SAFETY: the caller's features and spans
    unsafe {
        let mut isum = [[_mm512_setzero_si512(); 4]; T];
        for g in 0..G {
            let mut av = [_mm512_setzero_si512(); T];
            for (tt, v) in av.iter_mut().enumerate() {
                *v = _mm512_broadcast_i32x4(_mm_loadu_si128(at.add(tt * stride + 16 * g) as *const __m128i));
            }
            for m in 0..4 {
                let w = _mm512_load_si512(lines[4 * g + m].0.as_ptr() as *const _);
                for tt in 0..T {
                    isum[tt][m] = _mm512_dpbusd_epi32(isum[tt][m], w, av[tt]);
                }
            }
        }
        let mut s = [_mm512_setzero_si512(); T];
        for (s, v) in s.iter_mut().zip(isum) {
            *s = reduce(v);
        }
        s
    }
}

/// One token's products with whole tiles of 16 rows from `rows.start` (decode): each row's
/// blocks as the one-row kernel computes them, straight from the rows (a tile's decoding would
/// serve one token only), the 16 rows' integer sums of a block reduced together and their float
/// operations in 16 lanes. `perm` and `sums` as `avx512_k23::matmul_rows` takes them; returns
/// the rows done.
///
/// # Safety
/// As `avx512_k23::matmul_rows`, for one token.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token(
    t: BlockType,
    (q, cols): (&[u8], usize),
    a: &QuantAct,
    (perm, sums): (&[i8], &[i16]),
    rows: Range<usize>,
    out: &mut [f32],
) -> usize {
    let tiles = rows.len() / ROWS;
    let lanes = scale_lanes();
    for tile in 0..tiles {
        let r0 = rows.start + tile * ROWS;
        let o = &mut out[tile * ROWS..(tile + 1) * ROWS];
        // SAFETY: as the caller promises, rows r0..r0 + 16
        unsafe {
            match t {
                BlockType::Q2K => one_tile::<Q2K>(t, (q, cols), a, (perm, sums), r0, &lanes, o),
                BlockType::Q3K => one_tile::<Q3K>(t, (q, cols), a, (perm, sums), r0, &lanes, o),
                BlockType::Q4K => one_tile::<Q4K>(t, (q, cols), a, (perm, sums), r0, &lanes, o),
                _ => one_tile::<IQ4XS>(t, (q, cols), a, (perm, sums), r0, &lanes, o),
            }
        }
    }
    tiles * ROWS
}

/// [`one_token`]'s tile of rows `r0..r0 + 16` into `o`.
///
/// # Safety
/// As [`one_token`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn one_tile<const KIND: u8>(
    t: BlockType,
    (q, cols): (&[u8], usize),
    a: &QuantAct,
    (perm, sums): (&[i8], &[i16]),
    r0: usize,
    lanes: &[__m512i; 12],
    o: &mut [f32],
) {
    let (rb, bb, nb) = (t.bytes_of(cols), t.block_bytes(), cols / K23_GROUP);
    let pf = crate::prefetch::distance();
    // the buffer out of its cell: a closure would not inherit this function's features
    let mut buf = TILE.with(|b| std::mem::take(&mut *b.borrow_mut()));
    {
        buf.resize(nb * SUM_LINES, Line([0; 64]));
        // the rows one after the other (the order the memory holds them in), each block's sums
        // kept: lines 0..16 the codes', 16..32 the mins' (a half line), then d and dmin
        for r in 0..ROWS {
            let row = &q[(r0 + r) * rb..(r0 + r + 1) * rb];
            for (b, lines) in buf.chunks_exact_mut(SUM_LINES).take(nb).enumerate() {
                // the lines `pf` bytes on (the next rows' blocks), as the other decode kernels
                if pf > 0 {
                    crate::prefetch::part_of(row[b * bb..].as_ptr().wrapping_add(pf), bb, 0, 1);
                }
                // SAFETY: the caller's features; block b of the row, the token's codes and sums
                let blk = unsafe {
                    let blk = decode(t, &row[b * bb..(b + 1) * bb], lanes);
                    let av = load4(perm.as_ptr().add(K23_GROUP * b));
                    let (s, m) = block_sums::<KIND>(&blk, &av, sums.as_ptr().add(16 * b));
                    _mm512_store_si512(lines[r].0.as_mut_ptr() as *mut _, s);
                    _mm256_store_si256(lines[ROWS + r].0.as_mut_ptr() as *mut __m256i, m);
                    blk
                };
                lines[2 * ROWS].0[4 * r..4 * r + 4].copy_from_slice(&blk.d.to_le_bytes());
                lines[2 * ROWS + 1].0[4 * r..4 * r + 4].copy_from_slice(&blk.dm.to_le_bytes());
            }
        }
        let mut acc = _mm512_setzero_ps();
        for (b, lines) in buf.chunks_exact(SUM_LINES).take(nb).enumerate() {
            // SAFETY: the caller's features; the lines just written, the token's scale of block b
            unsafe {
                let line = |i: usize| lines[i].0.as_ptr();
                let mut sv = [_mm512_setzero_si512(); ROWS];
                for (r, v) in sv.iter_mut().enumerate() {
                    *v = _mm512_load_si512(line(r) as *const _);
                }
                // `k23::dot_scalar`'s operations, a row a lane
                let scale = _mm512_set1_ps(*a.scales.get_unchecked(b));
                let s = _mm512_cvtepi32_ps(reduce16(&sv));
                let dd = _mm512_mul_ps(_mm512_load_ps(line(2 * ROWS) as *const f32), scale);
                acc = _mm512_add_ps(acc, _mm512_mul_ps(s, dd));
                if KIND == Q2K || KIND == Q4K {
                    let mut mv = [_mm256_setzero_si256(); ROWS];
                    for (r, v) in mv.iter_mut().enumerate() {
                        *v = _mm256_load_si256(line(ROWS + r) as *const __m256i);
                    }
                    let m = _mm512_cvtepi32_ps(reduce16_half(&mv));
                    let dm = _mm512_mul_ps(_mm512_load_ps(line(2 * ROWS + 1) as *const f32), scale);
                    acc = _mm512_sub_ps(acc, _mm512_mul_ps(m, dm));
                }
            }
        }
        // SAFETY: 16 lanes into 16 floats
        let acc: [f32; ROWS] = unsafe { std::mem::transmute(acc) };
        o.copy_from_slice(&acc);
    }
    TILE.with(|b| *b.borrow_mut() = buf);
}

/// Lane `r` = the sum of `v[r]`'s 16 lanes.
#[inline(always)]
unsafe fn reduce16(v: &[__m512i; ROWS]) -> __m512i {
    // SAFETY: the caller's features (AVX-512 F)
    unsafe {
        // group g's lane 4l + m: row 4g + m's sum over its 128-bit lane l
        let g0 = reduce([v[0], v[1], v[2], v[3]]);
        let g1 = reduce([v[4], v[5], v[6], v[7]]);
        let g2 = reduce([v[8], v[9], v[10], v[11]]);
        let g3 = reduce([v[12], v[13], v[14], v[15]]);
        lanes_of_groups([g0, g1, g2, g3])
    }
}

/// Lane `r` = the sum of `v[r]`'s 8 lanes: rows `m` and `4 + m` share a vector, as do `8 + m`
/// and `12 + m`, so two [`reduce`]s cover them.
#[inline(always)]
unsafe fn reduce16_half(v: &[__m256i; ROWS]) -> __m512i {
    // SAFETY: the caller's features (AVX-512 F)
    unsafe {
        // (no closure: it would not inherit the caller's features)
        let (z, ins) = (_mm512_castsi256_si512, _mm512_inserti64x4::<1>);
        let lo = reduce([ins(z(v[0]), v[4]), ins(z(v[1]), v[5]), ins(z(v[2]), v[6]), ins(z(v[3]), v[7])]);
        let hi = reduce([ins(z(v[8]), v[12]), ins(z(v[9]), v[13]), ins(z(v[10]), v[14]), ins(z(v[11]), v[15])]);
        // lo's 128-bit lanes 0, 1: rows 0..4's halves; 2, 3: rows 4..8's
        _mm512_add_epi32(_mm512_shuffle_i32x4::<0b10_00_10_00>(lo, hi), _mm512_shuffle_i32x4::<0b11_01_11_01>(lo, hi))
    }
}

/// Four vectors whose 128-bit lanes hold partial sums (vector `g`, lanes `4l + m`: row `4g +
/// m`'s part `l`) summed into row order.
#[inline(always)]
unsafe fn lanes_of_groups(g: [__m512i; 4]) -> __m512i {
    // SAFETY: the caller's features (AVX-512 F)
    unsafe {
        let x = _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(g[0], g[1]),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(g[0], g[1]),
        );
        let y = _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(g[2], g[3]),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(g[2], g[3]),
        );
        _mm512_add_epi32(_mm512_shuffle_i32x4::<0b10_00_10_00>(x, y), _mm512_shuffle_i32x4::<0b11_01_11_01>(x, y))
    }
}
