//! Matrices kept as a GGUF file's blocks (`MatData::Blocks`) against gguf-py's values (the
//! fixture's blocks, laid out as rows) and against the q8 matrix of their codes, scales and
//! mins that a relayout writes: the same products bit for bit at every tier and batch, for
//! all rows and for pieces that start and end inside a decoded block of rows.

mod common;

use moescope_kernels::Isa;
use moescope_kernels::act::QuantAct;
use moescope_kernels::ggml::BlockType;
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
            let mins = with_mins.then_some(&mn[..]);
            let qmat = Mat { rows, cols, data: MatData::Q8 { q: &codes, scales: &sc, group, mins } };
            same_products(&bmat, &qmat, group, seed);
        }
        tested.push(f.t);
    }
    let want = [BlockType::Q5_0, BlockType::Q5K, BlockType::Q2K, BlockType::Q3K, BlockType::Iq4Nl, BlockType::Iq4Xs];
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
