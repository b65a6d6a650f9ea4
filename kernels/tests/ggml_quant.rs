//! Rows quantized into Q4_K, Q2_K and IQ4_XS blocks (`ggml_quant`), read back by the exact
//! dequantizer (`ggml::dequantize`, gguf-py's values bit for bit): the error of the round trip
//! against ggml's own reference quantizer's on the same values.

use moescope_kernels::ggml::{BlockType, dequantize};
use moescope_kernels::ggml_quant::{TYPES, quantize_row};

/// 64 rows of 1024: smooth waves of changing amplitude with a sharper one on top and an
/// outlier every 97 values, from a formula tests/reference/ggml_quant_rmse.py repeats.
fn values() -> Vec<f32> {
    (0..64 * 1024)
        .map(|i| {
            let t = i as f64;
            let mut v = (0.37 * t).sin() * (1.0 + 0.5 * (0.011 * t).cos()) + 0.3 * (1.7 * t).sin().powi(3);
            if i % 97 == 0 {
                v *= 4.0;
            }
            (0.02 * v) as f32
        })
        .collect()
}

fn rmse(a: &[f32], b: &[f32]) -> f64 {
    (a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt()
}

/// ggml's reference quantizers (`quantize_row_*_ref`, llama-cpp-python 0.3.36's tree) on
/// [`values`], dequantized: root mean square error (tests/reference/ggml_quant_rmse.py).
fn ggml_rmse(t: BlockType) -> f64 {
    match t {
        BlockType::Q4K => 1.105e-3,
        BlockType::Q2K => 4.331e-3,
        BlockType::Iq4Xs => 1.342e-3,
        _ => unreachable!(),
    }
}

#[test]
fn quantized_rows_read_back_as_close_as_ggmls_own() {
    let x = values();
    for t in TYPES {
        let mut blocks = vec![];
        for row in x.chunks_exact(1024) {
            quantize_row(t, row, &mut blocks);
        }
        assert_eq!(blocks.len(), t.bytes_of(x.len()), "{}", t.name());
        let mut back = vec![0f32; x.len()];
        dequantize(t, &blocks, &mut back);
        let (ours, theirs) = (rmse(&x, &back), ggml_rmse(t));
        eprintln!("{}: rmse {ours:.3e}, ggml's {theirs:.3e}", t.name());
        assert!(ours <= 1.05 * theirs, "{}: rmse {ours:.3e} > 1.05 x ggml's {theirs:.3e}", t.name());
    }
}
