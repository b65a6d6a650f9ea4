//! Attention over a context longer than one split of `kernels::attn` (1024 positions): the
//! prompt's pass (splits folded one after another, tiles of tokens) against the same tokens
//! decoded one at a time (splits as parallel tasks, merged afterwards), at every ISA tier and
//! thread count. Each query's attention is the same operations in the same order either way
//! (`kernels::attn`); the products around it may differ in the last bits between a batch and a
//! single token, so the logits are held to the cached-decode tolerance of
//! tests/reference_logits.rs, and across thread counts to the same bits.

mod common;

use common::*;
use moescope::engine::{Engine, EngineOptions};
use moescope::model::{Logits, NoObserver};
use moescope_kernels::Isa;
use moescope_kernels::attn::SPLIT;

#[test]
fn a_long_prompt_in_one_pass_matches_its_tokens_decoded_one_by_one() {
    // the trained demo model: 4096 positions, GQA 4 query heads on 2 KV heads of 64
    let (_d, pkg) = convert("demo", "bf16");
    let n = SPLIT + 200;
    let (head, tail) = (SPLIT - 24, 224);
    assert_eq!(head + tail, n);
    // a deterministic spread of ids over the 4096-token vocabulary
    let ids: Vec<u32> = (0..n as u32).map(|i| ((i * 2654435761u32) >> 20) % 4096).collect();
    for isa in Isa::available() {
        let mut per_threads = Vec::new();
        for threads in [1, 3] {
            let opts = EngineOptions {
                threads,
                ctx_size: Some(n + 8),
                isa,
                stream: None,
                panels: true,
                kv: moescope::model::KvTypes::F32,
            };
            let mut eng = Engine::load(&pkg, opts).expect("load");
            let v = eng.config().vocab_size;
            let one = eng.eval(&ids, Logits::All, &mut NoObserver).expect("one pass").to_vec();
            assert_eq!(one.len(), n * v);
            assert!(one.iter().all(|x| x.is_finite()), "{isa} {threads}T: non-finite logits");
            eng.reset();
            let mut inc = eng.eval(&ids[..head], Logits::Last, &mut NoObserver).expect("prefill").to_vec();
            for &id in &ids[head..n - 1] {
                inc.extend_from_slice(eng.eval(&[id], Logits::Last, &mut NoObserver).expect("decode"));
            }
            // rows head-1 .. n-1: positions on both sides of the split boundary
            let d = max_abs_diff(&inc, &one[(head - 1) * v..(n - 1) * v]);
            assert!(d <= 1e-4, "{isa} {threads}T: decoded one by one differs from one pass by {d}");
            per_threads.push((threads, one, inc));
        }
        let (_, one1, inc1) = &per_threads[0];
        for (t, one, inc) in &per_threads[1..] {
            assert!(one == one1, "{isa}: one pass at {t} threads differs from 1 thread");
            assert!(inc == inc1, "{isa}: decode at {t} threads differs from 1 thread");
        }
    }
}
