//! Speculative decoding is exact: greedy output with drafts (prompt lookup, or a draft source
//! that is wrong at chosen positions) equals `--spec off`'s token for token and logit for
//! logit, on every family the engine runs, resident and streamed at a third of the experts with
//! prefetch on and off. The reference is the plain decode loop, one forward pass a token.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use common::{Reference, convert, options, slot_bytes};
use moescope::engine::draft::{Drafter, PromptLookup, SpecMode, Speculation};
use moescope::engine::sampler::{Sampler, SamplerParams};
use moescope::engine::{Engine, EngineOptions, GenRequest, GenStats};
use moescope::experts::StreamConfig;
use moescope::model::{Logits, NoObserver};

/// Tokens each reply runs to.
const TOKENS: usize = 200;

/// The streaming tests' options with room for the longest fixture prompt (273 tokens) and a
/// reply.
fn opts(stream: Option<StreamConfig>) -> EngineOptions {
    EngineOptions { ctx_size: Some(512), ..options(stream) }
}

/// Greedy ids and the bits of the logits that chose each, `drafter` giving drafts (None: off).
fn reply(
    eng: &mut Engine,
    prompt: &[u32],
    drafter: Option<(&mut dyn Drafter, usize)>,
) -> (Vec<u32>, Vec<u32>, GenStats) {
    eng.reset();
    let params = SamplerParams { temperature: 0.0, ..SamplerParams::default() };
    let mut sampler = Sampler::new(params);
    let cancel = AtomicBool::new(false);
    let req = GenRequest { max_tokens: TOKENS, stop_at_eos: false, cancel: &cancel, progress: None };
    let mut bits = Vec::new();
    let stats = eng
        .generate_drafted(
            prompt,
            &mut sampler,
            req,
            &mut NoObserver,
            &mut |_, l| {
                bits.extend(l.iter().map(|x| x.to_bits()));
                true
            },
            drafter,
        )
        .expect("generate");
    (stats.generated.clone(), bits, stats)
}

/// Each fixture's prompt: the reference's ids (the demo: a spread of its vocabulary).
fn prompt(name: &str) -> Vec<u32> {
    match name {
        "demo" => (0..40).map(|i| (i * 37 + 11) % 2000).collect(),
        _ => Reference::load(name).ids("input_ids"),
    }
}

fn third_of_the_experts(pkg: &Path, prefetch: bool) -> StreamConfig {
    let eng = Engine::load(pkg, opts(None)).expect("load");
    let cfg = eng.config();
    let all = (cfg.num_experts * cfg.moe_layers().len()) as u64;
    StreamConfig { budget_bytes: Some(all / 3 * slot_bytes(pkg)), prefetch, io_workers: 2, ..StreamConfig::default() }
}

#[test]
fn prompt_lookup_gives_the_greedy_reply_of_one_token_a_pass_on_every_family() {
    for (name, quant) in [
        ("demo", "q4"),
        ("single", "q4g32"),
        ("qwen35", "q4"),
        ("next", "q8"),
        ("gpt-oss-mxfp4", "mxfp4"),
        ("deepseek", "q4"),
        ("glm", "q4g32"),
    ] {
        let (_d, pkg) = convert(name, quant);
        let ids = prompt(name);
        let want = reply(&mut Engine::load(&pkg, opts(None)).expect("load"), &ids, None);
        assert_eq!(want.0.len(), TOKENS);
        let streams = [None, Some(third_of_the_experts(&pkg, false)), Some(third_of_the_experts(&pkg, true))];
        for stream in streams {
            let tag = format!("{name} {quant} streamed {:?}", stream.map(|s| s.prefetch));
            let mut eng = Engine::load(&pkg, opts(stream)).expect("load");
            for draft in [1, 3, 5] {
                let mut lookup = PromptLookup::default();
                let got = reply(&mut eng, &ids, Some((&mut lookup, draft)));
                let first = want.0.iter().zip(&got.0).position(|(a, b)| a != b);
                assert!(first.is_none(), "{tag} --draft {draft}: token {first:?} differs from --spec off");
                assert!(got.1 == want.1, "{tag} --draft {draft}: the logits differ from --spec off");
                let s = &got.2;
                println!("{tag} --draft {draft}: {} drafted, {} accepted, {} passes", s.drafted, s.accepted, s.passes);
                assert!(s.drafted > 0 && s.accepted > 0, "{tag} --draft {draft}: drafts verified ({s:?})");
                assert!(s.passes < TOKENS - 1, "{tag} --draft {draft}: fewer passes than tokens ({s:?})");
                assert_eq!(s.decode_steps, TOKENS - 1, "{tag}");
            }
        }
    }
}

/// Drafts that copy the known reply for `right` tokens and then propose a wrong one, `right`
/// cycling through 0..`max`: every draft position sees a rejection.
struct WrongAt {
    reply: Vec<u32>,
    prompt_len: usize,
    vocab: u32,
    turn: usize,
}

impl Drafter for WrongAt {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) {
        out.clear();
        let at = history.len() - self.prompt_len;
        let right = self.turn % max.max(1);
        self.turn += 1;
        for j in 0..max {
            let Some(&t) = self.reply.get(at + j) else { break };
            out.push(if j < right { t } else { (t + 1) % self.vocab });
        }
        out.truncate(right + 1);
    }
}

#[test]
fn a_hybrid_rejected_at_every_draft_position_gives_the_same_bits() {
    for (name, quant) in [("qwen35", "q4"), ("next", "q8"), ("single", "q4g32")] {
        let (_d, pkg) = convert(name, quant);
        let ids = prompt(name);
        let mut eng = Engine::load(&pkg, opts(None)).expect("load");
        let want = reply(&mut eng, &ids, None);
        let vocab = eng.config().vocab_size as u32;
        let mut wrong = WrongAt { reply: want.0.clone(), prompt_len: ids.len(), vocab, turn: 0 };
        let got = reply(&mut eng, &ids, Some((&mut wrong, 3)));
        assert_eq!(got.0, want.0, "{name}: tokens differ from --spec off");
        assert!(got.1 == want.1, "{name}: logits differ from --spec off");
        let s = &got.2;
        assert!(s.accepted > 0 && s.accepted < s.drafted, "{name}: drafts both accepted and rejected ({s:?})");
        // the cache holds exactly the reply (not the rejected drafts): the next prompt that
        // extends it evaluates only its new tokens, and its logits are a fresh prefill's
        let mut next: Vec<u32> = ids.iter().chain(&want.0).copied().collect();
        next.push(ids[0]);
        let reused = eng.cached_prefix_len(&next);
        assert_eq!(reused, ids.len() + TOKENS - 1, "{name}: the cache after speculation");
        let l = eng.eval(&next[reused..], Logits::Last, &mut NoObserver).expect("eval").to_vec();
        let mut fresh = Engine::load(&pkg, opts(None)).expect("load");
        let f = fresh.eval(&next, Logits::Last, &mut NoObserver).expect("eval").to_vec();
        assert!(l == f, "{name}: the cache after speculation gives other logits than a fresh prefill");
    }
}

#[test]
fn the_engine_takes_its_drafts_from_spec() {
    let (_d, pkg) = convert("single", "q4g32");
    let ids = prompt("single");
    let mut eng = Engine::load(&pkg, opts(None)).expect("load");
    let params = SamplerParams { temperature: 0.0, ..SamplerParams::default() };
    let cancel = AtomicBool::new(false);
    let run = |eng: &mut Engine| {
        eng.reset();
        let req = GenRequest { max_tokens: 64, stop_at_eos: false, cancel: &cancel, progress: None };
        eng.generate(&ids, &mut Sampler::new(params), req, &mut NoObserver, &mut |_, _| true).expect("generate")
    };
    let off = run(&mut eng);
    assert_eq!((off.drafted, off.passes), (0, 63), "off: one pass a token");
    eng.set_speculation(Speculation::new(SpecMode::Ngram, 4).unwrap());
    let on = run(&mut eng);
    assert_eq!(on.generated, off.generated);
    assert!(on.drafted > 0 && on.passes < 63, "ngram: {on:?}");
}

#[test]
fn run_takes_spec_and_draft_and_reports_acceptance() {
    let cache = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--prompt", "fn main() { let x = 1; let y = 2; let x = 1;", "-n", "48"];
        args.extend(["--temperature", "0", "--ignore-eos", "--json"]);
        args.extend(extra);
        let o = common::moescope(&args, cache.path());
        assert!(o.status.success(), "{}", common::stderr(&o));
        serde_json::from_str::<serde_json::Value>(&common::stdout(&o)).expect("one JSON line")
    };
    let off = run(&[]);
    let on = run(&["--spec", "ngram", "--draft", "4"]);
    assert_eq!(on["generated_ids"], off["generated_ids"], "greedy output with --spec ngram");
    assert_eq!(on["speculation"]["mode"], "ngram");
    assert_eq!(off["timings"]["drafted"], 0);
    let t = &on["timings"];
    let (drafted, accepted) = (t["drafted"].as_u64().unwrap(), t["accepted"].as_u64().unwrap());
    assert!(drafted > 0 && accepted <= drafted, "{t}");
    assert!(t["decode_passes"].as_u64().unwrap() <= 47, "{t}");
    for (args, needle) in
        [(&["--spec", "mtp"][..], "not run yet"), (&["--spec", "ngram", "--draft", "0"][..], "--draft")]
    {
        let mut a = vec!["run", "-p", "hi", "-n", "2"];
        a.extend(args);
        common::assert_clean_failure(&common::moescope(&a, cache.path()), &[needle]);
    }
}

/// What exactness rests on: a pass over k tokens gives each row the bits those tokens get
/// decoded one at a time, for every family, at every ISA tier, with f32 and bf16 caches.
#[test]
fn a_pass_over_several_tokens_gives_each_row_its_one_token_bits() {
    use moescope::model::{Decoder, KvCache, KvType, KvTypes, Resident, RunState, Runtime};
    use std::sync::Arc;
    let bf16 = KvTypes { k: KvType::Bf16, v: KvType::Bf16 };
    for (name, quant) in [
        ("demo", "bf16"),
        ("demo", "q4"),
        ("single", "q8"),
        ("qwen35", "q4"),
        ("next", "q8"),
        ("gpt-oss-mxfp4", "mxfp4"),
        ("deepseek", "q4"),
        ("glm", "q4g32"),
    ] {
        let ids = prompt(name);
        let (_d, path) = convert(name, quant);
        let model = Decoder::load(Arc::new(moescope::package::Package::open(&path).unwrap())).unwrap();
        let (p, k) = (ids.len() - 5, 5);
        for isa in moescope_kernels::Isa::available() {
            for types in [KvTypes::F32, bf16] {
                let exec = moescope::exec::Exec::new(2, isa).unwrap();
                let experts = Resident(model.package());
                let rt = Runtime { exec: &exec, experts: &experts };
                let mut st = RunState::new(&model.cfg, 1024);
                let cap = model.cfg.max_position_embeddings.min(1024);
                let mut one = KvCache::typed(&model.cfg, cap, types);
                model.forward(rt, &mut st, &mut one, &ids[..p], Logits::Last, &mut NoObserver).unwrap();
                let mut want = Vec::new();
                for &id in &ids[p..p + k] {
                    let l = model.forward(rt, &mut st, &mut one, &[id], Logits::Last, &mut NoObserver).unwrap();
                    want.extend(l.iter().map(|x| x.to_bits()));
                }
                let mut all = KvCache::typed(&model.cfg, cap, types);
                model.forward(rt, &mut st, &mut all, &ids[..p], Logits::Last, &mut NoObserver).unwrap();
                let l = model.forward(rt, &mut st, &mut all, &ids[p..p + k], Logits::All, &mut NoObserver).unwrap();
                let got: Vec<u32> = l.iter().map(|x| x.to_bits()).collect();
                assert!(got == want, "{name} {quant} {isa} KV {types}: a {k}-token pass differs from decoding");
            }
        }
    }
}
