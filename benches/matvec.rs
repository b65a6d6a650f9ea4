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

/// One format's matrix: (Mat, input, bytes).
fn run(
    rows: usize,
    cols: usize,
    isa: Isa,
    fmt: &str,
    mats: &[Mat<'_>],
    x: &[f32],
    qa: &QuantAct,
    passes: usize,
) -> f64 {
    let mut out = vec![0f32; rows];
    let mut times = vec![];
    let input = if fmt == "bf16" { Input::F32(x) } else { Input::Quant(qa) };
    let bytes = mats[0].format().data_bytes(rows, cols) + mats[0].format().scale_bytes(rows, cols);
    for _ in 0..15 {
        let t = Instant::now();
        for _ in 0..passes {
            for m in mats {
                m.matmul_rows(isa, input, 1, 0..rows, &mut out);
            }
        }
        times.push(t.elapsed().as_secs_f64());
    }
    (bytes * mats.len() * passes) as f64 / median(times) / 1e9
}

fn main() {
    // the machine's read bandwidth now: the roofline for every "memory" number below
    println!(
        "read bandwidth (sum of 256 MB, 1 thread): {:.1} GB/s",
        moescope::sysinfo::read_bandwidth(1, 256 << 20, 15)
    );
    // "memory": copies making a working set of 256 MB or more, far past the L3 cache, so the
    // numbers are memory-bound like decode; "hot": one copy over and over (in L2 or L3), so
    // the number is the kernel's own speed, the ceiling it would reach with infinite bandwidth
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
        let mut qa = QuantAct::default();
        qa.quantize(&x, cols, g);
        for fmt in ["bf16", "q8", "q4"] {
            let bytes = match fmt {
                "bf16" => rows * cols * 2,
                "q8" => rows * cols,
                _ => rows * cols / 2,
            };
            let copies = (256usize << 20).div_ceil(bytes);
            let b16: Vec<Vec<u16>> = if fmt == "bf16" { (0..copies).map(|_| wb.clone()).collect() } else { vec![] };
            let b8: Vec<Vec<i8>> = if fmt == "q8" { (0..copies).map(|_| q8.clone()).collect() } else { vec![] };
            let b4: Vec<Vec<u8>> = if fmt == "q4" { (0..copies).map(|_| q4.clone()).collect() } else { vec![] };
            let mats: Vec<Mat<'_>> = match fmt {
                "bf16" => b16.iter().map(|b| Mat { rows, cols, data: MatData::Bf16(b) }).collect(),
                "q8" => {
                    b8.iter().map(|b| Mat { rows, cols, data: MatData::Q8 { q: b, scales: &d8, group: g } }).collect()
                }
                _ => b4.iter().map(|b| Mat { rows, cols, data: MatData::Q4 { q: b, scales: &d4, group: g } }).collect(),
            };
            for isa in Isa::available() {
                let mem = run(rows, cols, isa, fmt, &mats, &x, &qa, 1);
                let hot = run(rows, cols, isa, fmt, &mats[..1], &x, &qa, copies.min(64));
                println!(
                    "matvec [{rows:>4}, {cols:>4}] {fmt:<5} {isa:<7} memory {mem:6.1} GB/s  hot {hot:6.1} GB/s  (1 thread)"
                );
            }
        }
    }
}
