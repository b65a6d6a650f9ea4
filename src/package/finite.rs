//! Weights and quantization scales must be finite. The converter refuses non-finite weights,
//! but a package rewritten with matching checksums passes every checksum: a NaN in a weight
//! then vanished silently where activations are quantized (`f32::max` skips NaN, and NaN casts
//! to the integer 0), and the run printed tokens from wrong logits (found by the replay's
//! package mutations that rewrite a tensor with its checksum). Checked where the checksum is:
//! the dense tensors at load, each expert blob at its first read.

use std::path::Path;

use super::PackageError;
use moescope_kernels::ggml_codes::block_halves;
use moescope_kernels::kscales::{K4_RECORD, K6_RECORD};

use super::layout::{DType, ScaleForm, TensorEntry};

/// `t`'s weights and scales are finite in `bytes` (where its `offset` counts from, e.g. its
/// blob), else an error naming `what()` (made only then: expert reads call this per blob) and
/// the file offset (`start`: where `bytes` begin).
pub fn require_finite(
    path: &Path,
    what: impl FnOnce() -> String,
    t: &TensorEntry,
    bytes: &[u8],
    start: u64,
) -> Result<(), PackageError> {
    match first_non_finite(t, bytes) {
        Some(at) => Err(PackageError::Tensor {
            path: path.to_path_buf(),
            name: what(),
            msg: format!("a non-finite value (NaN or infinity) at offset {}", start + at),
        }),
        None => Ok(()),
    }
}

/// The offset in `bytes` (where `t`'s `offset` and `scales_offset` count from) of the first
/// non-finite value of `t`: every value of an f32 or bf16 tensor, the f32 scales (and mins) of a
/// quantized one. Out-of-range entries are the reader's to refuse: they are skipped here.
pub fn first_non_finite(t: &TensorEntry, bytes: &[u8]) -> Option<u64> {
    let end = t.offset.checked_add(t.length)?;
    let blocks = match t.scale_form() {
        ScaleForm::Blocks(b) => Some(b),
        _ => None,
    };
    let from = match t.dtype {
        DType::F32 | DType::Bf16 | DType::Mxfp4 => t.offset,
        _ if blocks.is_some() => t.offset,
        DType::Q8 | DType::Q4 | DType::Q6 => t.scales_offset?,
    };
    let lo = usize::try_from(from).ok()?;
    let hi = usize::try_from(end).ok()?;
    let region = bytes.get(lo..hi)?;
    let at = match t.dtype {
        DType::Bf16 => region.chunks_exact(2).position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7F80 == 0x7F80)? * 2,
        // an exponent byte of 255 is NaN in the OCP MX spec (and 2^128 overflows)
        DType::Mxfp4 => region.chunks_exact(moescope_kernels::mxfp4::BLOCK_BYTES).position(|b| b[0] == 255)? * 17,
        // a file's blocks: their f16 scales (d, and dmin where the type has one)
        _ if let Some(b) = blocks => {
            let bad = |x: &[u8]| block_halves(b, x).iter().any(|h| h & 0x7C00 == 0x7C00);
            region.chunks_exact(b.block_bytes()).position(bad)? * b.block_bytes()
        }
        // k4 records: f16 d and dmin first, an exponent of all ones is infinity or NaN
        DType::Q4 if t.scale_form() == ScaleForm::K4 => {
            region.chunks_exact(K4_RECORD).position(|r| f16_bad(&r[0..2]) || f16_bad(&r[2..4]))? * K4_RECORD
        }
        // f16 scales (and mins)
        DType::Q8 | DType::Q4 if matches!(t.scale_form(), ScaleForm::F16 | ScaleForm::F16Mins) => {
            region.chunks_exact(2).position(f16_bad)? * 2
        }
        // k6 records: f16 d first
        DType::Q6 if t.scale_form() == ScaleForm::K6 => {
            region.chunks_exact(K6_RECORD).position(|r| f16_bad(&r[0..2]))? * K6_RECORD
        }
        _ => region.chunks_exact(4).position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())? * 4,
    };
    Some(from + at as u64)
}

/// Whether the f16 in `b`'s first two bytes is infinite or NaN (its exponent all ones).
fn f16_bad(b: &[u8]) -> bool {
    u16::from_le_bytes([b[0], b[1]]) & 0x7C00 == 0x7C00
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dtype: DType, offset: u64, length: u64, scales_offset: Option<u64>) -> TensorEntry {
        TensorEntry {
            name: "t".into(),
            dtype,
            shape: vec![1, 4],
            group: None,
            layout: "row".into(),
            offset,
            length,
            scales_offset,
            xxh3: None,
        }
    }

    #[test]
    fn finds_a_k4_record_whose_dmin_is_infinite() {
        // 8 value bytes, then 3 records: finite, finite, dmin = +inf (0x7C00)
        let mut b = vec![0u8; 8];
        for dmin in [0x3C00u16, 0x7BFF, 0x7C00] {
            b.extend(0x3C00u16.to_le_bytes());
            b.extend(dmin.to_le_bytes());
            b.extend([0x11u8; 12]);
        }
        let t = TensorEntry { dtype: DType::Q4, layout: "q4_lohi32+k4".into(), ..entry(DType::Q4, 0, 56, Some(8)) };
        assert_eq!(first_non_finite(&t, &b), Some(8 + 32));
        // the same bytes read as f32 scales hold no non-finite value: the form decides
        let plain = TensorEntry { layout: "q4_lohi32".into(), ..t };
        assert_eq!(first_non_finite(&plain, &b), None);
    }

    #[test]
    fn finds_an_f16_scale_that_is_not_finite() {
        // 32 q8 value bytes, then 4 f16 scales: 1, the largest finite, -inf (0xFC00), 1
        let mut b = vec![0x7Fu8; 32];
        for h in [0x3C00u16, 0x7BFF, 0xFC00, 0x3C00] {
            b.extend(h.to_le_bytes());
        }
        let t = TensorEntry { layout: "row_major+f16".into(), ..entry(DType::Q8, 0, 40, Some(32)) };
        assert_eq!(first_non_finite(&t, &b), Some(32 + 4));
        b[36..38].copy_from_slice(&0x7E00u16.to_le_bytes());
        assert_eq!(first_non_finite(&t, &b), Some(32 + 4), "NaN");
        b[36..38].copy_from_slice(&0x0001u16.to_le_bytes());
        assert_eq!(first_non_finite(&t, &b), None, "a subnormal is finite");
    }

    #[test]
    fn finds_a_block_whose_d_or_dmin_is_not_finite() {
        // 4 bytes before, then 3 Q2_K blocks (84 bytes: d at 80, dmin at 82): finite, finite,
        // dmin = NaN (0x7E00)
        let mut b = vec![0u8; 4];
        for dmin in [0x3C00u16, 0xFBFF, 0x7E00] {
            b.extend([0x55u8; 80]);
            b.extend(0x3C00u16.to_le_bytes());
            b.extend(dmin.to_le_bytes());
        }
        let q2k = |length| TensorEntry { layout: "row_major+ggml_q2_k".into(), ..entry(DType::Q8, 4, length, None) };
        assert_eq!(first_non_finite(&q2k(252), &b), Some(4 + 168));
        assert_eq!(first_non_finite(&q2k(168), &b), None);
        // IQ1_M: d is the top nibbles of its four u16 scales (bytes 48..56); 0x7C00 is infinity
        let mut m = vec![0u8; 56];
        for (k, nib) in [0u16, 0, 0xC, 0x7].into_iter().enumerate() {
            m[48 + 2 * k..50 + 2 * k].copy_from_slice(&(nib << 12 | 0x0123).to_le_bytes());
        }
        let iq1m = TensorEntry { layout: "row_major+ggml_iq1_m".into(), ..entry(DType::Q8, 0, 56, None) };
        assert_eq!(first_non_finite(&iq1m, &m), Some(0));
        m[55] &= 0x0F;
        assert_eq!(first_non_finite(&iq1m, &m), None);
    }

    #[test]
    fn finds_an_mxfp4_block_whose_exponent_is_nan() {
        // 3 bytes before, then 3 blocks of 17: exponents 127, 254, 255
        let mut b = vec![0xFFu8; 3];
        for e in [127u8, 254, 255] {
            b.push(e);
            b.extend([0xFFu8; 16]);
        }
        assert_eq!(first_non_finite(&entry(DType::Mxfp4, 3, 51, None), &b), Some(3 + 34));
        assert_eq!(first_non_finite(&entry(DType::Mxfp4, 3, 34, None), &b), None);
    }

    #[test]
    fn finds_nan_and_infinities_in_values_and_scales_only() {
        // 8 bytes before the tensor, then 4 f32
        let mut b = vec![0u8; 8];
        for v in [1.0f32, -2.0, 0.0, 3.5] {
            b.extend(v.to_le_bytes());
        }
        let f32s = entry(DType::F32, 8, 16, None);
        assert_eq!(first_non_finite(&f32s, &b), None);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut c = b.clone();
            c[16..20].copy_from_slice(&bad.to_le_bytes());
            assert_eq!(first_non_finite(&f32s, &c), Some(16), "{bad}");
            let e = require_finite(Path::new("p.moe"), || "t".into(), &f32s, &c, 1000).expect_err("NaN");
            assert!(e.to_string().contains("at offset 1016"), "{e}");
        }
        // quantized: values are bytes (0xFF is a fine int8), only the scales from 16 are f32
        let mut q = b.clone();
        q[8..12].fill(0xFF);
        let q8 = entry(DType::Q8, 8, 16, Some(16));
        assert_eq!(first_non_finite(&q8, &q), None);
        q[20..24].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(first_non_finite(&q8, &q), Some(20));
        // bf16: the top half of an f32 (0x7FC0 NaN, 0xFF80 -inf; 0x7F7F the largest finite)
        let bf = entry(DType::Bf16, 0, 6, None);
        assert_eq!(first_non_finite(&bf, &[0x7F, 0x7F, 0x80, 0x3F, 0, 0]), None);
        assert_eq!(first_non_finite(&bf, &[0, 0, 0x80, 0xFF, 0xC0, 0x7F]), Some(2));
    }
}
