//! The q4 lanes kernel's prompt products over an input that holds its tiles (placed as it was
//! quantized, in parts over threads, or gathered) and over one that does not (the kernel lays
//! them out itself): the same bits, at every tier and token count around the tiles' sizes.

use super::*;
use crate::act_tiles::TileOrder;
use crate::quant::{interleave_rows, quantize_q4_row};

use crate::testutil::uniform;

/// A q4 matrix of `rows` x `cols` in lane order (bytes, scales).
fn lanes_q4(w: &[f32], rows: usize, cols: usize, group: usize) -> (Vec<u8>, Vec<f32>) {
    let (ng, rb) = (cols / group, cols / 2);
    let (mut q, mut d) = (vec![0u8; rows * rb], vec![0f32; rows * ng]);
    for i in 0..rows {
        let wr = &w[i * cols..(i + 1) * cols];
        quantize_q4_row(wr, group, &mut q[i * rb..(i + 1) * rb], &mut d[i * ng..(i + 1) * ng]);
    }
    let (mut qx, mut ql, mut dl) = (vec![0u8; q.len()], vec![0u8; q.len()], vec![0f32; d.len()]);
    interleave_rows(&q, rb, 64, &mut qx);
    crate::quant::lane_rows(&qx, rb, &mut ql);
    crate::quant::lane_scales(&d, ng, &mut dl);
    (ql, dl)
}

#[test]
fn prompt_products_read_the_inputs_tiles_or_lay_out_their_own_the_same_bits() {
    let mut r = uniform(53);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (cols, group) in [(256, 32), (512, 64), (1024, 128)] {
        let rows = 48;
        let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
        let (q, d) = lanes_q4(&w, rows, cols, group);
        let m = Mat {
            rows,
            cols,
            data: MatData::Q4 { q: &q, scales: &d, group, x4: true, panels: false, lanes: true, mins: None },
        };
        for n in [2, 7, 9, 16, 17, 24, 33, 40] {
            let x: Vec<f32> = (0..(n + 5) * cols).map(|_| 4.0 * r()).collect();
            for isa in Isa::available() {
                // the tiles this tier reads, placed as the rows are quantized
                let mut whole = QuantAct::default();
                whole.quantize(&x[..n * cols], cols, group, isa);
                let want_order = crate::act_tiles::order_for(n, cols, group, isa);
                assert_eq!(whole.tiles.order(), (want_order, n), "{isa} n={n}");
                // in parts, as the threads quantize a prompt (parts of whole tiles of tokens)
                let mut parted = QuantAct::default();
                parted.prepare(n, cols, group, isa);
                for mut p in parted.parts(5) {
                    p.quantize(&x[..n * cols]);
                }
                assert_eq!(whole.tiles.values(), parted.tiles.values(), "{isa} n={n}: parts");
                // gathered from a larger input, as a routed expert's tokens are (rows 5.. of it)
                let mut big = QuantAct::default();
                big.quantize(&x, cols, group, isa);
                let mut gathered = QuantAct::default();
                gathered.gather_rows(&big, 5..n + 5);
                // the same input without its tiles: the kernel lays them out
                let mut other = whole.clone();
                other.tiles.prepare(TileOrder::None, n, cols, group);
                let run = |a: &QuantAct| {
                    let mut out = vec![0f32; rows * n];
                    m.matmul_rows(isa, Input::Quant(a), n, 0..rows, &mut out);
                    bits(&out)
                };
                let want = run(&whole);
                assert_eq!(want, run(&parted), "{isa} cols={cols} n={n}: parts");
                assert_eq!(want, run(&other), "{isa} cols={cols} n={n}: laid out by the kernel");
                let mut shifted = QuantAct::default();
                shifted.quantize(&x[5 * cols..(n + 5) * cols], cols, group, isa);
                assert_eq!(run(&shifted), run(&gathered), "{isa} cols={cols} n={n}: gathered");
                assert_eq!(shifted.tiles.values(), gathered.tiles.values(), "{isa} n={n}: gathered tiles");
            }
        }
    }
}
