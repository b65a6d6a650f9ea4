//! How attention reads a cache's keys or values: element `i` of the layout it is given
//! (transposed key blocks, or value rows), widened to f32, alone or a vector at a time. Plain
//! elements ([`KvElem`] slices) are read where they lie; llama.cpp's q8_0 ([`super::q8`]) also
//! finds each value's block scale. Every read value is exactly the stored one (a code times its
//! f16 scale fits f32's mantissa), so the sums over them are the same whatever the type.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::KvElem;
use crate::Isa;

/// A view of cached keys or values, indexed from its start.
pub trait KvRead: Copy + Send + Sync {
    /// Whether a fold widens each block's keys and values into f32 once ([`widen`](Self::widen))
    /// rather than reading them as it multiplies: where a read costs several operations (q8_0's
    /// conversion and scale) and a block is read for several groups of queries. The same values
    /// either way, so the same bits.
    const WIDEN: bool = false;
    /// Elements readable from the start.
    fn len(self) -> usize;
    fn is_empty(self) -> bool {
        self.len() == 0
    }
    /// The view from element `at` on.
    fn skip(self, at: usize) -> Self;
    /// Element `i`, widened.
    fn get(self, i: usize) -> f32;
    /// Elements `0..out.len()` widened into `out`, a vector at a time at the tier `isa` names
    /// (`out.len()` a multiple of 16 from a key block's or a row's start).
    #[inline(always)]
    fn widen(self, isa: Isa, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            assert!(out.len().is_multiple_of(16) && out.len() <= self.len());
            if isa >= Isa::Avx512 {
                for (i, o) in out.chunks_exact_mut(16).enumerate() {
                    // SAFETY: the tier says AVX-512 F is present; 16 elements at 16 i, inside
                    // the view as asserted
                    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), self.load16(16 * i)) };
                }
                return;
            }
            if isa.has_avx2() {
                for (i, o) in out.chunks_exact_mut(8).enumerate() {
                    // SAFETY: the tier says AVX2 and F16C are present; as above, with 8
                    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), self.load8(8 * i)) };
                }
                return;
            }
        }
        let _ = isa;
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.get(i);
        }
    }
    /// Elements `i..i + 16`, widened.
    ///
    /// # Safety
    /// AVX-512 F present; `i + 16 <= len`; `i` a multiple of 16 from a block's or a row's start.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(self, i: usize) -> __m512;
    /// Elements `i..i + 8`, widened.
    ///
    /// # Safety
    /// AVX2 and F16C present; `i + 8 <= len`; `i` a multiple of 8 from a block's or a row's start.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(self, i: usize) -> __m256;
}

impl<E: KvElem> KvRead for &[E] {
    #[inline(always)]
    fn len(self) -> usize {
        <[E]>::len(self)
    }
    #[inline(always)]
    fn skip(self, at: usize) -> Self {
        &self[at..]
    }
    #[inline(always)]
    fn get(self, i: usize) -> f32 {
        self[i].to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(self, i: usize) -> __m512 {
        debug_assert!(i + 16 <= self.len());
        // SAFETY: the caller's guarantees
        unsafe { E::load16(self.as_ptr().add(i)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(self, i: usize) -> __m256 {
        debug_assert!(i + 8 <= self.len());
        // SAFETY: the caller's guarantees
        unsafe { E::load8(self.as_ptr().add(i)) }
    }
}
