//! Products of float weights (f32, bf16) over several tokens, across tiers.

use super::*;
use crate::quant::{bf16_to_f32, f32_to_bf16};
use crate::testutil::uniform;

#[test]
fn f32_over_several_tokens_gives_each_tokens_own_bits_at_every_tier() {
    // a prompt's f32 products (the router: runs of tokens over every row, four dots side by
    // side) against each token alone (decode's one dot), bit for bit, and near the f64 product;
    // tails of 8 and fewer values, runs of 16 tokens and their remainders, a piece of the rows
    let mut r = uniform(29);
    for (rows, cols, n) in [(3, 7, 2), (4, 24, 5), (5, 40, 16), (6, 2056, 17), (9, 136, 37)] {
        let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
        let x: Vec<f32> = (0..n * cols).map(|i| r() * [1.0, 37.0, 0.01][i % 3]).collect();
        let m = Mat { rows, cols, data: MatData::F32(&w) };
        for isa in Isa::available() {
            let piece = 1..rows;
            let mut out = vec![0f32; piece.len() * n];
            m.matmul_rows(isa, Input::F32(&x), n, piece.clone(), &mut out);
            let mut one = vec![0f32; piece.len()];
            for t in 0..n {
                m.matmul_rows(isa, Input::F32(&x[t * cols..(t + 1) * cols]), 1, piece.clone(), &mut one);
                for (i, row) in piece.clone().enumerate() {
                    let tag = format!("{isa} {rows}x{cols} n {n} row {row} token {t}");
                    assert_eq!(out[i * n + t].to_bits(), one[i].to_bits(), "{tag}: {} vs {}", out[i * n + t], one[i]);
                    let (mut want, mut mag) = (0f64, 0f64);
                    for j in 0..cols {
                        let p = w[row * cols + j] as f64 * x[t * cols + j] as f64;
                        want += p;
                        mag += p.abs();
                    }
                    assert!((one[i] as f64 - want).abs() <= mag * 1e-6, "{tag}: {} vs {want}", one[i]);
                }
            }
        }
    }
}

#[test]
fn bf16_over_several_tokens_gives_each_product_the_one_token_bits_at_every_tier() {
    // the AVX-512 tiles (4 x 4 and their edges, a last 8-value step, tails of 1..7 values) and
    // the row-by-row tiers: each product the bits of `dot_bf16` of its row and token alone, so
    // a row gets the same bits in any batch; and near the f64 product
    let mut r = uniform(23);
    for (rows, cols, n) in [(1, 32, 2), (4, 64, 4), (5, 75, 3), (9, 200, 9), (8, 2048, 5), (6, 24, 17)] {
        let w: Vec<u16> = (0..rows * cols).map(|_| f32_to_bf16(r())).collect();
        // activations over a few orders of magnitude, as hidden states have
        let x: Vec<f32> = (0..n * cols).map(|i| r() * [1.0, 37.0, 0.01][i % 3]).collect();
        let m = Mat { rows, cols, data: MatData::Bf16(&w) };
        for isa in Isa::available() {
            let mut out = vec![0f32; rows * n];
            m.matmul_rows(isa, Input::F32(&x), n, 0..rows, &mut out);
            for i in 0..rows {
                for t in 0..n {
                    let (mut want, mut mag) = (0f64, 0f64);
                    for j in 0..cols {
                        let p = bf16_to_f32(w[i * cols + j]) as f64 * x[t * cols + j] as f64;
                        want += p;
                        mag += p.abs();
                    }
                    let got = out[i * n + t];
                    let one = crate::dot::dot_bf16(isa, &w[i * cols..(i + 1) * cols], &x[t * cols..(t + 1) * cols]);
                    assert_eq!(got.to_bits(), one.to_bits(), "{isa} {rows}x{cols} n {n} row {i} token {t}");
                    assert!((got as f64 - want).abs() <= mag / 1e6, "{isa} {rows}x{cols} row {i} token {t}");
                }
            }
        }
    }
}
