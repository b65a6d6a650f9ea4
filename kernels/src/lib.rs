//! Numeric kernels of moescope: the weight formats (f32, bf16, q8, q4), their dot products with
//! a scalar reference and SIMD paths chosen at run time, and the element-wise ops of a
//! transformer layer (RMSNorm, RoPE, softmax, SwiGLU) and attention over a KV cache.
//!
//! No I/O, no model knowledge and no threads: callers hand in slices and split the work.

pub mod act;
pub mod attn;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod dot;
pub mod isa;
pub mod mat;
pub mod ops;
pub mod prefetch;
pub mod quant;

pub use act::QuantAct;
pub use isa::Isa;
pub use mat::{Mat, MatData};
pub use quant::Format;
