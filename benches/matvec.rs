//! Matrix-vector products per format and ISA tier, on a Qwen3-30B-A3B expert's shapes
//! (gate/up `[768, 2048]`, down `[2048, 768]`) and its attention q_proj `[4096, 2048]`, one
//! thread: GB/s of weights streamed, median of repeated runs.
//!
//! `cargo bench --bench matvec` (the decode and prefill macro numbers come from `moescope run
//! --json` now, and from `moescope bench` when it lands).

use std::time::Instant;

use moescope_kernels::mat::{Input, Mat, MatData};
use moescope_kernels::quant::{f32_to_bf16, quantize_q4_row, quantize_q8_row};
use moescope_kernels::{Isa, QuantAct};

fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    // a working set larger than the L3 cache, so the numbers are memory-bound like decode
    let copies = 24;
    for (rows, cols) in [(768usize, 2048usize), (2048, 768), (4096, 2048)] {
        let w = rnd(rows * cols, 1);
        let x = rnd(cols, 2);
        let wb: Vec<u16> = w.iter().map(|v| f32_to_bf16(*v)).collect();
        let g = 128;
        let mut q8 = vec![0i8; rows * cols];
        let mut d8 = vec![0f32; rows * cols / g];
        let mut q4 = vec![0u8; rows * cols / 2];
        let mut d4 = vec![0f32; rows * cols / g];
        for r in 0..rows {
            let (a, b) = (r * cols, (r + 1) * cols);
            quantize_q8_row(&w[a..b], g, &mut q8[a..b], &mut d8[r * cols / g..(r + 1) * cols / g]);
            quantize_q4_row(&w[a..b], g, &mut q4[a / 2..b / 2], &mut d4[r * cols / g..(r + 1) * cols / g]);
        }
        let bufs: Vec<(Vec<u16>, Vec<i8>, Vec<u8>)> =
            (0..copies).map(|_| (wb.clone(), q8.clone(), q4.clone())).collect();
        let mut qa = QuantAct::default();
        qa.quantize(&x, cols, g);
        for isa in Isa::available() {
            for fmt in ["bf16", "q8", "q4"] {
                let mut out = vec![0f32; rows];
                let mut times = vec![];
                let mut bytes = 0usize;
                for rep in 0..15 {
                    let t = Instant::now();
                    for (b16, b8, b4) in &bufs {
                        let (m, input) = match fmt {
                            "bf16" => (Mat { rows, cols, data: MatData::Bf16(b16) }, Input::F32(&x)),
                            "q8" => (
                                Mat { rows, cols, data: MatData::Q8 { q: b8, scales: &d8, group: g } },
                                Input::Quant(&qa),
                            ),
                            _ => (
                                Mat { rows, cols, data: MatData::Q4 { q: b4, scales: &d4, group: g } },
                                Input::Quant(&qa),
                            ),
                        };
                        m.matmul_rows(isa, input, 1, 0..rows, &mut out);
                        if rep == 0 {
                            bytes += m.format().data_bytes(rows, cols) + m.format().scale_bytes(rows, cols);
                        }
                    }
                    times.push(t.elapsed().as_secs_f64());
                }
                let gbs = bytes as f64 / median(times) / 1e9;
                println!(
                    "matvec [{rows:>4}, {cols:>4}] {fmt:<5} {isa:<7} {gbs:6.1} GB/s  (1 thread, {copies} matrices in turn)"
                );
            }
        }
    }
}
