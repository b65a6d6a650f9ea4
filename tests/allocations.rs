//! A resident model's forward pass allocates nothing once its buffers have grown to the batch
//! sizes they serve (llama2.c's RunState): every decode step after the first, and a prompt
//! chunk after one of its size, at one thread and at two. Counted by a global allocator over
//! every thread of the process, so this file holds one test (the harness runs nothing beside
//! it). Prompt chunks that use more than 16 experts of a layer allocate the list of their
//! matrices (see `Resident`); these prompts use fewer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use moescope::exec::Exec;
use moescope::model::{Decoder, KvCache, Logits, NoObserver, Resident, RunState, Runtime};
use moescope::package::Package;
use moescope_kernels::Isa;

mod common;

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; the count is a relaxed atomic add
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` above with this layout
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for alloc and dealloc
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Allocations `f` made (on any thread).
fn allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    f();
    ALLOCATIONS.load(Ordering::SeqCst) - before
}

fn check(tag: &str, path: &Path) {
    let pkg = Package::open(path).expect("package");
    // every expert's checksum checked now (a first use checks it otherwise: once, and with a
    // message built for its error)
    pkg.verify_experts(&AtomicBool::new(false));
    let model = Decoder::load(Arc::new(pkg)).expect("model");
    let vocab = model.cfg.vocab_size as u32;
    let prompt: Vec<u32> = (0..29u32).map(|i| (i * 97 + 5) % vocab).collect();
    for threads in [1, 2] {
        let exec = Exec::new(threads, Isa::detect()).expect("threads");
        let experts = Resident(model.package());
        let rt = Runtime { exec: &exec, experts: &experts };
        let mut st = RunState::new(&model.cfg, 32);
        let mut kv = KvCache::new(&model.cfg, 256);
        let mut pass = |tokens: &[u32], want: Logits| {
            model.forward(rt, &mut st, &mut kv, tokens, want, &mut NoObserver).expect("forward");
        };
        // the first of each size grows the buffers; the kernels' thread-local buffers grow on
        // the thread that meets a size first, and which thread takes which expert (and so
        // which token count) varies between passes: a few passes of each size let both
        // threads meet them (one pass left a thread short about once in ten runs on a loaded
        // machine)
        for _ in 0..4 {
            pass(&prompt, Logits::Last);
            pass(&[3], Logits::Last);
        }
        for (i, id) in [5u32, 7, 11].into_iter().enumerate() {
            let n = allocations(|| pass(&[id], Logits::Last));
            assert_eq!(n, 0, "{tag}, {threads} threads: decode step {i} allocated {n} times");
        }
        let n = allocations(|| pass(&prompt, Logits::Last));
        assert_eq!(n, 0, "{tag}, {threads} threads: a second prompt chunk allocated {n} times");
    }
}

#[test]
fn a_warm_forward_pass_allocates_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (demo, _) = moescope::demo::ensure_package(dir.path()).expect("demo package");
    check("the demo (Qwen3-MoE)", &demo);
    // Gated DeltaNet and gated attention layers, a shared expert
    let (_d, qwen35) = common::convert("qwen35", "q4");
    check("qwen35 q4", &qwen35);
    let (_d, next) = common::convert("next", "q8");
    check("next q8", &next);
    // biases, sinks, sliding windows, the clamped activation
    let (_d, gpt_oss) = common::convert("gpt-oss-mxfp4", "q4");
    check("gpt-oss q4", &gpt_oss);
}
