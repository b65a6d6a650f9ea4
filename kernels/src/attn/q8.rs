//! llama.cpp's q8_0 as a KV cache keeps it: each row's values (a key's or a value's `hd`
//! dims) in blocks of [`Q8_GROUP`], each an f16 scale `d = max|x| / 127` and 32 codes
//! `round(x / d)` (ggml's `quantize_row_q8_0_ref`: the codes from the f32 `d`, halves away from
//! zero), read back as `d * code` (exact in f32: 11 bits times 8). 34 bytes per 32 values.
//!
//! The codes keep the other types' layout (keys transposed in blocks of [`KEY_BLOCK`]
//! positions, values in rows), so the folds index them alike; the scales lie in an array of
//! their own:
//! - values: one per 32 values of a row, element `g`'s is `g / 32`;
//! - keys: per key block `[hd / 32, KEY_BLOCK]`, a row of a block's positions for each group of
//!   32 dims, so the 16 lanes of one dim find their 16 scales side by side: element `g`
//!   (block, dim, lane) has scale `g / (32 KEY_BLOCK) * KEY_BLOCK + g % KEY_BLOCK`.
//!
//! Both need `hd` a multiple of 32 (the caller checks).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{F16, KEY_BLOCK, KvElem, KvRead};

/// Values per q8_0 block.
pub const Q8_GROUP: usize = 32;

/// `x` (32 values) quantized: the codes into `codes`, the scale returned.
pub fn q8_0(x: &[f32], codes: &mut [i8]) -> F16 {
    debug_assert!(x.len() == Q8_GROUP && codes.len() == Q8_GROUP);
    // the activations' quantizer is ggml's arithmetic with the scale left in f32
    let mut d = [0f32];
    crate::quant::quantize_q8_row(x, Q8_GROUP, codes, &mut d);
    F16::from_f32(d[0])
}

/// q8_0 codes and scales in a layout `L` ([`KeyBlocks`] or [`ValueRows`]), from element `at`.
#[derive(Debug)]
pub struct Q8<'a, L> {
    codes: &'a [i8],
    scales: &'a [F16],
    at: usize,
    layout: std::marker::PhantomData<L>,
}

impl<L> Clone for Q8<'_, L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L> Copy for Q8<'_, L> {}

/// q8_0 keys, transposed blocks as the cache keeps them (`codes`: `[blocks, hd, KEY_BLOCK]`,
/// `scales`: `[blocks, hd / 32, KEY_BLOCK]`).
pub type Q8Keys<'a> = Q8<'a, KeyBlocks>;

/// q8_0 value rows (`codes`: `[positions, hd]`, `scales`: `[positions, hd / 32]`).
pub type Q8Rows<'a> = Q8<'a, ValueRows>;

/// Where each code's scale lies, and the scales of a vector of codes.
pub trait Layout: Send + Sync + 'static {
    /// Element `g`'s scale's index.
    fn scale(g: usize) -> usize;
    /// The scales of elements `g..g + 16`, widened.
    ///
    /// # Safety
    /// AVX-512 F; `g` a multiple of 16; the scales of `g..g + 16` inside `s`'s allocation.
    #[cfg(target_arch = "x86_64")]
    unsafe fn scales16(s: *const F16, g: usize) -> __m512;
    /// The scales of elements `g..g + 8`, widened.
    ///
    /// # Safety
    /// AVX2 and F16C; `g` a multiple of 8; the scales of `g..g + 8` inside `s`'s allocation.
    #[cfg(target_arch = "x86_64")]
    unsafe fn scales8(s: *const F16, g: usize) -> __m256;
}

/// Keys: 16 lanes of one dim have 16 scales side by side.
#[derive(Debug)]
pub struct KeyBlocks;

/// Values: 16 values of a row share one scale.
#[derive(Debug)]
pub struct ValueRows;

impl Layout for KeyBlocks {
    #[inline(always)]
    fn scale(g: usize) -> usize {
        g / (Q8_GROUP * KEY_BLOCK) * KEY_BLOCK + g % KEY_BLOCK
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales16(s: *const F16, g: usize) -> __m512 {
        // SAFETY: the caller's guarantees (a lane's 16 in one dim's row of a block)
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(s.add(Self::scale(g)).cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales8(s: *const F16, g: usize) -> __m256 {
        // SAFETY: as scales16's, with 8
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(s.add(Self::scale(g)).cast())) }
    }
}

impl Layout for ValueRows {
    #[inline(always)]
    fn scale(g: usize) -> usize {
        g / Q8_GROUP
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales16(s: *const F16, g: usize) -> __m512 {
        // SAFETY: the caller's guarantees (one block's 16 values)
        unsafe { _mm512_cvtph_ps(_mm256_set1_epi16((*s.add(Self::scale(g))).0 as i16)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales8(s: *const F16, g: usize) -> __m256 {
        // SAFETY: as scales16's, with 8
        unsafe { _mm256_cvtph_ps(_mm_set1_epi16((*s.add(Self::scale(g))).0 as i16)) }
    }
}

impl<'a, L: Layout> Q8<'a, L> {
    pub fn new(codes: &'a [i8], scales: &'a [F16]) -> Q8<'a, L> {
        assert_eq!(codes.len(), scales.len() * Q8_GROUP, "q8_0: a scale per 32 codes");
        Q8 { codes, scales, at: 0, layout: std::marker::PhantomData }
    }
}

/// 16 codes from `p`, as f32.
///
/// # Safety
/// AVX-512 F; 16 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn codes16(p: *const i8) -> __m512 {
    // SAFETY: the caller's guarantees
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))) }
}

/// 8 codes from `p`, as f32.
///
/// # Safety
/// AVX2; 8 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn codes8(p: *const i8) -> __m256 {
    // SAFETY: the caller's guarantees
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))) }
}

impl<L: Layout> KvRead for Q8<'_, L> {
    const WIDEN: bool = true;
    #[inline(always)]
    fn len(self) -> usize {
        self.codes.len() - self.at
    }
    #[inline(always)]
    fn skip(self, at: usize) -> Self {
        assert!(at <= self.len());
        Q8 { at: self.at + at, ..self }
    }
    #[inline(always)]
    fn get(self, i: usize) -> f32 {
        let g = self.at + i;
        self.codes[g] as f32 * self.scales[L::scale(g)].to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(self, i: usize) -> __m512 {
        let g = self.at + i;
        debug_assert!(g.is_multiple_of(16) && i + 16 <= self.len());
        // SAFETY: 16 codes at g inside `codes` and their scales inside `scales` (the caller's
        // guarantees; one scale per 32 codes, as `new` checked)
        unsafe { _mm512_mul_ps(codes16(self.codes.as_ptr().add(g)), L::scales16(self.scales.as_ptr(), g)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(self, i: usize) -> __m256 {
        let g = self.at + i;
        debug_assert!(g.is_multiple_of(8) && i + 8 <= self.len());
        // SAFETY: as load16's, with 8
        unsafe { _mm256_mul_ps(codes8(self.codes.as_ptr().add(g)), L::scales8(self.scales.as_ptr(), g)) }
    }
}

/// Key `src` (`[hd]`, `hd` a multiple of 32) of position `pos` quantized into a head's
/// transposed blocks: its codes down its lane of the block, its scales in the block's scale
/// rows (the layout [`Q8Keys`] reads).
pub fn store_key(codes: &mut [i8], scales: &mut [F16], pos: usize, src: &[f32]) {
    let hd = src.len();
    assert!(hd.is_multiple_of(Q8_GROUP), "q8_0 keys of {hd} dims");
    let (blk, lane) = (pos / KEY_BLOCK, pos % KEY_BLOCK);
    let mut q = [0i8; Q8_GROUP];
    for (g, x) in src.chunks_exact(Q8_GROUP).enumerate() {
        scales[(blk * hd / Q8_GROUP + g) * KEY_BLOCK + lane] = q8_0(x, &mut q);
        for (i, &c) in q.iter().enumerate() {
            codes[(blk * hd + g * Q8_GROUP + i) * KEY_BLOCK + lane] = c;
        }
    }
}

/// Values `src` (a multiple of 32 long) quantized as the row at element `at` (a multiple of
/// 32): the layout [`Q8Rows`] reads.
pub fn store_row(codes: &mut [i8], scales: &mut [F16], at: usize, src: &[f32]) {
    assert!(at.is_multiple_of(Q8_GROUP) && src.len().is_multiple_of(Q8_GROUP), "q8_0 row of {} at {at}", src.len());
    for (g, x) in src.chunks_exact(Q8_GROUP).enumerate() {
        let a = at + g * Q8_GROUP;
        scales[a / Q8_GROUP] = q8_0(x, &mut codes[a..a + Q8_GROUP]);
    }
}
