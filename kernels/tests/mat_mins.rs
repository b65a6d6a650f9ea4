//! Matrices with asymmetric groups (`mins`: GGUF's Q4_K, Q5_K, Q4_1 values `scale * n - min`)
//! through the symmetric q4 and q8 kernels plus the mins' term.

use moescope_kernels::Isa;
use moescope_kernels::act::QuantAct;
use moescope_kernels::mat::{Input, Mat, MatData};
use moescope_kernels::quant::{interleave_rows, q4_value, quantize_q4_row, quantize_q8_row};

/// Uniform values in [-0.5, 0.5) from a 64-bit LCG.
fn uniform(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed;
    move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }
}

/// gamma(k) = k u / (1 - k u), u = 2^-24: the relative error bound of k f32 roundings.
fn gamma(k: usize) -> f64 {
    let ku = k as f64 * f64::powi(2.0, -24);
    ku / (1.0 - ku)
}

/// Asymmetric groups (GGUF's Q4_K / Q5_K: `scale * n - min`) on the q4 and q8 kernels plus
/// the mins' term, at every tier, against the exact product (f64) of the values (`dequant_row`'s,
/// checked against the formula) and the quantized activations, within a bound derived for the
/// kernels' operations. Per group g with activation scale `as`, integer sums `isum` (of
/// `(n - bias) a`, bias 8 for q4 and 0 for q8) and `sums` (of `a`), the product is
/// `wd as isum + (bias wd - min) as sums`. The row kernels take the first term with one rounding
/// for `wd as`, one for the product and one per group for their running sum, and the mins' term
/// (`mins_term`) with three (`bias wd - min`, `sums as`, the product), at most ng / 16 + 4 in its
/// lane and tree, and one adding it on; the AVX-512 kernels round each term at most as often
/// (a lane's chain of fused multiply-adds over its groups, the bias term fused, a 4-level
/// tree). So each term is off by at most gamma(ng + 8) of its magnitude.
#[test]
fn mins_make_groups_asymmetric() {
    let mut r = uniform(31);
    // 8 to 40 groups a row: the kernels' 16-group steps and their remainders
    for (rows, cols, group, q4) in
        [(8, 256, 32, true), (8, 256, 16, false), (8, 256, 32, false), (8, 640, 16, false), (8, 1280, 32, true)]
    {
        let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
        let ng = cols / group;
        let mins: Vec<f32> = (0..rows * ng).map(|_| r() * 0.3).collect();
        let (mut q4b, mut q8b, mut d) = (vec![0u8; rows * cols / 2], vec![0i8; rows * cols], vec![0f32; rows * ng]);
        for i in 0..rows {
            let (wr, dr) = (&w[i * cols..(i + 1) * cols], &mut d[i * ng..(i + 1) * ng]);
            if q4 {
                quantize_q4_row(wr, group, &mut q4b[i * cols / 2..(i + 1) * cols / 2], dr);
            } else {
                quantize_q8_row(wr, group, &mut q8b[i * cols..(i + 1) * cols], dr);
            }
        }
        let mut x4b = vec![0u8; q4b.len()];
        interleave_rows(&q4b, cols / 2, 64, &mut x4b);
        let mats: Vec<Mat<'_>> = if q4 {
            vec![
                Mat {
                    rows,
                    cols,
                    data: MatData::Q4 {
                        q: &q4b,
                        scales: &d,
                        group,
                        x4: false,
                        panels: false,
                        lanes: false,
                        mins: Some(&mins),
                    },
                },
                Mat {
                    rows,
                    cols,
                    data: MatData::Q4 {
                        q: &x4b,
                        scales: &d,
                        group,
                        x4: true,
                        panels: false,
                        lanes: false,
                        mins: Some(&mins),
                    },
                },
            ]
        } else {
            vec![Mat { rows, cols, data: MatData::Q8 { q: &q8b, scales: &d, group, mins: Some(&mins) } }]
        };
        for m in mats {
            // the values: scale * n - min, n the unsigned code
            let mut vals = vec![0f32; rows * cols];
            let mut codes = vec![0i32; rows * cols];
            for i in 0..rows {
                m.dequant_row(i, &mut vals[i * cols..(i + 1) * cols]);
                for j in 0..cols {
                    let g = i * ng + j / group;
                    let code = if q4 {
                        q4_value(&q4b[i * cols / 2 + j / group * group / 2..], group, j % group) + 8
                    } else {
                        q8b[i * cols + j] as i32
                    };
                    assert_eq!(vals[i * cols + j], d[g] * code as f32 - mins[g], "row {i} value {j}");
                    codes[i * cols + j] = code;
                }
            }
            for n in [1, 3] {
                let x: Vec<f32> = (0..n * cols).map(|_| r()).collect();
                let mut qa = QuantAct::default();
                qa.quantize(&x, cols, group, Isa::detect());
                for isa in Isa::available() {
                    let mut got = vec![0f32; rows * n];
                    m.matmul_rows(isa, Input::Quant(&qa), n, 0..rows, &mut got);
                    for i in 0..rows {
                        for t in 0..n {
                            let a = qa.row(t);
                            let (mut want, mut mag) = (0f64, 0f64);
                            let bias = if q4 { 8 } else { 0 };
                            for gi in 0..ng {
                                let (wd, mn, s) =
                                    (d[i * ng + gi] as f64, mins[i * ng + gi] as f64, a.scales[gi] as f64);
                                let isum: i64 = (gi * group..(gi + 1) * group)
                                    .map(|j| (codes[i * cols + j] - bias) as i64 * a.q[j] as i64)
                                    .sum();
                                let (t1, t2) = (wd * s * isum as f64, (bias as f64 * wd - mn) * s * a.sums[gi] as f64);
                                want += t1 + t2;
                                mag += t1.abs() + t2.abs();
                            }
                            let (g, tol) = (got[i * n + t] as f64, gamma(ng + 8) * mag);
                            assert!(
                                (g - want).abs() <= tol,
                                "{:?} x4 {} {isa} n={n} row {i} token {t}: {g} vs {want} (bound {tol:e})",
                                m.format(),
                                matches!(m.data, MatData::Q4 { x4: true, .. })
                            );
                        }
                    }
                    // a prompt's products are its tokens' one at a time, bit for bit
                    for t in 0..n {
                        let mut one = QuantAct::default();
                        one.quantize(&x[t * cols..(t + 1) * cols], cols, group, Isa::detect());
                        let mut single = vec![0f32; rows];
                        m.matmul_rows(isa, Input::Quant(&one), 1, 0..rows, &mut single);
                        for (i, v) in single.iter().enumerate() {
                            assert_eq!(v.to_bits(), got[i * n + t].to_bits(), "{:?} {isa} token {t} alone", m.format());
                        }
                    }
                }
            }
        }
    }
}
