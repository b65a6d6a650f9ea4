//! One step of the gated delta rule (`kernels::delta`), one thread, per ISA tier, on
//! Qwen3.5-35B-A3B's shape (dk = dv = 128: a 64 KiB f32 state per value head). Two cases:
//! prefill (one head through 512 tokens: token by token, its state from L2 each step; and
//! `delta::steps`, each block of the state's columns through all the tokens, as a prompt runs)
//! and decode (32 value heads, one token each, as one linear-attention layer's step: 2 MiB of
//! state, from L2/L3). Reports ns per (head, token) and the GB/s of state that would be read and
//! written once a token.
//! `cargo bench --bench delta_rule`.

use std::time::Instant;

use moescope_kernels::Isa;
use moescope_kernels::delta::{self, Step};

fn main() {
    let (dk, dv) = (128, 128);
    let mut s = 7u64;
    let mut r = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let unit = |x: Vec<f32>| {
        let n = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        x.into_iter().map(|v| v / n).collect::<Vec<f32>>()
    };
    let q = unit((0..dk).map(|_| r()).collect());
    let k = unit((0..dk).map(|_| r()).collect());
    let v: Vec<f32> = (0..dv).map(|_| r()).collect();
    for (what, heads, tokens) in [("prefill", 1, 512), ("steps", 1, 512), ("decode", 32, 1)] {
        for isa in Isa::available() {
            let mut states = vec![0f32; heads * dk * dv];
            let (mut u, mut o) = (vec![0f32; dv], vec![0f32; dv]);
            let x = |_| Step { q: &q, k: &k, v: &v, beta: 0.5, decay: 0.97 };
            let (mut outs, mut scratch) = (vec![0f32; tokens * dv], vec![0f32; delta::steps_scratch(dk, dv)]);
            let mut times = vec![];
            for _ in 0..50 {
                let t = Instant::now();
                for st in states.chunks_exact_mut(dk * dv) {
                    if what == "steps" {
                        delta::steps(isa, st, tokens, x, &mut scratch, &mut outs);
                        continue;
                    }
                    for _ in 0..tokens {
                        let x = Step { q: &q, k: &k, v: &v, beta: 0.5, decay: 0.97 };
                        delta::step(isa, st, x, &mut u, &mut o);
                    }
                }
                times.push(t.elapsed().as_secs_f64());
                std::hint::black_box((&o, &outs));
            }
            times.sort_by(f64::total_cmp);
            let t = times[times.len() / 2];
            let n = (heads * tokens) as f64;
            println!(
                "delta rule {what:<7} {heads:>2} heads x {tokens:>3} tokens, {dk}x{dv}, {isa:<6}: {:7.1} ns per (head, token), {:6.1} GB/s of state (read + write)",
                t * 1e9 / n,
                n * (2 * dk * dv * 4) as f64 / t / 1e9
            );
        }
    }
}
