//! Several sequences in one forward pass (a server's batch) give each sequence the logits it
//! gets alone, bit for bit: its prompt chunk beside the others' decode tokens, its decode token
//! beside their prompts, a sequence joining while the others run. Every product gives a row the
//! same bits whichever batch it is in, and attention and the linear attention's recurrence run
//! per sequence over its own state.

use std::sync::Arc;

use moescope::exec::Exec;
use moescope::model::{Decoder, KvCache, KvType, KvTypes, Logits, NoObserver, Resident, RunState, Runtime, Seq};
use moescope::package::Package;
use moescope_kernels::Isa;

mod common;
use common::{Reference, argmax, convert};

/// Decode steps after each prompt.
const STEPS: usize = 5;

/// Four prompts of different lengths cut from `ids` (one token, a few, more than a key block
/// of attention's cache).
fn prompts(ids: &[u32]) -> Vec<Vec<u32>> {
    let n = ids.len();
    [1, 3, n / 2, n].iter().enumerate().map(|(i, &len)| ids[i % 3..(i % 3 + len).min(n)].to_vec()).collect()
}

/// Each prompt alone: its prompt in one pass, then `STEPS` greedy decode steps; the logits of
/// every step (as bits).
fn alone(model: &Decoder, exec: &Exec, prompt: &[u32], types: KvTypes) -> Vec<Vec<u32>> {
    let experts = Resident(model.package());
    let rt = Runtime { exec, experts: &experts };
    let mut st = RunState::new(&model.cfg, 1024);
    let mut kv = KvCache::typed(&model.cfg, model.cfg.max_position_embeddings.min(1024), types);
    let mut out = Vec::new();
    let mut l = model.forward(rt, &mut st, &mut kv, prompt, Logits::Last, &mut NoObserver).unwrap().to_vec();
    for _ in 0..STEPS {
        out.push(l.iter().map(|x| x.to_bits()).collect());
        let id = argmax(&l) as u32;
        l = model.forward(rt, &mut st, &mut kv, &[id], Logits::Last, &mut NoObserver).unwrap().to_vec();
    }
    out.push(l.iter().map(|x| x.to_bits()).collect());
    out
}

/// All prompts in one batch, sequence `i` joining at step `join[i]` (its prompt in the pass of
/// the others' decode tokens); every pass holds every running sequence's next tokens.
fn batched(model: &Decoder, exec: &Exec, prompts: &[Vec<u32>], join: &[usize], types: KvTypes) -> Vec<Vec<Vec<u32>>> {
    let experts = Resident(model.package());
    let rt = Runtime { exec, experts: &experts };
    let v = model.cfg.vocab_size;
    let mut st = RunState::new(&model.cfg, 1024);
    let mut kvs: Vec<KvCache> = prompts
        .iter()
        .map(|_| KvCache::typed(&model.cfg, model.cfg.max_position_embeddings.min(1024), types))
        .collect();
    let mut out: Vec<Vec<Vec<u32>>> = vec![Vec::new(); prompts.len()];
    let mut next: Vec<Option<u32>> = vec![None; prompts.len()];
    let mut step = 0;
    while out.iter().any(|o| o.len() < STEPS + 1) {
        // who runs this step, with which tokens
        let mut ids: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            if out[i].len() > STEPS || step < join[i] {
                continue;
            }
            ids.push((i, next[i].map_or_else(|| p.clone(), |id| vec![id])));
        }
        let mut seqs: Vec<Seq<'_>> = Vec::new();
        let mut who = Vec::new();
        for (kv, (i, t)) in
            kvs.iter_mut().enumerate().filter_map(|(i, kv)| ids.iter().find(|x| x.0 == i).map(|x| (kv, x)))
        {
            seqs.push(Seq { kv, tokens: t, want: Logits::Last });
            who.push(*i);
        }
        let l = model.forward_batch(rt, &mut st, &mut seqs, &mut NoObserver).unwrap().to_vec();
        assert_eq!(l.len(), who.len() * v);
        for (r, &i) in who.iter().enumerate() {
            let row = &l[r * v..(r + 1) * v];
            out[i].push(row.iter().map(|x| x.to_bits()).collect());
            next[i] = Some(argmax(row) as u32);
        }
        step += 1;
    }
    out
}

#[test]
fn a_batch_gives_each_sequence_its_logits_alone_bit_for_bit() {
    // plain attention with q4 groups of 32 (the AVX-512 lanes) and bf16 (the demo), a hybrid
    // (Gated DeltaNet, gated attention, shared expert), q8, gpt-oss (windows, sinks, MXFP4),
    // DeepSeek-V3 (latent attention, both forms), GLM-4.5
    let mut q8_runs = 0;
    for (n, (name, quant)) in [
        ("demo", "bf16"),
        ("single", "q4g32"),
        ("single", "q4"),
        ("qwen35", "q4"),
        ("next", "q8"),
        ("gpt-oss-mxfp4", "mxfp4"),
        ("deepseek", "q4"),
        ("glm", "q4g32"),
    ]
    .into_iter()
    .enumerate()
    {
        let ids = match name {
            "demo" => (0..40).map(|i| (i * 37 + 11) % 2000).collect(),
            _ => Reference::load(name).ids("input_ids"),
        };
        let ps = prompts(&ids);
        let (_d, path) = convert(name, quant);
        let model = Decoder::load(Arc::new(Package::open(&path).unwrap())).unwrap();
        // f32 KV, and bf16 keys with f16 values or (every other fixture, where the heads are
        // whole 32-value blocks) q8_0 keys and values: attention widens what it reads
        let q8 = KvTypes { k: KvType::Q8_0, v: KvType::Q8_0 };
        let typed = match KvCache::check_types(&model.cfg, q8) {
            Ok(()) if n % 2 == 1 => q8,
            _ => KvTypes { k: KvType::Bf16, v: KvType::F16 },
        };
        q8_runs += usize::from(typed == q8);
        for (isa, types) in Isa::available().into_iter().flat_map(|i| [(i, KvTypes::F32), (i, typed)]) {
            let exec = Exec::new(2, isa).unwrap();
            let want: Vec<_> = ps.iter().map(|p| alone(&model, &exec, p, types)).collect();
            // all at once; then joining mid-run, one of them in the pass of another's prompt
            for join in [[0, 0, 0, 0], [0, 2, 1, 4], [3, 0, 2, 2]] {
                let got = batched(&model, &exec, &ps, &join, types);
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    let first = w.iter().zip(g).position(|(a, b)| a != b);
                    assert!(
                        first.is_none(),
                        "{name} {quant} {isa} KV {types}: sequence {i} (prompt {} tokens, joins at {join:?}): step {first:?} differs from alone",
                        ps[i].len()
                    );
                }
            }
        }
    }
    assert_eq!(q8_runs, 4, "q8_0 on single, qwen35, gpt-oss and glm");
}
