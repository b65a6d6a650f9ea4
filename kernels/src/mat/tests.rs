//! The products of every format against the dequantized f64 product, across tiers, batches,
//! sub-ranges and row layouts.

use super::*;
use crate::quant::{f32_to_bf16, interleave_rows, panel_rows, quantize_q4_row, quantize_q6_row, quantize_q8_row};

use crate::testutil::uniform;

#[test]
fn matmul_rows_matches_dequantized_f64_product() {
    let (rows, cols, n) = (5, 96, 3);
    let mut r = uniform(5);
    let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
    let x: Vec<f32> = (0..n * cols).map(|_| r()).collect();
    let wb: Vec<u16> = w.iter().map(|v| f32_to_bf16(*v)).collect();
    let mut q8 = vec![0i8; rows * cols];
    let mut d8 = vec![0f32; rows * cols / 32];
    let mut q4 = vec![0u8; rows * cols / 2];
    let mut d4 = vec![0f32; rows * cols / 32];
    for i in 0..rows {
        quantize_q8_row(
            &w[i * cols..(i + 1) * cols],
            32,
            &mut q8[i * cols..(i + 1) * cols],
            &mut d8[i * 3..(i + 1) * 3],
        );
        quantize_q4_row(
            &w[i * cols..(i + 1) * cols],
            32,
            &mut q4[i * cols / 2..(i + 1) * cols / 2],
            &mut d4[i * 3..(i + 1) * 3],
        );
    }
    let mats = [
        Mat { rows, cols, data: MatData::F32(&w) },
        Mat { rows, cols, data: MatData::Bf16(&wb) },
        Mat { rows, cols, data: MatData::Q8 { q: &q8, scales: &d8, group: 32, mins: None } },
        Mat {
            rows,
            cols,
            data: MatData::Q4 { q: &q4, scales: &d4, group: 32, x4: false, panels: false, lanes: false, mins: None },
        },
    ];
    let mut qa = QuantAct::default();
    qa.quantize(&x, cols, 32, Isa::detect());
    for m in mats {
        let input = if m.quant_group().is_some() { Input::Quant(&qa) } else { Input::F32(&x) };
        for isa in Isa::available() {
            let mut out = vec![0f32; 3 * n];
            m.matmul_rows(isa, input, n, 1..4, &mut out);
            let mut row = vec![0f32; cols];
            for (i, rr) in (1..4).enumerate() {
                m.dequant_row(rr, &mut row);
                for t in 0..n {
                    let xs: Vec<f32> = match input {
                        Input::F32(x) => x[t * cols..(t + 1) * cols].to_vec(),
                        Input::Quant(a) => {
                            let q = a.row(t);
                            (0..cols).map(|j| q.q[j] as f32 * q.scales[j / 32]).collect()
                        }
                    };
                    let want: f64 = row.iter().zip(&xs).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let got = out[i * n + t] as f64;
                    assert!((got - want).abs() < 1e-4, "{:?} {isa}: {got} vs {want}", m.format());
                }
            }
        }
    }
}

#[test]
fn matvec_tiers_agree_with_the_scalar_reference() {
    // every tier, every row count up to two blocks and a remainder, one token and several
    // (tiles of 4 tokens and their remainders), q4 and q8 groups the vector kernels take and
    // some they do not
    let mut r = uniform(17);
    for (cols, group) in [
        (128, 128),
        (256, 128),
        (512, 256),
        (384, 128),
        (192, 64),
        (96, 32),
        (256, 32),
        (2304, 32),
        (384, 64),
        (64, 16),
        (48, 16),
        (768, 16),
        (2048, 16),
    ] {
        for (rows, n) in [(1, 1), (2, 5), (3, 1), (3, 7), (4, 4), (5, 9), (7, 2), (9, 1), (9, 6), (37, 6)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
            let x: Vec<f32> = (0..n * cols).map(|_| 4.0 * r()).collect();
            let ng = cols / group;
            let mut q8 = vec![0i8; rows * cols];
            let mut d8 = vec![0f32; rows * ng];
            let mut q4 = vec![0u8; rows * cols / 2];
            let mut d4 = vec![0f32; rows * ng];
            for i in 0..rows {
                let wr = &w[i * cols..(i + 1) * cols];
                quantize_q8_row(wr, group, &mut q8[i * cols..(i + 1) * cols], &mut d8[i * ng..(i + 1) * ng]);
                quantize_q4_row(wr, group, &mut q4[i * cols / 2..(i + 1) * cols / 2], &mut d4[i * ng..(i + 1) * ng]);
            }
            let mut q6 = vec![0u8; rows * cols / 128 * 96];
            let mut d6 = vec![0f32; rows * ng];
            let six = Format::Q6 { group }.fits(cols);
            if six {
                let rb = cols / 128 * 96;
                for i in 0..rows {
                    let wr = &w[i * cols..(i + 1) * cols];
                    quantize_q6_row(wr, group, &mut q6[i * rb..(i + 1) * rb], &mut d6[i * ng..(i + 1) * ng]);
                }
            }
            let mut qa = QuantAct::default();
            qa.quantize(&x, cols, group, Isa::detect());
            let mut mats = vec![
                Mat { rows, cols, data: MatData::Q8 { q: &q8, scales: &d8, group, mins: None } },
                Mat {
                    rows,
                    cols,
                    data: MatData::Q4 {
                        q: &q4,
                        scales: &d4,
                        group,
                        x4: false,
                        panels: false,
                        lanes: false,
                        mins: None,
                    },
                },
            ];
            if six {
                mats.push(Mat {
                    rows,
                    cols,
                    data: MatData::Q6 { q: &q6, scales: &d6, group, x4: false, panels: false },
                });
            }
            for m in mats {
                let mut want = vec![0f32; rows * n];
                m.matmul_rows(Isa::Scalar, Input::Quant(&qa), n, 0..rows, &mut want);
                // the scale of the rounding: the sum of the products' magnitudes
                let mut row = vec![0f32; cols];
                let mut mag = vec![0f64; rows * n];
                for i in 0..rows {
                    m.dequant_row(i, &mut row);
                    for t in 0..n {
                        let xt = &x[t * cols..(t + 1) * cols];
                        mag[i * n + t] = row.iter().zip(xt).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    }
                }
                for isa in Isa::available() {
                    // a sub-range too, so block offsets are exercised
                    for range in [0..rows, (rows / 2)..rows] {
                        let mut got = vec![0f32; range.len() * n];
                        m.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut got);
                        for (j, g) in got.iter().enumerate() {
                            let at = range.start * n + j;
                            let (w, tol) = (want[at], 1e-5 * mag[at] + 1e-6);
                            assert!(
                                ((*g - w) as f64).abs() <= tol,
                                "{:?} {isa} rows={rows} cols={cols} n={n} row {} token {}: {g} vs {w}",
                                m.format(),
                                range.start + j / n,
                                j % n
                            );
                        }
                        // a prompt's products are its tokens' one at a time, bit for bit
                        for t in 0..n {
                            let mut one = QuantAct::default();
                            one.quantize(&x[t * cols..(t + 1) * cols], cols, group, Isa::detect());
                            let mut single = vec![0f32; range.len()];
                            m.matmul_rows(isa, Input::Quant(&one), 1, range.clone(), &mut single);
                            for (i, v) in single.iter().enumerate() {
                                assert_eq!(
                                    v.to_bits(),
                                    got[i * n + t].to_bits(),
                                    "{:?} {isa} rows={rows} cols={cols} n={n}: token {t} alone",
                                    m.format()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `w` (rows of `cols`) as q4 or q6 (`six`) rows, one after another; the scales into `d`.
fn quantize_rows(six: bool, w: &[f32], cols: usize, group: usize, d: &mut [f32]) -> Vec<u8> {
    let f = if six { Format::Q6 { group } } else { Format::Q4 { group } };
    let (rb, ng) = (f.data_bytes(1, cols), cols / group);
    let mut q = vec![0u8; w.len() / cols * rb];
    for ((wr, qr), dr) in w.chunks_exact(cols).zip(q.chunks_exact_mut(rb)).zip(d.chunks_exact_mut(ng)) {
        if six { quantize_q6_row(wr, group, qr, dr) } else { quantize_q4_row(wr, group, qr, dr) }
    }
    q
}

/// Every row of `a` and `b` (the same matrix in two row orders) dequantizes to the same values.
fn assert_same_rows(a: &Mat<'_>, b: &Mat<'_>, what: &str) {
    let (mut ra, mut rb) = (vec![0f32; a.cols], vec![0f32; b.cols]);
    for i in 0..a.rows {
        a.dequant_row(i, &mut ra);
        b.dequant_row(i, &mut rb);
        assert_eq!(ra, rb, "{what} row {i}");
    }
}

#[test]
fn interleaved_rows_give_the_row_major_products_bit_for_bit() {
    // the x4 layouts hold the same bytes in another order: every tier, every sub-range
    // (thread chunks start anywhere, not only at a block), one token and tiles of several,
    // must give exactly what the row-major matrix gives at that tier
    let mut r = uniform(23);
    for (cols, group) in [
        (128, 128),
        (384, 128),
        (768, 128),
        (256, 64),
        (512, 256),
        (512, 32),
        (2304, 32),
        (640, 64),
        (768, 16),
        (2048, 16),
    ] {
        for rows in [4, 8, 20, 68] {
            let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
            let ng = cols / group;
            let mut d = vec![0f32; rows * ng];
            for six in [false, true] {
                let f = if six { Format::Q6 { group } } else { Format::Q4 { group } };
                if !f.fits(cols) {
                    continue;
                }
                assert!(f.interleaves(rows, cols));
                let (rb, cb) = (f.data_bytes(1, cols), f.chunk_bytes().unwrap_or(0));
                let q = quantize_rows(six, &w, cols, group, &mut d);
                let mut qx = vec![0u8; q.len()];
                interleave_rows(&q, rb, cb, &mut qx);
                // (rows of one chunk are the same either way)
                assert_eq!(q == qx, cols == 128, "{f:?} rows={rows} cols={cols}");
                let mk = |q, x4| {
                    let data = if six {
                        MatData::Q6 { q, scales: &d, group, x4, panels: false }
                    } else {
                        MatData::Q4 { q, scales: &d, group, x4, panels: false, lanes: false, mins: None }
                    };
                    Mat { rows, cols, data }
                };
                let (plain, x4) = (mk(&q, false), mk(&qx, true));
                assert_same_rows(&plain, &x4, &format!("{f:?}"));
                for n in [1, 2, 3, 4, 8, 9] {
                    let x: Vec<f32> = (0..n * cols).map(|_| 4.0 * r()).collect();
                    let mut qa = QuantAct::default();
                    qa.quantize(&x, cols, group, Isa::detect());
                    for isa in Isa::available() {
                        // each token's products are its own alone (a server's batch of decode
                        // tokens gives each sequence the bits it gets alone)
                        let mut batch = vec![0f32; rows * n];
                        x4.matmul_rows(isa, Input::Quant(&qa), n, 0..rows, &mut batch);
                        for t in 0..n {
                            let mut one = QuantAct::default();
                            one.quantize(&x[t * cols..(t + 1) * cols], cols, group, Isa::detect());
                            let mut alone = vec![0f32; rows];
                            x4.matmul_rows(isa, Input::Quant(&one), 1, 0..rows, &mut alone);
                            let got: Vec<u32> = (0..rows).map(|i| batch[i * n + t].to_bits()).collect();
                            let want: Vec<u32> = alone.iter().map(|v| v.to_bits()).collect();
                            assert_eq!(got, want, "{f:?} {isa} rows={rows} cols={cols} token {t} of {n}");
                        }
                        for range in [0..rows, 1..rows, 2..rows - 1, 3..4] {
                            let (mut want, mut got) = (vec![0f32; range.len() * n], vec![0f32; range.len() * n]);
                            plain.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut want);
                            // with and without software prefetch (decode's x4 kernels
                            // prefetch along the stream; any distance, any address)
                            for pf in [0, 64, 4096] {
                                crate::prefetch::set_distance(pf);
                                x4.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut got);
                                let (wb, gb): (Vec<u32>, Vec<u32>) = (
                                    want.iter().map(|v| v.to_bits()).collect(),
                                    got.iter().map(|v| v.to_bits()).collect(),
                                );
                                assert_eq!(wb, gb, "{f:?} {isa} rows={rows} cols={cols} n={n} range {range:?} pf {pf}");
                            }
                            crate::prefetch::set_distance(0);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn panel_major_rows_give_the_x4_products_bit_for_bit() {
    // the panel order holds an x4 matrix's bytes in another order, and its decode kernel adds a
    // row's groups panel by panel: every tier, sub-ranges that start inside a superblock (a
    // thread's piece), one token and several, q4 with and without mins, must give exactly the
    // x4 matrix's values. Rows of one whole panel (2048), of a panel and a part (2560: the last
    // panel 4 chunks wide), and of several with groups from 16 (q6) to 256.
    let mut r = uniform(31);
    for (cols, group) in [(2048, 32), (2560, 32), (4608, 128), (5120, 64), (4096, 256), (4352, 16)] {
        for rows in [16, 48] {
            let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
            let ng = cols / group;
            let mut d = vec![0f32; rows * ng];
            let mins: Vec<f32> = (0..rows * ng).map(|_| 0.01 * r()).collect();
            for (six, with_mins) in [(false, false), (false, true), (true, false)] {
                let f = if six { Format::Q6 { group } } else { Format::Q4 { group } };
                if !f.fits(cols) {
                    continue;
                }
                let (rb, cb) = (f.data_bytes(1, cols), f.chunk_bytes().unwrap_or(0));
                let q = quantize_rows(six, &w, cols, group, &mut d);
                let (mut qx, mut qp) = (vec![0u8; q.len()], vec![0u8; q.len()]);
                interleave_rows(&q, rb, cb, &mut qx);
                panel_rows(&qx, rb, cb, &mut qp);
                // one panel: the orders agree; past it they differ
                assert_eq!(qx == qp, cols == 2048, "{f:?} rows={rows} cols={cols}");
                let mk = |q, panels| {
                    let data = if six {
                        MatData::Q6 { q, scales: &d, group, x4: true, panels }
                    } else {
                        let mins = with_mins.then_some(&mins[..]);
                        MatData::Q4 { q, scales: &d, group, x4: true, panels, lanes: false, mins }
                    };
                    Mat { rows, cols, data }
                };
                let (x4, pm) = (mk(&qx, false), mk(&qp, true));
                assert_same_rows(&x4, &pm, &format!("{f:?}"));
                for n in [1, 2, 5] {
                    let x: Vec<f32> = (0..n * cols).map(|_| 4.0 * r()).collect();
                    let mut qa = QuantAct::default();
                    qa.quantize(&x, cols, group, Isa::detect());
                    for isa in Isa::available() {
                        for range in [0..rows, 4..rows, 1..rows - 1, 16..32, 20..rows]
                            .into_iter()
                            .filter(|g| g.start < g.end && g.end <= rows)
                        {
                            let (mut want, mut got) = (vec![0f32; range.len() * n], vec![0f32; range.len() * n]);
                            x4.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut want);
                            for pf in [0, 4096] {
                                crate::prefetch::set_distance(pf);
                                pm.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut got);
                                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                                assert_eq!(
                                    bits(&want),
                                    bits(&got),
                                    "{f:?} mins {with_mins} {isa} rows={rows} cols={cols} n={n} range {range:?}"
                                );
                            }
                            crate::prefetch::set_distance(0);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn lane_order_rows_give_the_x4_products_bit_for_bit() {
    // the lane order holds an x4 q4 matrix's bytes 4 at a time in 16-row blocks: every tier
    // (the AVX-512 kernel reads the blocks as they are, the others gather rows), ranges that
    // start and end inside a block, one token and several, f32 and f16 scales, groups 32-256
    let mut r = uniform(37);
    for (cols, group) in [(256, 32), (768, 64), (2048, 128), (1024, 256)] {
        for rows in [16, 48] {
            let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
            let ng = cols / group;
            let mut d = vec![0f32; rows * ng];
            let f = Format::Q4 { group };
            let rb = f.data_bytes(1, cols);
            let q = quantize_rows(false, &w, cols, group, &mut d);
            let (mut qx, mut ql) = (vec![0u8; q.len()], vec![0u8; q.len()]);
            interleave_rows(&q, rb, 64, &mut qx);
            crate::quant::lane_rows(&qx, rb, &mut ql);
            assert_ne!(qx, ql);
            // f16 scales: the f32 ones rounded, so both forms hold the same values
            let h: Vec<u16> = d.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            // the scales in lane order too
            let (mut dl, mut hl) = (vec![0f32; d.len()], vec![0u16; h.len()]);
            crate::quant::lane_scales(&d, ng, &mut dl);
            crate::quant::lane_scales(&h, ng, &mut hl);
            assert_ne!(d, dl);
            for halves in [false, true] {
                let mk = |q, lanes| {
                    let (d, h) = if lanes { (&dl, &hl) } else { (&d, &h) };
                    let data = if halves {
                        MatData::Q4F16 { q, scales: h, group, x4: true, panels: false, lanes, mins: false }
                    } else {
                        MatData::Q4 { q, scales: d, group, x4: true, panels: false, lanes, mins: None }
                    };
                    Mat { rows, cols, data }
                };
                let (x4, lm) = (mk(&qx, false), mk(&ql, true));
                assert_same_rows(&x4, &lm, &format!("{f:?} f16 {halves}"));
                for n in [1, 2, 5, 11] {
                    let x: Vec<f32> = (0..n * cols).map(|_| 4.0 * r()).collect();
                    let mut qa = QuantAct::default();
                    qa.quantize(&x, cols, group, Isa::detect());
                    for isa in Isa::available() {
                        for range in [0..rows, 16..32, 4..rows, 1..rows - 1, 20..rows]
                            .into_iter()
                            .filter(|g| g.start < g.end && g.end <= rows)
                        {
                            let (mut want, mut got) = (vec![0f32; range.len() * n], vec![0f32; range.len() * n]);
                            x4.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut want);
                            lm.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut got);
                            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&want), bits(&got), "{f:?} f16 {halves} {isa} rows={rows} n={n} {range:?}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn mxfp4_products_are_the_scalar_bits_at_every_tier_and_batch() {
    // one block, an odd count (a lone last block), gpt-oss's 2880 (90 blocks), tiles of 4
    // tokens and their remainders
    let mut r = uniform(29);
    for cols in [32, 96, 224, 2880] {
        for (rows, n) in [(1, 1), (3, 5), (2, 4), (5, 9), (4, 1)] {
            // row 1 tiny (subnormal block scales: e = 1), row 2 zero (e = 0)
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| match i / cols {
                    1 => 1e-38 * r(),
                    2 => 0.0,
                    _ => r(),
                })
                .collect();
            let x: Vec<f32> = (0..n * cols).map(|_| 4.0 * r()).collect();
            let rb = cols / 32 * crate::mxfp4::BLOCK_BYTES;
            let mut q = vec![0u8; rows * rb];
            for i in 0..rows {
                crate::mxfp4::quantize_row(&w[i * cols..(i + 1) * cols], &mut q[i * rb..(i + 1) * rb]);
            }
            let m = Mat { rows, cols, data: MatData::Mxfp4 { q: &q } };
            let mut qa = QuantAct::default();
            qa.quantize(&x, cols, 32, Isa::detect());
            let mut want = vec![0f32; rows * n];
            m.matmul_rows(Isa::Scalar, Input::Quant(&qa), n, 0..rows, &mut want);
            for isa in Isa::available() {
                for range in [0..rows, (rows / 2)..rows] {
                    let mut got = vec![0f32; range.len() * n];
                    m.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut got);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want[range.start * n..range.end * n]),
                        "{isa} rows={rows} cols={cols} n={n}"
                    );
                    for t in 0..n {
                        let mut one = QuantAct::default();
                        one.quantize(&x[t * cols..(t + 1) * cols], cols, 32, Isa::detect());
                        let mut single = vec![0f32; range.len()];
                        m.matmul_rows(isa, Input::Quant(&one), 1, range.clone(), &mut single);
                        let col: Vec<f32> = (0..range.len()).map(|i| got[i * n + t]).collect();
                        assert_eq!(bits(&single), bits(&col), "{isa} cols={cols} n={n}: token {t} alone");
                    }
                }
            }
        }
    }
}

#[test]
fn token_major_products_are_the_row_major_ones_transposed() {
    // the q4 lanes kernel writes a token's rows itself (lane order and x4, f32 and f16 scales,
    // groups of 32 and 128, with AMX tiles where granted from 12 and 24 tokens); q6 and q8 go
    // through the buffer. Pieces that start and end inside a 16-row block, into a wider matrix.
    let mut r = uniform(41);
    let (rows, cols, ld) = (48, 256, 53);
    for group in [32, 128] {
        let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
        let mut d = vec![0f32; rows * cols / group];
        let q = quantize_rows(false, &w, cols, group, &mut d);
        let rb = cols / 2;
        let (mut qx, mut ql) = (vec![0u8; q.len()], vec![0u8; q.len()]);
        interleave_rows(&q, rb, 64, &mut qx);
        crate::quant::lane_rows(&qx, rb, &mut ql);
        let h: Vec<u16> = d.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
        // the lane order's scales
        let (mut dl, mut hl) = (vec![0f32; d.len()], vec![0u16; h.len()]);
        crate::quant::lane_scales(&d, cols / group, &mut dl);
        crate::quant::lane_scales(&h, cols / group, &mut hl);
        let mut d6 = vec![0f32; rows * cols / 128];
        let q6 = quantize_rows(true, &w, cols, 128, &mut d6);
        let mut q8 = vec![0i8; rows * cols];
        let mut d8 = vec![0f32; rows * cols / group];
        for i in 0..rows {
            let ng = cols / group;
            quantize_q8_row(&w[i * cols..][..cols], group, &mut q8[i * cols..][..cols], &mut d8[i * ng..][..ng]);
        }
        let mats = [
            MatData::Q4 { q: &ql, scales: &dl, group, x4: true, panels: false, lanes: true, mins: None },
            MatData::Q4 { q: &qx, scales: &d, group, x4: true, panels: false, lanes: false, mins: None },
            MatData::Q4F16 { q: &ql, scales: &hl, group, x4: true, panels: false, lanes: true, mins: false },
            MatData::Q6 { q: &q6, scales: &d6, group: 128, x4: false, panels: false },
            MatData::Q8 { q: &q8, scales: &d8, group, mins: None },
        ];
        for data in mats {
            let m = Mat { rows, cols, data };
            for n in [1, 3, 13, 30] {
                let x: Vec<f32> = (0..n * cols).map(|_| 4.0 * r()).collect();
                let mut qa = QuantAct::default();
                qa.quantize(&x, cols, m.quant_group().unwrap_or(group), Isa::detect());
                for isa in Isa::available() {
                    for range in [0..rows, 5..37, 16..32, 33..48] {
                        let mut want = vec![0f32; range.len() * n];
                        m.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut want);
                        let mut got = vec![f32::NAN; n * ld];
                        let mut buf = vec![0f32; range.len() * n];
                        // SAFETY: `got` holds n rows of ld >= range.len() values
                        unsafe {
                            m.matmul_rows_tokens(
                                isa,
                                Input::Quant(&qa),
                                n,
                                range.clone(),
                                &mut buf,
                                (got.as_mut_ptr(), ld),
                            )
                        };
                        for t in 0..n {
                            for i in 0..range.len() {
                                let (a, b) = (want[i * n + t], got[t * ld + i]);
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{:?} {isa} n={n} {range:?}: row {i} token {t}",
                                    m.format()
                                );
                            }
                            assert!(
                                got[t * ld + range.len()..(t + 1) * ld].iter().all(|v| v.is_nan()),
                                "wrote past its rows"
                            );
                        }
                    }
                }
            }
        }
    }
}
