//! Matrix-vector products per format and ISA tier, on a Qwen3-30B-A3B expert's shapes
//! (gate/up `[768, 2048]`, down `[2048, 768]`) and its attention q_proj `[4096, 2048]`, one
//! thread: GB/s of weights streamed, median of repeated runs. `q4x4` is q4 with rows interleaved
//! by 4 (`q4_lohi32_x4`, what packages store): the row-major `q4` beside it shows what the layout
//! buys.
//!
//! Then each matrix times 64 tokens (prefill's batched products), in GFLOP/s.
//!
//! With `batch` among the arguments, instead: each matrix times 1, 2, 4 and 8 tokens from memory
//! (a server's decode batch, one token per sequence), time per product against one token's.
//!
//! `cargo bench --bench matvec [-- FORMAT ... TIER ... batch]` (only those formats, e.g. `mxfp4 q8`, at
//! those tiers, e.g. `avx512`; the decode
//! and prefill macro numbers come from `moescope bench`).

use std::time::Instant;

use moescope_kernels::Format;
use moescope_kernels::mat::{Input, Mat, MatData};
use moescope_kernels::quant::{
    f32_to_bf16, interleave_rows, lane_rows, lane_scales, panel_rows, quantize_q4_row, quantize_q6_row, quantize_q8_row,
};
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

/// `w` (`[rows, cols]`) in `format`: value bytes (rows interleaved when `x4`, panel-major when
/// `panels` too, in lane order when `lanes` instead) and scales.
fn encode(
    format: Format,
    w: &[f32],
    rows: usize,
    cols: usize,
    (x4, panels, lanes): (bool, bool, bool),
) -> (Vec<u8>, Vec<f32>) {
    let (rb, ng) = (format.data_bytes(1, cols), format.group().map_or(0, |g| cols / g));
    let (mut q, mut d) = (vec![0u8; rows * rb], vec![0f32; rows * ng]);
    for r in 0..rows {
        let (wr, qr) = (&w[r * cols..(r + 1) * cols], &mut q[r * rb..(r + 1) * rb]);
        let dr = &mut d[r * ng..(r + 1) * ng];
        match format {
            Format::Bf16 => {
                for (o, v) in qr.chunks_exact_mut(2).zip(wr) {
                    o.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
                }
            }
            Format::Q8 { group } => {
                let mut q8 = vec![0i8; cols];
                quantize_q8_row(wr, group, &mut q8, dr);
                for (o, v) in qr.iter_mut().zip(q8) {
                    *o = v as u8;
                }
            }
            Format::Q4 { group } => quantize_q4_row(wr, group, qr, dr),
            Format::Q6 { group } => quantize_q6_row(wr, group, qr, dr),
            Format::Mxfp4 => moescope_kernels::mxfp4::quantize_row(wr, qr),
            Format::F32 => unreachable!("not measured"),
        }
    }
    if x4 {
        let mut out = vec![0u8; q.len()];
        interleave_rows(&q, rb, format.chunk_bytes().unwrap_or(rb), &mut out);
        q = out;
    }
    if panels {
        let mut out = vec![0u8; q.len()];
        panel_rows(&q, rb, format.chunk_bytes().unwrap_or(rb), &mut out);
        q = out;
    }
    if lanes {
        let mut out = vec![0u8; q.len()];
        lane_rows(&q, rb, &mut out);
        q = out;
        // the scales in lane order too
        let mut dl = vec![0f32; d.len()];
        lane_scales(&d, ng, &mut dl);
        d = dl;
    }
    (q, d)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One format's matrix: (Mat, input, bytes).
#[allow(clippy::too_many_arguments)]
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

/// A server's decode batch: every copy of the matrix times 1, 2, 4 and 8 tokens (from memory,
/// as decode reads it), milliseconds per product and the ratio to one token's.
fn decode_batches(rows: usize, cols: usize, isa: Isa, fmt: &str, mats: &[Mat<'_>], group: usize) {
    let mut one = 0.0;
    for n in [1usize, 2, 4, 8] {
        let xs = rnd(n * cols, 3);
        let mut qn = QuantAct::default();
        qn.quantize(&xs, cols, group, Isa::detect());
        let input = if fmt == "bf16" { Input::F32(&xs) } else { Input::Quant(&qn) };
        let mut out = vec![0f32; rows * n];
        let mut times = vec![];
        for _ in 0..9 {
            let t = Instant::now();
            for m in mats {
                m.matmul_rows(isa, input, n, 0..rows, &mut out);
            }
            times.push(t.elapsed().as_secs_f64() / mats.len() as f64);
        }
        let ms = median(times) * 1e3;
        if n == 1 {
            one = ms;
        }
        println!(
            "batch  [{rows:>6}, {cols:>4}] {fmt:<8} {isa:<7} {n} tokens {ms:8.3} ms  x{:.2} of one token  (1 thread)",
            ms / one
        );
    }
}

fn main() {
    // the decode kernels' software prefetch as the engine sets it (`MOESCOPE_WEIGHT_PREFETCH`)
    match moescope_kernels::prefetch::setting_from_env() {
        Ok(d) => moescope_kernels::prefetch::set_distance(d),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
    // the machine's read bandwidth now: the roofline for every "memory" number below
    let probe = moescope::sysinfo::read_bandwidth(1, 256 << 20, 15);
    println!(
        "read bandwidth (sum of 256 MB, 1 thread): {:.1} GB/s (plain {:.1}, prefetching {:.1}); kernels: {}",
        probe.best(),
        probe.plain,
        probe.prefetched,
        moescope_kernels::prefetch::describe()
    );
    // "memory": copies making a working set of 256 MB or more, far past the L3 cache, so the
    // numbers are memory-bound like decode; "hot": one copy over and over (in L2 or L3), so
    // the number is the kernel's own speed, the ceiling it would reach with infinite bandwidth
    // the output layer [151936, 2048] only in the formats packages give it
    let shapes: [(usize, usize, &[&str]); 9] = [
        // x4l: lane order (what the engine makes of x4 q4 where AVX-512 runs)
        (768, 2048, &["bf16", "q8", "q4", "q4x4", "q4x4l", "q4g32x4l", "q6", "q6x4", "mxfp4"]),
        (2048, 768, &["bf16", "q8", "q4", "q4x4", "mxfp4"]),
        (4096, 2048, &["bf16", "q8", "q4", "q4x4", "q4x4l", "q4g32x4", "q4g32x4p", "q6", "q6x4"]),
        // DeepSeek-V3's o_proj: 512 groups of 32 a row, 2 KiB of scales beside 8 KiB of values
        // and x4p: the panel-major order the engine gives resident rows this long
        (7168, 16384, &["q4x4", "q4g32x4", "q4g32x4p", "q4g32"]),
        (4096, 4096, &["q4g32x4", "q4g32x4p"]),
        (4096, 7168, &["q4g32x4", "q4g32x4p", "q4g32"]),
        (2048, 10240, &["q4g32x4", "q4g32x4p"]),
        // gpt-oss's expert rows (2880 values: 90 MXFP4 blocks, q8 in groups of 64)
        (5760, 2880, &["q8", "mxfp4"]),
        (151936, 2048, &["q8", "q6", "q6x4"]),
    ];
    // `cargo bench` passes `--bench`; any other argument names a format to keep
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    for (rows, cols, fmts) in shapes {
        if !only.is_empty() && !fmts.iter().any(|f| only.iter().any(|o| o == f)) {
            continue;
        }
        let w = rnd(rows * cols, 1);
        let x = rnd(cols, 2);
        let g = 128;
        for &fmt in fmts.iter().filter(|f| only.is_empty() || only.iter().any(|o| o == *f)) {
            // the matrix's value bytes (q4x4/q6x4: rows interleaved by 4, the layout packages
            // store; the row-major format beside each shows what that buys) and scales
            let format = match fmt {
                "bf16" => Format::Bf16,
                "q8" => Format::Q8 { group: g },
                "q4" | "q4x4" | "q4x4l" => Format::Q4 { group: g },
                // GGUF Q4_0's groups (the q4g32 packages)
                "q4g32x4" | "q4g32x4p" | "q4g32" | "q4g32x4l" => Format::Q4 { group: 32 },
                "mxfp4" => Format::Mxfp4,
                _ => Format::Q6 { group: g },
            };
            // the activations quantized with the format's group (MXFP4: 32)
            let mut qa = QuantAct::default();
            qa.quantize(&x, cols, format.group().unwrap_or(g), Isa::detect());
            let (x4, panels, lanes) = (fmt.contains("x4"), fmt.ends_with("x4p"), fmt.ends_with("x4l"));
            let (vals, scales) = encode(format, &w, rows, cols, (x4, panels, lanes));
            let bytes = vals.len();
            let copies = (256usize << 20).div_ceil(bytes);
            // the copies side by side in one arena of 2 MiB pages, as the engine keeps the dense
            // weights (`Package::make_resident`): 4 KiB pages cost decode a TLB walk a page
            let mut arena = memmap2::MmapMut::map_anon(bytes * copies).expect("anonymous mapping for the copies");
            let _ = arena.advise(memmap2::Advice::HugePage);
            for c in arena.chunks_exact_mut(bytes) {
                c.copy_from_slice(&vals);
            }
            // each copy its own scales, as each matrix of a package has: decode streams them
            // beside the values (one shared copy would sit in the cache)
            let scale_copies: Vec<Vec<f32>> = (0..copies).map(|_| scales.clone()).collect();
            let mats: Vec<Mat<'_>> = arena
                .chunks_exact(bytes)
                .zip(&scale_copies)
                .map(|(b, scales)| {
                    let data = match format {
                        // SAFETY (both): the arena is page-aligned and each copy a whole number
                        // of elements; the views live no longer than the arena
                        Format::Bf16 => {
                            MatData::Bf16(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u16, bytes / 2) })
                        }
                        Format::Q8 { group } => MatData::Q8 {
                            q: unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i8, bytes) },
                            scales,
                            group,
                            mins: None,
                        },
                        Format::Q4 { group } => MatData::Q4 { q: b, scales, group, x4, panels, lanes, mins: None },
                        Format::Mxfp4 => MatData::Mxfp4 { q: b },
                        _ => MatData::Q6 { q: b, scales, group: g, x4, panels },
                    };
                    Mat { rows, cols, data }
                })
                .collect();
            // tiers named among the arguments (`avx512`, ...), else every tier
            let named: Vec<Isa> = Isa::available().into_iter().filter(|i| only.iter().any(|o| o == i.name())).collect();
            for isa in if named.is_empty() { Isa::available() } else { named } {
                if only.iter().any(|o| o == "batch") {
                    decode_batches(rows, cols, isa, fmt, &mats, format.group().unwrap_or(g));
                    continue;
                }
                let mem = run(rows, cols, isa, fmt, &mats, &x, &qa, 1);
                // (a matrix past the L3 cache has no hot number)
                let hot = if bytes <= 16 << 20 {
                    format!("{:6.1} GB/s", run(rows, cols, isa, fmt, &mats[..1], &x, &qa, copies.min(64)))
                } else {
                    "     -     ".into()
                };
                println!(
                    "matvec [{rows:>6}, {cols:>4}] {fmt:<5} {isa:<7} memory {mem:6.1} GB/s  hot {hot}  (1 thread)"
                );
                // prefill: the same matrix times 64 tokens, as the engine's batched products
                // run (each weight row read once for the batch); compute-bound, so GFLOP/s.
                // Lane order also at an expert's typical 12 and 24 tokens of a prompt (where
                // the AMX tier's tiles start to pay)
                let batches: &[usize] = if lanes { &[12, 24, 64] } else { &[64] };
                for &n in batches.iter().filter(|_| rows <= 4096) {
                    let mut times = vec![];
                    let xs = rnd(n * cols, 3);
                    let mut qn = QuantAct::default();
                    qn.quantize(&xs, cols, format.group().unwrap_or(g), Isa::detect());
                    let input = if fmt == "bf16" { Input::F32(&xs) } else { Input::Quant(&qn) };
                    let mut out = vec![0f32; rows * n];
                    for _ in 0..7 {
                        let t = Instant::now();
                        mats[0].matmul_rows(isa, input, n, 0..rows, &mut out);
                        times.push(t.elapsed().as_secs_f64());
                    }
                    let gflops = (2 * rows * cols * n) as f64 / median(times) / 1e9;
                    println!(
                        "matmul [{rows:>6}, {cols:>4}] x {n} tokens {fmt:<5} {isa:<7} {gflops:7.1} GFLOP/s  (1 thread)"
                    );
                }
            }
        }
    }
}
