//! The q4 lanes kernel's prompt tiles (2 tokens or more a product) over activations laid out
//! for them once per product input ([`PromptActs`]: as the input holds them, `act_tiles.rs`).
//!
//! The tile of `avx512_q4_rows.rs` reads each token's bytes, bias and scale where the quantized
//! activations keep them (`[tokens, cols]`, `[tokens, groups]`): every token of a tile has its
//! own row, so each group costs a handful of scalar address computations, bounds checks and
//! spills a token beside its eight `vpdpbusd`, and the bias (`-8` times the group's activation
//! sum) went from an integer register to a vector (a shuffle-port op) a token and group. Here
//! the tokens of a tile are interleaved, 32-value block by block (`[block, token, 32 bytes]`),
//! and their biases and scales group by group (`[group, token]`, the bias already times -8):
//! the tile walks three pointers with constant offsets, and the bias is broadcast straight from
//! memory (a load, no shuffle).
//!
//! The products are the tile's of `avx512_q4_rows.rs` in every step: each group's integer sum
//! starts at the bias and takes the same `vpdpbusd` in the same accumulators, then one
//! conversion, the product of the weight and activation scales, one FMA; the same bits.

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::act::QuantAct;
use crate::act_tiles::{ActTiles, TileOrder};

/// Rows a vector holds (the lane order's blocks).
const LANES: usize = crate::lanes::LANE_ROWS;

/// Tokens a tile runs at most (as the tile of `avx512_q4_rows.rs`).
pub(super) const MAX_TOKENS: usize = crate::act_tiles::RUN_TOKENS;

/// A product's activations in its tiles' order ([`TileOrder::Runs`]): tokens in runs of
/// [`MAX_TOKENS`] (the last run shorter), each run laid out on its own from `t0 * cols`
/// (values) and `t0 * groups` (biases, scales) for its first token `t0`.
pub(super) struct PromptActs<'a> {
    /// run from token `t0` of `tn` tokens: block `b` of its token `t` at `t0 cols + (b tn + t) 32`
    q: &'a [i8],
    /// `-8 * sums`, at `t0 groups + g tn + t`
    bias: &'a [i32],
    /// the activation scales, as `bias`
    scales: &'a [f32],
    cols: usize,
    ng: usize,
}

impl<'a> PromptActs<'a> {
    fn of(t: &'a ActTiles, a: &QuantAct) -> PromptActs<'a> {
        PromptActs { q: t.values(), bias: t.bias(), scales: t.scales(), cols: a.cols, ng: a.cols / a.group }
    }
}

thread_local! {
    /// The thread's own layout, for an input laid out for other tiles (one product at a time).
    static ACTS: RefCell<ActTiles> = RefCell::new(ActTiles::default());
}

/// `f` with the `n` tokens of `a` (groups of whole 32-value blocks) laid out for the tiles: as
/// the input holds them when it was quantized for this tier and token count, else laid out here.
pub(super) fn with_prompt_acts<R>(a: &QuantAct, n: usize, f: impl FnOnce(&PromptActs) -> R) -> R {
    if a.tiles.order() == (TileOrder::Runs, n) {
        return f(&PromptActs::of(&a.tiles, a));
    }
    ACTS.with(|p| {
        let mut p = p.borrow_mut();
        p.prepare(TileOrder::Runs, n, a.cols, a.group);
        let mut all = p.all_mut();
        for t in 0..n {
            let r = a.row(t);
            all.put(t, r.q, r.sums, r.scales);
        }
        f(&PromptActs::of(&p, a))
    })
}

/// One 16-row block in lane order (`bq`, its scales `bs`: `avx512_q4_rows.rs`'s gathered
/// block) times the run of `T` tokens from `t0` of `p`, into `out[..T]`: `A` accumulators a
/// token, groups of `B` 32-value blocks.
///
/// # Safety
/// AVX-512 F, BW and VNNI; `bq` holds the block's `cols / 2 * 16` bytes and `bs` its
/// `groups * 16` scales; `p` was filled for a product of at least `t0 + T` tokens whose run from
/// `t0` has `T` tokens, with groups of `32 B`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile<const T: usize, const A: usize, const B: usize>(
    p: &PromptActs,
    bq: &[u8],
    bs: &[f32],
    t0: usize,
    out: &mut [[f32; LANES]; MAX_TOKENS],
) {
    debug_assert!(bq.len() >= p.cols / 2 * LANES && bs.len() >= p.ng * LANES && p.q.len() >= (t0 + T) * p.cols);
    let nibble = _mm512_set1_epi8(0x0F);
    let mut f = [_mm512_setzero_ps(); T];
    let mut w = bq.as_ptr();
    // SAFETY (the pointers below): the run's values, biases and scales lie inside `p`, the
    // block's inside `bq` and `bs` (the caller's guarantees); each moves on by what it read
    let mut x = unsafe { p.q.as_ptr().add(t0 * p.cols) };
    let (mut bias, mut sc) = unsafe { (p.bias.as_ptr().add(t0 * p.ng), p.scales.as_ptr().add(t0 * p.ng)) };
    for g in 0..p.ng {
        let mut acc = [[_mm512_setzero_si512(); A]; T];
        for (t, acc) in acc.iter_mut().enumerate() {
            acc[0] = _mm512_set1_epi32(unsafe { *bias.add(t) });
        }
        for _ in 0..B {
            for j in 0..4 {
                // the block's word j of 16 rows
                let v = unsafe { _mm512_loadu_si512(w.add(64 * j) as *const _) };
                let (lo, hi) = (_mm512_and_si512(v, nibble), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble));
                for (t, acc) in acc.iter_mut().enumerate() {
                    // values 4 j.. and 16 + 4 j.. of the block of token t
                    let (xl, xh) = unsafe {
                        let q = x.add(32 * t + 4 * j);
                        ((q as *const i32).read_unaligned(), (q.add(16) as *const i32).read_unaligned())
                    };
                    let (kl, kh) = ((2 * j) % A, (2 * j + 1) % A);
                    acc[kl] = _mm512_dpbusd_epi32(acc[kl], lo, _mm512_set1_epi32(xl));
                    acc[kh] = _mm512_dpbusd_epi32(acc[kh], hi, _mm512_set1_epi32(xh));
                }
            }
            (w, x) = (w.wrapping_add(256), x.wrapping_add(32 * T));
        }
        let ws = unsafe { _mm512_loadu_ps(bs.as_ptr().add(16 * g)) };
        for (t, f) in f.iter_mut().enumerate() {
            let isum = acc[t].iter().skip(1).fold(acc[t][0], |s, v| _mm512_add_epi32(s, *v));
            let s = _mm512_mul_ps(ws, _mm512_set1_ps(unsafe { *sc.add(t) }));
            *f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, *f);
        }
        (bias, sc) = (bias.wrapping_add(T), sc.wrapping_add(T));
    }
    for (o, f) in out.iter_mut().zip(f) {
        // SAFETY: 16 floats
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), f) };
    }
}
