//! Matrices kept as a GGUF file's blocks (`MatData::Blocks`) against gguf-py's values (the
//! fixture's blocks, laid out as rows) and against the q8 matrix of their codes, scales and
//! mins that a relayout writes: the same products bit for bit at every tier and batch, for
//! all rows and for pieces that start and end inside a decoded block of rows.

mod common;

use moescope_kernels::Isa;
use moescope_kernels::act::QuantAct;
use moescope_kernels::ggml::{BlockType, IQ4_VALUES};
use moescope_kernels::ggml_codes::{blocks_run_as, decode_blocks};
use moescope_kernels::mat::{Input, Mat, MatData};

/// A 64-bit LCG's next value.
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *s >> 33
}

/// A `[rows, cols]` matrix of `t`'s fixture blocks, picked at random: its bytes and gguf-py's
/// values of it.
fn matrix(f: &common::FixtureBlocks, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u32>) {
    let (qk, bb) = (f.t.block(), f.t.block_bytes());
    let have = f.want.len() / qk;
    let (mut raw, mut want, mut s) = (vec![], vec![], seed);
    for _ in 0..rows * cols / qk {
        let b = next(&mut s) as usize % have;
        raw.extend_from_slice(&f.blocks[b * bb..(b + 1) * bb]);
        want.extend_from_slice(&f.want[b * qk..(b + 1) * qk]);
    }
    (raw, want)
}

#[test]
fn blocks_give_the_files_values_and_the_relaid_matrices_products() {
    let mut tested = vec![];
    for f in common::fixture_blocks() {
        let Some((group, with_mins)) = blocks_run_as(f.t) else { continue };
        // 40 rows of 512 cross the decoded blocks (32 rows at this length); 2304 = 9 super-blocks
        for (rows, cols, seed) in [(40, 512, 1), (9, 2304, 2)] {
            let (raw, want) = matrix(&f, rows, cols, seed);
            let bmat = Mat { rows, cols, data: MatData::Blocks { t: f.t, q: &raw } };
            assert_eq!(bmat.row_bytes() * rows, raw.len(), "{}: the file's bytes", f.t.name());
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                bmat.dequant_row(r, &mut row);
                for (j, v) in row.iter().enumerate() {
                    let w = want[r * cols + j];
                    assert_eq!(v.to_bits(), w, "{} row {r} value {j}: {v} vs {}", f.t.name(), f32::from_bits(w));
                }
            }
            let (mut codes, mut sc) = (vec![0i8; rows * cols], vec![0f32; rows * cols / group]);
            let mut mn = vec![0f32; if with_mins { sc.len() } else { 0 }];
            decode_blocks(f.t, &raw, &mut codes, &mut sc, &mut mn, Isa::Scalar);
            // every tier decodes the same numbers
            for isa in Isa::available() {
                let (mut c2, mut s2, mut m2) = (vec![0i8; codes.len()], vec![0f32; sc.len()], vec![0f32; mn.len()]);
                decode_blocks(f.t, &raw, &mut c2, &mut s2, &mut m2, isa);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(c2 == codes, "{} {isa}: codes", f.t.name());
                assert!(bits(&s2) == bits(&sc) && bits(&m2) == bits(&mn), "{} {isa}: scales or mins", f.t.name());
            }
            if moescope_kernels::mat::block_sums(f.t) {
                block_sums_products(&bmat, &raw, seed);
                continue;
            }
            let mins = with_mins.then_some(&mn[..]);
            let qmat = Mat { rows, cols, data: MatData::Q8 { q: &codes, scales: &sc, group, mins } };
            same_products(&bmat, &qmat, group, seed);
        }
        tested.push(f.t);
    }
    let want = [
        BlockType::Q5_0,
        BlockType::Q4K,
        BlockType::Q5K,
        BlockType::Q2K,
        BlockType::Q3K,
        BlockType::Iq4Nl,
        BlockType::Iq4Xs,
    ];
    for t in want.into_iter().chain(moescope_kernels::ggml_iq::TYPES) {
        assert!(tested.contains(&t), "{} is kept as blocks and tested", t.name());
    }
}

/// `bmat`'s products equal `qmat`'s bit for bit, at every tier, over 1 to 9 tokens, for all rows
/// and for a piece starting and ending inside decoded blocks.
fn same_products(bmat: &Mat<'_>, qmat: &Mat<'_>, group: usize, seed: u64) {
    let rows = bmat.rows;
    let mut rng = seed;
    for n in [1, 2, 3, 5, 9] {
        let x: Vec<f32> = (0..n * bmat.cols).map(|_| (next(&mut rng) % 2001) as f32 / 1000.0 - 1.0).collect();
        for isa in Isa::available() {
            let mut qa = QuantAct::default();
            qa.quantize(&x, bmat.cols, group, isa);
            for part in [0..rows, 3..rows - 2] {
                let (mut got, mut want) = (vec![0f32; part.len() * n], vec![0f32; part.len() * n]);
                bmat.matmul_rows(isa, Input::Quant(&qa), n, part.clone(), &mut got);
                qmat.matmul_rows(isa, Input::Quant(&qa), n, part.clone(), &mut want);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let t = match bmat.data {
                        MatData::Blocks { t, .. } => t.name(),
                        _ => "?",
                    };
                    assert_eq!(g.to_bits(), w.to_bits(), "{t} {isa} n {n} rows {part:?}: product {i}: {g} vs {w}");
                }
            }
        }
    }
}

/// A Q2_K, Q3_K, Q4_K or IQ4_XS block's real values as the format defines them: per value, `d * sc`
/// and the signed code, and `dmin * m` (Q3_K, IQ4_XS: 0), in f64.
fn block_parts(t: BlockType, b: &[u8]) -> Vec<(f64, f64, f64)> {
    let f16 = |at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f64();
    if t == BlockType::Iq4Xs {
        // sub-block j of 32: 6-bit scale (low nibble of byte 4 + j / 2, high 2 bits from the u16
        // at 2), less 32; values: the low nibbles of bytes 8 + 16j.., then the high ones
        let high = u16::from_le_bytes([b[2], b[3]]);
        return (0..256)
            .map(|i| {
                let j = i / 32;
                let ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) as i32 | (((high >> (2 * j)) & 3) as i32) << 4;
                let nib = (b[8 + 16 * j + i % 16] >> (4 * ((i / 16) % 2))) & 15;
                (f16(0) * (ls - 32) as f64, IQ4_VALUES[nib as usize] as f64, 0.0)
            })
            .collect();
    }
    if t == BlockType::Q4K {
        // sub-block j of 32 (values 32j..): 6-bit scale and min (ggml's get_scale_min_k4),
        // codes the low nibbles of bytes 16 + 32 (j / 2).. for even j, the high ones for odd
        return (0..256)
            .map(|i| {
                let j = i / 32;
                let (sc, m) = moescope_kernels::ggml::k_scale_min(&b[4..16], j);
                let nib = (b[16 + 32 * (j / 2) + i % 32] >> (4 * (j % 2))) & 15;
                (f16(0) * sc as f64, nib as f64, f16(2) * m as f64)
            })
            .collect();
    }
    let qs = if t == BlockType::Q2K { &b[16..80] } else { &b[32..96] };
    (0..256)
        .map(|i| {
            let two = ((qs[32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3) as f64;
            let j = i / 16;
            if t == BlockType::Q2K {
                (f16(80) * (b[j] & 15) as f64, two, f16(82) * (b[j] >> 4) as f64)
            } else {
                let high = (b[i % 32] >> (i / 32)) & 1;
                let sc = moescope_kernels::ggml::q3_k_scale(&b[96..108], j) as f64 - 32.0;
                (f16(108) * sc, two - if high == 1 { 0.0 } else { 4.0 }, 0.0)
            }
        })
        .collect()
}

/// Q2_K, Q3_K, Q4_K and IQ4_XS products (activations quantized per 256, integer block sums): the same bits at
/// every tier and whatever the batch, and within the rounding of their few float operations of
/// the exact product of the file's values with the quantized activations.
fn block_sums_products(bmat: &Mat<'_>, raw: &[u8], seed: u64) {
    let (rows, cols) = (bmat.rows, bmat.cols);
    let t = match bmat.data {
        MatData::Blocks { t, .. } => t,
        _ => unreachable!(),
    };
    assert_eq!(bmat.quant_group(), Some(256), "{}: activations per 256", t.name());
    let (bb, nb) = (t.block_bytes(), cols / 256);
    let mut rng = seed;
    for n in [1, 2, 5, 9] {
        let x: Vec<f32> = (0..n * cols).map(|_| (next(&mut rng) % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut first: Option<Vec<f32>> = None;
        for isa in Isa::available() {
            let mut qa = QuantAct::default();
            qa.quantize(&x, cols, 256, isa);
            let mut got = vec![0f32; rows * n];
            bmat.matmul_rows(isa, Input::Quant(&qa), n, 0..rows, &mut got);
            // a piece of rows gives the same products
            let mut part = vec![0f32; (rows - 5) * n];
            bmat.matmul_rows(isa, Input::Quant(&qa), n, 3..rows - 2, &mut part);
            assert!(
                part.iter().zip(&got[3 * n..]).all(|(p, g)| p.to_bits() == g.to_bits()),
                "{} {isa}: piece",
                t.name()
            );
            for r in 0..rows {
                for tok in 0..n {
                    let (mut exact, mut size) = (0f64, 0f64);
                    for b in 0..nb {
                        let parts = block_parts(t, &raw[(r * nb + b) * bb..(r * nb + b + 1) * bb]);
                        let s = qa.scales[tok * nb + b] as f64;
                        for (i, (dsc, code, dm)) in parts.into_iter().enumerate() {
                            let a = qa.q[tok * cols + 256 * b + i] as f64 * s;
                            exact += (dsc * code - dm) * a;
                            size += (dsc.abs() * (code.abs() + 8.0) + dm.abs()) * a.abs();
                        }
                    }
                    // each lane's terms: d * a_scale, the product and the add rounded, nb adds and
                    // the 4 of the tree, on terms of at most `size` in all
                    let g = got[r * n + tok] as f64;
                    let bound = (nb + 8) as f64 * f32::EPSILON as f64 / 2.0 * size + 1e-30;
                    assert!(
                        (g - exact).abs() <= bound,
                        "{} {isa} n {n} row {r} token {tok}: {g} vs {exact} (bound {bound})",
                        t.name()
                    );
                }
            }
            match &first {
                None => first = Some(got),
                Some(f) => assert!(
                    f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} {isa}: differs from the scalar tier",
                    t.name()
                ),
            }
        }
        // each token as its own batch of one: the same bits
        let all = first.expect("a tier");
        for tok in 0..n {
            let mut qa = QuantAct::default();
            qa.quantize(&x[tok * cols..(tok + 1) * cols], cols, 256, Isa::detect());
            let mut one = vec![0f32; rows];
            bmat.matmul_rows(Isa::detect(), Input::Quant(&qa), 1, 0..rows, &mut one);
            for r in 0..rows {
                assert_eq!(one[r].to_bits(), all[r * n + tok].to_bits(), "{} n {n} token {tok} row {r}", t.name());
            }
        }
    }
}

#[test]
fn blocks_read_like_only_matrices_of_their_activation_group() {
    // Q2_K and IQ2_XS both compute as q8 groups of 16, IQ4_XS and IQ4_NL as q8 groups of 32; the
    // block-sum types read activations quantized per 256, so no quantized input serves both
    fn m(t: BlockType, q: &[u8]) -> Mat<'_> {
        Mat { rows: 2, cols: 256, data: MatData::Blocks { t, q } }
    }
    let raw = |t: BlockType| vec![0u8; t.bytes_of(512)];
    let (q2k, q3k, iq2xs) = (raw(BlockType::Q2K), raw(BlockType::Q3K), raw(BlockType::Iq2Xs));
    let (iq4xs, iq4nl) = (raw(BlockType::Iq4Xs), raw(BlockType::Iq4Nl));
    let (a, b) = (m(BlockType::Q2K, &q2k), m(BlockType::Iq2Xs, &iq2xs));
    assert_eq!(a.format(), b.format());
    assert!(!a.reads_like(&b) && !b.reads_like(&a));
    let (c, d) = (m(BlockType::Iq4Xs, &iq4xs), m(BlockType::Iq4Nl, &iq4nl));
    assert_eq!(c.format(), d.format());
    assert!(!c.reads_like(&d));
    assert!(a.reads_like(&m(BlockType::Q3K, &q3k)), "Q2_K and Q3_K: both per 256");
}
