//! `Exec`'s sections: a product of several matrices gives each the bits it has alone, pieces
//! cover their rows in order, and a capped exec quantizes with its own tier.

use moescope_kernels::mat::MatData;
use moescope_kernels::ops::{Glu, swiglu};
use moescope_kernels::quant::{interleave_rows, quantize_q4_row};
use moescope_kernels::{Isa, Mat};

use super::{Exec, GatePair, Scratch};

/// Seeded values in [-0.5, 0.5).
fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// A `[rows, cols]` q4 matrix (group 32): its bytes and scales, rows interleaved by 4 where
/// the converter would interleave them (see `x4`).
fn q4x4(seed: u64, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let w = uniform(seed, rows * cols);
    let (rb, ng) = (cols / 2, cols / 32);
    let (mut q, mut d) = (vec![0u8; rows * rb], vec![0f32; rows * ng]);
    for r in 0..rows {
        quantize_q4_row(&w[r * cols..(r + 1) * cols], 32, &mut q[r * rb..(r + 1) * rb], &mut d[r * ng..(r + 1) * ng]);
    }
    if !x4(rows, cols) {
        return (q, d);
    }
    let mut out = vec![0u8; q.len()];
    interleave_rows(&q, rb, 64, &mut out);
    (out, d)
}

/// Whether rows are interleaved: whole blocks of 4 rows of whole 128-value chunks.
fn x4(rows: usize, cols: usize) -> bool {
    rows.is_multiple_of(4) && cols.is_multiple_of(128)
}

fn mat<'a>(rows: usize, cols: usize, (q, d): &'a (Vec<u8>, Vec<f32>)) -> Mat<'a> {
    Mat {
        rows,
        cols,
        data: MatData::Q4 { q, scales: d, group: 32, x4: x4(rows, cols), panels: false, lanes: false, mins: None },
    }
}

/// The first index where two results differ in any bit.
fn first_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    (a.len() != b.len())
        .then_some(a.len().min(b.len()))
        .or_else(|| a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()))
}

#[test]
fn a_capped_exec_quantizes_with_its_own_tier() {
    // MOESCOPE_ISA caps Exec's tier; the activation quantizer must follow it, not the CPU
    let (h, rows) = (256, 8);
    let w = q4x4(3, rows, h);
    let x = uniform(4, h);
    for isa in Isa::available() {
        let exec = Exec::new(1, isa).expect("exec");
        let mut s = Scratch::default();
        let mut y = vec![0f32; rows];
        exec.matmul("w", &mat(rows, h, &w), &x, 1, &mut y, &mut s);
        assert!(s.other.tier <= isa, "{isa:?} quantized with {:?}", s.other.tier);
        if isa < Isa::Avx512 {
            assert!(s.other.permuted.is_empty(), "{isa:?} made the AVX-512 layout");
        }
    }
}

#[test]
fn row_sections_give_each_product_bits_as_computed_alone() {
    // three experts of awkward sizes: 288 intermediate rows (more than one stack piece of
    // the fused SwiGLU; their down projections row-major), 128 and 32; input 256 wide; down
    // projections 256 rows of their width
    let (h, sizes) = (256, [288usize, 128, 32]);
    let gates: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| q4x4(10 + i as u64, n, h)).collect();
    let ups: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| q4x4(20 + i as u64, n, h)).collect();
    let x = uniform(7, h);
    for isa in Isa::available() {
        let one = Exec::new(1, isa).expect("exec");
        // what each product gives alone, one thread
        let mut want_act = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let (mut g, mut u) = (vec![0f32; n], vec![0f32; n]);
            one.matmul("g", &mat(n, h, &gates[i]), &x, 1, &mut g, &mut Scratch::default());
            one.matmul("u", &mat(n, h, &ups[i]), &x, 1, &mut u, &mut Scratch::default());
            let mut a = vec![0f32; n];
            swiglu(&g, &u, &mut a);
            want_act.extend(a);
        }
        // down projections [h, n] of each expert's activation
        let downs: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| q4x4(30 + i as u64, h, n)).collect();
        let acts: Vec<Vec<f32>> = sizes.iter().map(|&n| uniform(n as u64, n)).collect();
        let mut want_down = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let mut y = vec![0f32; h];
            one.matmul("d", &mat(h, n, &downs[i]), &acts[i], 1, &mut y, &mut Scratch::default());
            want_down.extend(y);
        }
        for threads in [1, 2, 3] {
            // one piece per thread and more, down to one block of rows each
            for least in [1 << 20, 4096, 0] {
                let ex = Exec::new(threads, isa).expect("exec").with_min_piece_bytes(least);
                let gm: Vec<Mat<'_>> = sizes.iter().enumerate().map(|(i, &n)| mat(n, h, &gates[i])).collect();
                let um: Vec<Mat<'_>> = sizes.iter().enumerate().map(|(i, &n)| mat(n, h, &ups[i])).collect();
                let pairs: Vec<GatePair<'_>> =
                    gm.iter().zip(&um).map(|(gate, up)| GatePair { gate, up, bias: None }).collect();
                let mut act = vec![0f32; want_act.len()];
                ex.swiglu_pairs("gu", &pairs, Glu::Silu, &x, &mut act, &mut Scratch::default());
                let d = first_difference(&act, &want_act);
                assert_eq!(d, None, "{isa} swiglu_pairs, {threads} threads, pieces of {least} B");
                let dm: Vec<Mat<'_>> = sizes.iter().enumerate().map(|(i, &n)| mat(h, n, &downs[i])).collect();
                let prods: Vec<(&Mat<'_>, &[f32])> = dm.iter().zip(&acts).map(|(m, a)| (m, a.as_slice())).collect();
                let mut y = vec![0f32; want_down.len()];
                ex.matvec_each("d", &prods, &mut y, &mut Scratch::default());
                let d = first_difference(&y, &want_down);
                assert_eq!(d, None, "{isa} matvec_each, {threads} threads, pieces of {least} B");
            }
        }
    }
}

#[test]
fn pieces_cover_the_rows_in_order_and_shrink_to_the_least_size() {
    let ex = Exec::new(3, Isa::Scalar).expect("exec").with_min_piece_bytes(1000);
    for rows in [0usize, 1, 3, 4, 5, 64, 1001, 151_936] {
        for row_bytes in [1usize, 100, 1088] {
            let least = 1000usize.div_ceil(row_bytes);
            let p = ex.pieces(rows, row_bytes);
            // contiguous from 0 to rows, each non-empty
            let mut r0 = 0;
            for r in &p {
                assert_eq!(r.start, r0, "{rows} rows of {row_bytes} B: a gap or overlap at {r0}");
                assert!(r.end > r.start, "{rows} rows: an empty piece");
                r0 = r.end;
            }
            assert_eq!(r0, rows, "{rows} rows of {row_bytes} B: pieces end at {r0}");
            for (i, r) in p.iter().enumerate() {
                let last = i + 1 == p.len();
                // whole superblocks of panel-major rows (so whole blocks of interleaved rows) and
                // at least the least size, but the last
                assert!(last || (r.start % 16 == 0 && r.len() % 16 == 0), "{rows} rows: piece {r:?}");
                assert!(last || r.len() >= least, "{rows} rows of {row_bytes} B: piece {r:?} under {least}");
                // never larger than a sixth (1 / (2 x 3 threads)) of what was left, rounded up
                let cap = (rows - r.start).div_ceil(6).max(least).next_multiple_of(16);
                assert!(r.len() <= cap, "{rows} rows: piece {r:?} over {cap}");
            }
            // shrinking: no piece after the first is larger than the one before it
            assert!(p.windows(2).all(|w| w[1].len() <= w[0].len()), "{rows} rows: {p:?}");
        }
    }
    // one thread: the whole product as one piece (one weight stream)
    let one = Exec::new(1, Isa::Scalar).expect("exec");
    assert_eq!(one.pieces(151_936, 1088).to_vec(), vec![0..151_936]);
}
