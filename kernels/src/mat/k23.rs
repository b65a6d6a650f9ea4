//! Q2_K, Q3_K, Q4_K and IQ4_XS kept as the file's blocks (`MatData::Blocks`), computed from
//! their codes as ggml computes them against Q8_K activations: activations quantized per 256
//! values (one scale a block), a block's product an integer sum of its sub-blocks'
//! code-activation dots weighted by their integer scales (per 16 values: the sub-blocks of 32 of
//! Q4_K and IQ4_XS count twice), and the mins' (Q2_K, Q4_K) or offsets' (Q3_K) term an integer
//! sum of the activations' sums per 16; floats only where a block's sums meet `d * a_scale`.
//!
//! The integer sums are exact, so one float order defines the bits at every tier: a row's
//! product is one float sum over its blocks in order, `acc += sum * (d * a_scale)` with `sum`
//! the block's whole integer sum (Q3_K's offsets taken from it: they share `d`), then for Q2_K
//! and Q4_K `acc -= mins * (dmin * a_scale)`, `mins` its integer sum of the mins' terms. The float work
//! is per (block, row, token) and nothing is per lane, so rows can sit in a vector's lanes.
//! The scalar code here is that order; `avx512_k23.rs` (a row at a time, for decode and the
//! rows left over), `avx512_k23_rows.rs` and `avx512_q4k_rows.rs` (16 rows in the lanes, for
//! a prompt) and `avx2_k23.rs` are its vector forms.

use std::cell::RefCell;
use std::ops::Range;

use crate::act::QuantAct;
use crate::ggml::{BlockType, IQ4_VALUES, f16_at, k_scale_min, q3_k_scale};
use crate::isa::Isa;

/// Values an activation scale covers for these types (ggml's Q8_K block).
pub const K23_GROUP: usize = 256;

/// Whether blocks of `t` are computed here (else through their decoded q8 matrix).
pub fn fused(t: BlockType) -> bool {
    matches!(t, BlockType::Q2K | BlockType::Q3K | BlockType::Q4K | BlockType::Iq4Xs)
}

/// Whether `t`'s mins have their own factor `dmin` (else they share `d`, or there are none).
pub(super) fn own_mins(t: BlockType) -> bool {
    matches!(t, BlockType::Q2K | BlockType::Q4K)
}

/// The value at byte `p` (0..64) of code vector `k` (0..4) of a block: Q2_K's and Q3_K's 64 code
/// bytes shifted by `2k` hold run `k` (values `32k..32k + 32`) in bytes 0..32 and run `4 + k` in
/// bytes 32..64; Q4_K's and IQ4_XS's vectors are the values in order, 64 a vector.
pub(super) fn value_at(t: BlockType, k: usize, p: usize) -> usize {
    match t {
        BlockType::Iq4Xs | BlockType::Q4K => 64 * k + p,
        _ => 128 * (p / 32) + 32 * k + p % 32,
    }
}

/// A block's integer parts: codes (Q2_K 0..3; Q3_K 0..7, the code + 4; Q4_K 0..15; IQ4_XS its
/// codebook's signed values), a scale per 16 values, the mins' weight per 16 (Q2_K, Q4_K: its
/// min; Q3_K: 4 x its scale, the offset of its codes; IQ4_XS: none), and the factors of the two
/// sums (`d`, and `dmin` or `d`).
pub(super) struct Unpacked {
    pub codes: [i16; 256],
    pub sc: [i16; 16],
    pub mn: [i16; 16],
    pub d: f32,
    pub dm: f32,
}

/// Block `b` of type `t` (Q2_K, Q3_K, Q4_K or IQ4_XS) in its integer parts.
pub(super) fn unpack(t: BlockType, b: &[u8]) -> Unpacked {
    let mut u = Unpacked { codes: [0; 256], sc: [0; 16], mn: [0; 16], d: 0.0, dm: 0.0 };
    if t == BlockType::Q4K {
        // values 64c..64c + 32: the low nibbles of bytes 16 + 32c.., the next 32 their high ones
        for (i, c) in u.codes.iter_mut().enumerate() {
            *c = ((b[16 + 32 * (i / 64) + i % 32] >> (4 * ((i / 32) % 2))) & 15) as i16;
        }
        for g in 0..16 {
            let (sc, m) = k_scale_min(&b[4..16], g / 2);
            (u.sc[g], u.mn[g]) = (sc as i16, m as i16);
        }
        (u.d, u.dm) = (f16_at(b, 0), f16_at(b, 2));
        return u;
    }
    if t == BlockType::Iq4Xs {
        // sub-block j of 32: the low nibbles of bytes 8 + 16j.. then their high nibbles
        for (i, c) in u.codes.iter_mut().enumerate() {
            let byte = b[8 + 16 * (i / 32) + i % 16];
            *c = IQ4_VALUES[((byte >> (4 * ((i / 16) % 2))) & 15) as usize] as i16;
        }
        let high = u16::from_le_bytes([b[2], b[3]]);
        for g in 0..16 {
            let j = g / 2;
            let ls = (b[4 + j / 2] >> (4 * (j % 2))) & 15 | (((high >> (2 * j)) & 3) as u8) << 4;
            u.sc[g] = ls as i16 - 32;
        }
        u.d = f16_at(b, 0);
        u.dm = u.d;
        return u;
    }
    // value i: bits 2k..2k+1 of byte 32h + i % 32, h = i / 128, k = (i / 32) % 4
    let qs = if t == BlockType::Q2K { &b[16..80] } else { &b[32..96] };
    for (i, c) in u.codes.iter_mut().enumerate() {
        *c = ((qs[32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3) as i16;
    }
    if t == BlockType::Q2K {
        for j in 0..16 {
            u.sc[j] = (b[j] & 15) as i16;
            u.mn[j] = (b[j] >> 4) as i16;
        }
        (u.d, u.dm) = (f16_at(b, 80), f16_at(b, 82));
    } else {
        for (i, c) in u.codes.iter_mut().enumerate() {
            // the high bit set: no offset, so the code + 4 is the two bits + 4
            *c += 4 * ((b[i % 32] >> (i / 32)) & 1) as i16;
        }
        for j in 0..16 {
            u.sc[j] = q3_k_scale(&b[96..108], j) as i16 - 32;
            u.mn[j] = 4 * u.sc[j];
        }
        u.d = f16_at(b, 108);
        u.dm = u.d;
    }
    u
}

/// One row's product with one token: `row` the row's blocks, `a` the token's codes in their
/// order, `scales` its scale per 256, `bsums` its sum per 16 (the scalar form of the bits).
pub(super) fn dot_scalar(t: BlockType, row: &[u8], a: &[i8], scales: &[f32], bsums: &[i16]) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(t.block_bytes()).enumerate() {
        let u = unpack(t, blk);
        let a = &a[256 * b..256 * b + 256];
        let bs = &bsums[16 * b..16 * b + 16];
        let mut s: i32 = (0..256).map(|i| u.sc[i / 16] as i32 * u.codes[i] as i32 * a[i] as i32).sum();
        let m: i32 = (0..16).map(|j| u.mn[j] as i32 * bs[j] as i32).sum();
        // Q3_K's offsets share d, so they join the integer sum (IQ4_XS has none: 0)
        if !own_mins(t) {
            s -= m;
        }
        acc += s as f32 * (u.d * scales[b]);
        if own_mins(t) {
            acc -= m as f32 * (u.dm * scales[b]);
        }
    }
    acc
}

/// The sums of each 16 activation codes of `q` (a token's row).
pub(super) fn sub_sums(q: &[i8], out: &mut [i16]) {
    for (o, g) in out.iter_mut().zip(q.chunks_exact(16)) {
        *o = g.iter().map(|&v| v as i16).sum();
    }
}

/// A token's codes with each block's 256 in the order of its code vectors' bytes
/// ([`value_at`]), as the vector kernels multiply them.
fn permute(t: BlockType, q: &[i8], out: &mut [i8]) {
    if matches!(t, BlockType::Iq4Xs | BlockType::Q4K) {
        out.copy_from_slice(q);
        return;
    }
    // vector k's bytes: values 32k.. then 128 + 32k.. (`value_at`), two runs of 32
    for (qb, ob) in q.chunks_exact(K23_GROUP).zip(out.chunks_exact_mut(K23_GROUP)) {
        for (k, o) in ob.chunks_exact_mut(64).enumerate() {
            o[..32].copy_from_slice(&qb[32 * k..32 * k + 32]);
            o[32..].copy_from_slice(&qb[128 + 32 * k..160 + 32 * k]);
        }
    }
}

thread_local! {
    /// The tokens' sums per 16 codes (and, for the AVX-512 kernel, their codes permuted), made
    /// once per product.
    static SUMS: RefCell<(Vec<i16>, Vec<i8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out[(r - rows.start) * n + t]` = row `r` of `q` (rows of `t`'s blocks) times token `t` of `a`
/// (quantized in groups of [`K23_GROUP`]).
pub(super) fn matmul_rows(
    t: BlockType,
    isa: Isa,
    (q, cols): (&[u8], usize),
    a: &QuantAct,
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) {
    debug_assert_eq!(a.group, K23_GROUP);
    let rb = t.bytes_of(cols);
    SUMS.with(|s| {
        let (s, perm) = &mut *s.borrow_mut();
        s.resize(n * cols / 16, 0);
        for tok in 0..n {
            sub_sums(&a.q[tok * cols..(tok + 1) * cols], &mut s[tok * cols / 16..(tok + 1) * cols / 16]);
        }
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2 {
            perm.resize(n * cols, 0);
            permute(t, &a.q[..n * cols], perm);
            // SAFETY: the tier (AVX-512 F, BW, VL, VNNI; or AVX2 and FMA) was detected on this
            // CPU; the matrix's rows, the tokens' codes, scales, permuted codes and sums as the
            // kernels take them
            unsafe {
                if isa >= Isa::Avx512 {
                    // a prompt's rows 16 at a time, in a vector's lanes; the rest one by one
                    let done = if n == 1 {
                        super::avx512_k23_rows::one_token(t, (q, cols), a, (perm, s), rows.clone(), out)
                    } else if matches!(t, BlockType::Q4K | BlockType::Iq4Xs) {
                        super::avx512_q4k_rows::matmul_tiles(t, (q, cols), a, s, n, rows.clone(), out)
                    } else {
                        super::avx512_k23_rows::matmul_tiles(t, (q, cols), a, s, n, rows.clone(), out)
                    };
                    let rest = rows.start + done..rows.end;
                    super::avx512_k23::matmul_rows(t, (q, cols), a, (perm, s), n, rest, &mut out[done * n..])
                } else {
                    super::avx2_k23::matmul_rows(t, (q, cols), a, (perm, s), n, rows, out)
                }
            };
            return;
        }
        let _ = isa;
        for (i, r) in rows.enumerate() {
            let row = &q[r * rb..(r + 1) * rb];
            for tok in 0..n {
                let ng = cols / K23_GROUP;
                out[i * n + tok] = dot_scalar(
                    t,
                    row,
                    &a.q[tok * cols..(tok + 1) * cols],
                    &a.scales[tok * ng..(tok + 1) * ng],
                    &s[tok * cols / 16..(tok + 1) * cols / 16],
                );
            }
        }
    });
}
