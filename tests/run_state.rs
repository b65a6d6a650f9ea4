//! The forward pass's buffers are allocated once and reused by every pass: what a pass leaves in
//! them must never reach the next (a pass after a longer one gives the bits a fresh state gives),
//! and a pass longer than the state holds is a clear error, not a panic.

use std::sync::Arc;

use moescope::exec::Exec;
use moescope::model::{Decoder, KvCache, Logits, ModelError, NoObserver, Resident, RunState, Runtime};
use moescope::package::Package;
use moescope_kernels::Isa;

fn demo() -> (tempfile::TempDir, Decoder) {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = moescope::demo::ensure_package(dir.path()).expect("demo package");
    let pkg = Arc::new(Package::open(&path).expect("package"));
    let model = Decoder::load(pkg).expect("model");
    (dir, model)
}

#[test]
fn a_reused_state_gives_the_bits_of_a_fresh_one() {
    let (_d, model) = demo();
    let exec = Exec::new(2, Isa::detect()).unwrap();
    let experts = Resident(model.package());
    let prompt: Vec<u32> = (0..37).map(|i| (i * 97 + 5) % 4096).collect();
    let next = [17u32, 2049, 3];
    // one state through a long prompt, then short passes; beside it, a fresh state for every
    // pass, on a KV cache of its own fed the same tokens
    let mut reused = RunState::new(&model.cfg, 64);
    let (mut kv, mut kv_fresh) = (KvCache::new(&model.cfg, 128), KvCache::new(&model.cfg, 128));
    let rt = Runtime { exec: &exec, experts: &experts };
    model.forward(rt, &mut reused, &mut kv, &prompt, Logits::Last, &mut NoObserver).unwrap();
    let mut fresh = RunState::new(&model.cfg, 64);
    model.forward(rt, &mut fresh, &mut kv_fresh, &prompt, Logits::Last, &mut NoObserver).unwrap();
    for (i, &id) in next.iter().enumerate() {
        let got = model.forward(rt, &mut reused, &mut kv, &[id], Logits::Last, &mut NoObserver).unwrap().to_vec();
        let mut fresh = RunState::new(&model.cfg, 64);
        let want = model.forward(rt, &mut fresh, &mut kv_fresh, &[id], Logits::Last, &mut NoObserver).unwrap();
        let same = got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same && got.len() == want.len(), "step {i}: a reused state changed the logits");
    }
}

#[test]
fn a_pass_longer_than_the_state_is_an_error() {
    let (_d, model) = demo();
    let exec = Exec::new(1, Isa::detect()).unwrap();
    let mut st = RunState::new(&model.cfg, 4);
    let mut kv = KvCache::new(&model.cfg, 16);
    let rt = Runtime { exec: &exec, experts: &Resident(model.package()) };
    let r = model.forward(rt, &mut st, &mut kv, &[1, 2, 3, 4, 5], Logits::Last, &mut NoObserver);
    assert!(matches!(r, Err(ModelError::BatchTooLarge { tokens: 5, chunk: 4 })), "{:?}", r.err());
    assert_eq!(kv.len(), 0, "nothing written");
}
