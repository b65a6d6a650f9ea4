//! Numeric kernels of moescope: the weight formats (f32, bf16, q8, q4), their dot products with
//! a scalar reference and SIMD paths chosen at run time, and the element-wise ops of a
//! transformer layer (RMSNorm, RoPE, softmax, SwiGLU) and attention over a KV cache.
//!
//! No I/O, no model knowledge and no threads: callers hand in slices and split the work.

// The reference loops index several arrays by one position, as the formulas they implement
// read; iterator chains would hide which lanes meet.
#![allow(clippy::needless_range_loop)]

pub mod act;
pub mod act_tiles;
pub mod amx;
pub mod attn;
pub mod delta;
pub mod dot;
pub mod ggml;
pub mod ggml_codes;
#[cfg(target_arch = "x86_64")]
mod ggml_codes_avx512;
pub mod ggml_iq;
pub mod ggml_quant;
pub mod isa;
pub mod kscales;
pub mod lanes;
pub mod mat;
pub mod mxfp4;
pub mod ops;
pub mod peak;
pub mod prefetch;
pub mod quant;

pub use act::QuantAct;
pub use isa::Isa;
pub use mat::{Mat, MatData};
pub use quant::Format;

/// What the unit tests of several modules share.
#[cfg(test)]
pub(crate) mod testutil {
    /// Uniform values in [-0.5, 0.5) from a 64-bit LCG seeded with `seed`.
    pub fn uniform(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        }
    }
}
