//! The compute peak of a tier, measured: independent chains of the instruction the q4 kernels
//! are built on, so a prefill's multiply-adds a second can be read as a share of what the cores
//! retire (issue 45 asks for the share; a quoted clock or port count is a guess on a virtual
//! machine, whose vCPUs may be hyperthreads of fewer cores).
//!
//! - int8 `vpdpbusd zmm` (the VNNI tier): 12 accumulators, each a chain of one instruction a
//!   step, 64 multiply-adds an instruction;
//! - AMX `tdpbssd` (where granted): four 16 x 16 x 64 sum tiles over one pair of operand tiles,
//!   16384 multiply-adds an instruction;
//! - f32 `vfmadd231ps zmm` (the float work: routers, attention, the delta rule): 12 chains, 16
//!   multiply-adds an instruction.
//!
//! Each probe returns its sums' total too, which the caller checks against the count the
//! arithmetic gives (so an instruction dropped or folded away shows).

use crate::Isa;

/// Accumulator chains a vector probe keeps in flight (latency 4-5 x 2 ports, with room).
const CHAINS: usize = 12;

/// What one probe did: multiply-adds and the exact sum they should have left.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Work {
    pub macs: u64,
    /// the probe's sums, reduced
    pub total: f64,
    /// what they must be: each multiply-add's product is known
    pub expected: f64,
}

/// `iters` steps (at most 2^27) of every chain of `vpdpbusd` on this thread (unsigned 1 x
/// signed 2 in each byte pair: 8 a lane and step).
pub fn vnni(iters: u64) -> Option<Work> {
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() >= Isa::Avx512 {
        // each lane grows 8 a step: below 2^31 for up to 2^28 steps
        let iters = iters.min(1 << 27);
        // SAFETY: the AVX-512 tier (F, BW, VNNI) was detected
        let total = unsafe { vnni_chains(iters) };
        let expected = (iters * CHAINS as u64 * 16 * 8) as f64;
        return Some(Work { macs: iters * CHAINS as u64 * 64, total: total as f64, expected });
    }
    let _ = iters;
    None
}

/// `iters` steps (at most 2^23) of every chain of `vfmadd231ps` on this thread (each lane adds
/// 0.5 a step, exact in f32 below 2^24).
pub fn fma(iters: u64) -> Option<Work> {
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() >= Isa::Avx512 {
        let iters = iters.min(1 << 23);
        // SAFETY: AVX-512 F was detected
        let total = unsafe { fma_chains(iters) };
        let expected = iters as f64 * 0.5 * (CHAINS * 16) as f64;
        return Some(Work { macs: iters * CHAINS as u64 * 16, total, expected });
    }
    let _ = iters;
    None
}

/// `iters` rounds (at most 2^23) of four `tdpbssd` on this thread, where AMX is granted (signed
/// 1 x 2 bytes: each sum grows 128 a round).
pub fn amx(iters: u64) -> Option<Work> {
    #[cfg(target_arch = "x86_64")]
    if crate::amx::granted() {
        // each int32 sum grows 128 a round: below 2^31 for up to 2^24 rounds (a calibrated
        // count of 300 ms passed that on a fast core, and the check caught the wrapped sums)
        let iters = iters.min(1 << 23);
        // SAFETY: granted
        let total = unsafe { amx_tiles(iters) };
        let expected = (iters * 4 * 256 * 128) as f64;
        return Some(Work { macs: iters * 4 * 16 * 16 * 64, total: total as f64, expected });
    }
    let _ = iters;
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_chains(iters: u64) -> i64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_epi8(std::hint::black_box(1)), _mm512_set1_epi8(std::hint::black_box(2)));
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm512_dpbusd_epi32(*c, a, b);
        }
    }
    // every lane in i64 (16 lanes of a chain overflow an i32)
    acc.iter()
        .map(|v| {
            let mut lanes = [0i32; 16];
            // SAFETY: 16 int32 lanes into 64 bytes
            unsafe { _mm512_storeu_si512(lanes.as_mut_ptr() as *mut _, *v) };
            lanes.iter().map(|&x| x as i64).sum::<i64>()
        })
        .sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains(iters: u64) -> f64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(std::hint::black_box(0.5)), _mm512_set1_ps(std::hint::black_box(1.0)));
    let mut acc = [_mm512_setzero_ps(); CHAINS];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm512_fmadd_ps(a, b, *c);
        }
    }
    acc.iter().map(|v| _mm512_reduce_add_ps(*v) as f64).sum()
}

/// # Safety
/// [`crate::amx::granted`].
#[cfg(target_arch = "x86_64")]
unsafe fn amx_tiles(iters: u64) -> i64 {
    use crate::amx::{self, TileConfig};
    let ones = [1i8; 16 * 64];
    let twos = [2i8; 16 * 64];
    let mut c = TileConfig::new();
    for t in 0..6 {
        c.set(t, 16, 64);
    }
    let mut out = [0i32; 16 * 16];
    // SAFETY (all): granted (the caller's); tiles 0-5 configured as 16 rows of 64 bytes, the
    // operands' 16 rows of 64 bytes readable, the output's writable
    unsafe {
        c.load();
        amx::load::<4>(ones.as_ptr() as *const u8, 64);
        amx::load::<5>(twos.as_ptr() as *const u8, 64);
        amx::zero::<0>();
        amx::zero::<1>();
        amx::zero::<2>();
        amx::zero::<3>();
        for _ in 0..iters {
            amx::dot_ss::<0, 4, 5>();
            amx::dot_ss::<1, 4, 5>();
            amx::dot_ss::<2, 4, 5>();
            amx::dot_ss::<3, 4, 5>();
        }
        let mut total = 0i64;
        for store in [amx::store::<0>, amx::store::<1>, amx::store::<2>, amx::store::<3>] {
            store(out.as_mut_ptr() as *mut u8, 64);
            total += out.iter().map(|&v| v as i64).sum::<i64>();
        }
        amx::release();
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each probe leaves the sums its instruction count implies, counted here from the
    /// operands (a dropped or folded instruction would not), where the tier is there to run it.
    #[test]
    fn the_probes_do_the_work_they_count() {
        // past where an int32 reduction of a chain's lanes would wrap (2^31 / 16 / 8 steps)
        let n: u64 = (1 << 24) + 3;
        if let Some(w) = vnni(n) {
            // 12 chains x 16 lanes x 4 byte pairs of 1 x 2 a step
            assert_eq!(w.total, (n * 12 * 16 * 4 * 2) as f64, "vnni");
            assert_eq!(w.macs, n * 12 * 64);
        }
        if let Some(w) = fma(1000) {
            assert_eq!(w.total, 1000.0 * 12.0 * 16.0 * 0.5, "fma");
            assert_eq!(w.macs, 1000 * 12 * 16);
        }
        // past where the int32 sums would wrap (2^31 / 128 rounds): held to the cap
        if let Some(w) = amx((1 << 24) + 3) {
            // 4 tiles of 16 x 16 sums, each 64 products of 1 x 2 a round
            let m: u64 = 1 << 23;
            assert_eq!(w.total, (m * 4 * 256 * 64 * 2) as f64, "amx");
            assert_eq!(w.macs, m * 4 * 16 * 16 * 64);
        }
    }
}
