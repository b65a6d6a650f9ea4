//! The element types a KV cache keeps keys and values in, and how each widens to f32 for
//! attention: f32 itself, bf16 (the high half of an f32: widening is a shift) and IEEE f16
//! (`vcvtph2ps`). Attention reads the cache's own elements and widens them a vector at a time
//! as it multiplies, so a long context's cache is never copied out in f32, and the bytes read
//! per key are the element's.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A KV cache element. Rounding to it happens once, when a key or value is stored; every sum
/// after that is f32 over the widened values (exactly the stored values: bf16 and f16 widen
/// without error).
pub trait KvElem: sealed::Sealed + Copy + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static {
    /// Bytes of one element.
    const BYTES: usize;
    fn to_f32(self) -> f32;
    /// Rounded to nearest, ties to even (as torch's `.to(bfloat16 / float16)`).
    fn from_f32(x: f32) -> Self;
    /// 16 elements from `p`, widened.
    ///
    /// # Safety
    /// AVX-512 F present; 16 elements readable at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;
    /// 8 elements from `p`, widened.
    ///
    /// # Safety
    /// AVX2 and F16C present; 8 elements readable at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;
}

mod sealed {
    /// Only this module's types: [`super::as_elems`] relies on what they are.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::Bf16 {}
    impl Sealed for super::F16 {}
}

/// bfloat16 bits: an f32's sign, exponent and top 7 mantissa bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

/// IEEE 754 half-precision bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct F16(pub u16);

impl KvElem for f32 {
    const BYTES: usize = 4;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> f32 {
        x
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller's guarantees
        unsafe { _mm512_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's guarantees
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl KvElem for Bf16 {
    const BYTES: usize = 2;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::quant::bf16_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Bf16 {
        Bf16(crate::quant::f32_to_bf16(x))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Bf16) -> __m512 {
        // SAFETY: the caller's guarantees (16 x 2 bytes)
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())))) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Bf16) -> __m256 {
        // SAFETY: the caller's guarantees (8 x 2 bytes)
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())))) }
    }
}

impl KvElem for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::from_bits(self.0).to_f32()
    }
    #[inline(always)]
    fn from_f32(x: f32) -> F16 {
        F16(half::f16::from_f32(x).to_bits())
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const F16) -> __m512 {
        // SAFETY: the caller's guarantees (16 x 2 bytes)
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const F16) -> __m256 {
        // SAFETY: the caller's guarantees (8 x 2 bytes)
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

/// `x` rounded to `E` and widened back: what a cache of `E` holds of `x`.
pub fn stored<E: KvElem>(x: f32) -> f32 {
    E::from_f32(x).to_f32()
}

/// Two-byte elements seen as their bits: a cache allocates `u16` (zeroed pages the OS maps
/// on first touch) and hands its elements out as `E`.
pub fn as_elems<E: KvElem>(bits: &[u16]) -> &[E] {
    assert_eq!(E::BYTES, 2, "two-byte elements");
    // SAFETY: Bf16 and F16 are repr(transparent) over u16 (the assert rules out f32), so the
    // same memory, length and alignment
    unsafe { std::slice::from_raw_parts(bits.as_ptr().cast(), bits.len()) }
}
