//! Attention over a KV cache (`kernels::attn`), one thread, per ISA tier: a decode step's GQA
//! group (8 query heads on one KV head, head_dim 128, as Qwen3-30B-A3B) over contexts of 24
//! (part of one block of keys: a short chat) and 512 to 16384 positions, and a prefill tile
//! (16 tokens x 8 heads) over 4096. Reports ns per (query, key), GFLOP/s (4 x head_dim flops
//! each: the score and the weighted value) and, for decode, the GB/s of keys and values read
//! (f32; then the decode contexts again with keys and values kept in bf16 and in q8_0, the
//! bytes read those types'). Then DeepSeek-V3's absorbed latent attention in prefill: 128 heads of 576-dim queries
//! over one cache row per position whose first 512 dims are the values (`Values::KeyPrefix`),
//! tiles of 1, 4 and 16 tokens at the end of contexts of 512 and 4096 (2 x (576 + 512) flops a
//! (query, key)). `cargo bench --bench attention`.

use std::time::Instant;

use moescope_kernels::Isa;
use moescope_kernels::attn::{self, Bf16, Cached, F16, KvElem, Q8Keys, Q8Rows, State, q8};

fn main() {
    let hd = 128;
    let mut s = 1u64;
    let mut r = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    for (what, nq, n) in
        [("decode", 8, 24), ("decode", 8, 512), ("decode", 8, 4096), ("decode", 8, 16384), ("prefill", 128, 4096)]
    {
        let keys: Vec<f32> = (0..n * hd).map(|_| r()).collect();
        let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
        let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
        let packed = attn::pack_keys(&keys, hd);
        // decode: every query sees every key; prefill: a causal tile at the end of the context
        let ends: Vec<usize> = (0..nq).map(|i| if what == "decode" { n } else { n - (nq - 1 - i) / 8 }).collect();
        let pairs: usize = ends.iter().sum();
        for isa in Isa::available() {
            let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
            let mut out = vec![0f32; nq * hd];
            let mut times = vec![];
            let reps = (20_000_000 / pairs).clamp(3, 200);
            for _ in 0..reps {
                let t = Instant::now();
                attn::attend(
                    isa,
                    &q,
                    &ends,
                    &packed[..],
                    &vals[..],
                    attn::Scoring::full(0.088),
                    &[],
                    &mut acc,
                    &mut part,
                    &mut out,
                );
                times.push(t.elapsed().as_secs_f64());
                std::hint::black_box(&out);
            }
            times.sort_by(f64::total_cmp);
            let t = times[times.len() / 2];
            let kv_gbs = if what == "decode" {
                format!("{:6.1} GB/s of K and V", (2 * n * hd * 4) as f64 / t / 1e9)
            } else {
                String::new()
            };
            println!(
                "attention {what:<7} {nq:>3} queries x {n:>5} keys, head_dim {hd}, {isa:<6}: {:6.2} ns per (query, key), {:6.1} GFLOP/s {kv_gbs}",
                t * 1e9 / pairs as f64,
                (4 * hd * pairs) as f64 / t / 1e9
            );
        }
    }
    typed(&mut r);
    latent(&mut r);
}

/// Decode over bf16 and q8_0 caches (see the module's doc).
fn typed(r: &mut impl FnMut() -> f32) {
    let (hd, nq) = (128, 8);
    for n in [4096, 16384] {
        let keys: Vec<f32> = (0..n * hd).map(|_| r()).collect();
        let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
        let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
        let packed = attn::pack_keys(&keys, hd);
        let bf = |x: &[f32]| x.iter().map(|&v| Bf16::from_f32(v)).collect::<Vec<_>>();
        let (kb, vb) = (bf(&packed), bf(&vals));
        let (mut kc, mut ks) = (vec![0i8; packed.len()], vec![F16(0); packed.len() / q8::Q8_GROUP]);
        let (mut vc, mut vs) = (vec![0i8; vals.len()], vec![F16(0); vals.len() / q8::Q8_GROUP]);
        for (j, (k, v)) in keys.chunks_exact(hd).zip(vals.chunks_exact(hd)).enumerate() {
            q8::store_key(&mut kc, &mut ks, j, k);
            q8::store_row(&mut vc, &mut vs, j * hd, v);
        }
        let ends = vec![n; nq];
        let kinds = [
            ("bf16", Cached::Bf16(&kb), Cached::Bf16(&vb), 2.0),
            ("q8_0", Cached::Q8Keys(Q8Keys::new(&kc, &ks)), Cached::Q8Rows(Q8Rows::new(&vc, &vs)), 34.0 / 32.0),
        ];
        for isa in Isa::available().into_iter().filter(|&i| i >= Isa::Avx2) {
            for &(name, k, v, bytes) in &kinds {
                let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
                let mut out = vec![0f32; nq * hd];
                let mut times = vec![];
                for _ in 0..(20_000_000 / (nq * n)).clamp(3, 200) {
                    let t = Instant::now();
                    let sc = attn::Scoring::full(0.088);
                    attn::attend_cached(isa, (&q, hd), &ends, k, Some(v), sc, &[], (&mut acc, &mut part), &mut out);
                    times.push(t.elapsed().as_secs_f64());
                    std::hint::black_box(&out);
                }
                times.sort_by(f64::total_cmp);
                let t = times[times.len() / 2];
                println!(
                    "attention decode    {nq} queries x {n:>5} keys, head_dim {hd}, {isa:<6} {name}: {:6.2} ns per (query, key), {:6.1} GB/s of K and V",
                    t * 1e9 / (nq * n) as f64,
                    2.0 * (n * hd) as f64 * bytes / t / 1e9
                );
            }
        }
    }
}

/// The latent-attention prefill tiles (see the module's doc).
fn latent(r: &mut impl FnMut() -> f32) {
    let (nh, hk, hv) = (128, 576, 512);
    for n in [512, 4096] {
        let keys: Vec<f32> = (0..n * hk).map(|_| r()).collect();
        let packed = attn::pack_keys(&keys, hk);
        for tokens in [1, 4, 16] {
            let nq = tokens * nh;
            let q: Vec<f32> = (0..nq * hk).map(|_| r()).collect();
            let ends: Vec<usize> = (0..nq).map(|i| n - (tokens - 1 - i / nh)).collect();
            let pairs: usize = ends.iter().sum();
            for isa in Isa::available().into_iter().filter(|&i| i >= Isa::Avx2) {
                let (mut acc, mut part) = (State::new(nq, hv), State::new(nq, hv));
                let mut out = vec![0f32; nq * hv];
                let mut times = vec![];
                for _ in 0..(200_000_000 / (pairs * hk)).clamp(3, 50) {
                    let t = Instant::now();
                    let sc = attn::Scoring::full(0.07);
                    let (kp, vals) = (&packed[..], attn::Values::<&[f32]>::KeyPrefix);
                    attn::attend_keyed(isa, (&q, hk), &ends, kp, vals, sc, &[], (&mut acc, &mut part), &mut out);
                    times.push(t.elapsed().as_secs_f64());
                    std::hint::black_box(&out);
                }
                times.sort_by(f64::total_cmp);
                let t = times[times.len() / 2];
                println!(
                    "latent  prefill {tokens:>2} tokens x {nh} heads x {n:>5} keys, {hk}/{hv}, {isa:<6}: {:6.2} ns per (query, key), {:6.1} GFLOP/s",
                    t * 1e9 / pairs as f64,
                    (2 * (hk + hv) * pairs) as f64 / t / 1e9
                );
            }
        }
    }
}
