//! The one chat turn the REPL and the workbench both run (`ChatSession::turn`): what it streams,
//! what it records, and what a failed turn leaves behind. On the demo model, greedy.

use std::sync::atomic::AtomicBool;

use moescope::engine::chat_template::Message;
use moescope::engine::sampler::{Sampler, SamplerParams};
use moescope::engine::session::{ChatSession, TurnEvent};
use moescope::engine::{Engine, EngineError, EngineOptions, GenRequest};
use moescope::model::NoObserver;
use moescope_kernels::Isa;

fn demo_engine(dir: &std::path::Path, ctx: usize) -> Engine {
    let (pkg, _) = moescope::demo::ensure_package(dir).expect("demo package");
    Engine::load(
        &pkg,
        EngineOptions {
            threads: 1,
            ctx_size: Some(ctx),
            isa: Isa::detect(),
            stream: None,
            panels: true,
            kv: moescope::model::KvTypes::F32,
        },
    )
    .expect("engine")
}

/// What a turn streamed: the prompt's (tokens, cached), the ids, and the text of the pieces and
/// the tail in order.
#[derive(Default)]
struct Seen {
    prompt: Option<(usize, usize)>,
    in_reasoning: bool,
    ids: Vec<u32>,
    text: String,
}

fn turn(
    engine: &mut Engine,
    session: &mut ChatSession,
    user: &str,
    max_tokens: usize,
) -> (Result<moescope::engine::session::Turn, EngineError>, Seen) {
    let mut sampler = Sampler::new(SamplerParams { temperature: 0.0, ..Default::default() });
    let cancel = AtomicBool::new(false);
    let req = GenRequest { max_tokens, stop_at_eos: true, cancel: &cancel, progress: None };
    let mut seen = Seen::default();
    let res = session.turn(engine, &mut sampler, req, user, &mut NoObserver, &mut |ev| match ev {
        TurnEvent::Prompt { tokens, cached, in_reasoning } => {
            seen.prompt = Some((tokens, cached));
            seen.in_reasoning = in_reasoning;
        }
        TurnEvent::Token { id, piece } => {
            seen.ids.push(id);
            seen.text.push_str(piece.unwrap_or(""));
        }
        TurnEvent::Tail(p) => seen.text.push_str(p),
    });
    (res, seen)
}

#[test]
fn a_turn_streams_its_reply_and_records_it_and_the_next_reuses_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = demo_engine(dir.path(), 512);
    let mut session = ChatSession::new(None, Default::default());
    let (res, seen) = turn(&mut engine, &mut session, "What is a trait?", 12);
    let t = res.expect("first turn");
    let eos = engine.eos_ids().to_vec();
    assert_eq!(seen.ids, t.stats.generated, "every sampled id is streamed");
    // the reply is the text of the ids without end-of-sequence, as the tokenizer decodes it
    let tok = engine.tokenizer().cloned().unwrap();
    let kept: Vec<u32> = seen.ids.iter().copied().filter(|i| !eos.contains(i)).collect();
    assert_eq!(t.reply, tok.decode(&kept, true).unwrap());
    assert_eq!(seen.text, t.reply, "the streamed pieces and tail are the reply");
    let (tokens, cached) = seen.prompt.expect("a prompt event");
    assert_eq!(cached, 0, "an empty cache");
    assert!(!seen.in_reasoning, "the demo's generation prompt opens no reasoning block");
    assert_eq!(tokens, session_prompt_len(&engine, &ChatSession::new(None, Default::default()), "What is a trait?"));
    assert_eq!(
        session.messages,
        vec![Message::new("user", "What is a trait?"), Message::new("assistant", &t.reply)],
        "the turn is recorded"
    );
    assert_eq!(session.last_user(), Some("What is a trait?"));
    // the second turn's prompt starts with the first's: its cached prefix is reused
    let (res, seen) = turn(&mut engine, &mut session, "And a lifetime?", 4);
    res.expect("second turn");
    let (_, cached) = seen.prompt.unwrap();
    assert!(cached >= tokens, "the first turn's prompt ({tokens} tokens) is reused, got {cached}");
    assert_eq!(session.messages.len(), 4);
}

fn session_prompt_len(engine: &Engine, s: &ChatSession, user: &str) -> usize {
    s.prompt(engine, user).expect("prompt").len()
}

#[test]
fn a_prompt_too_long_for_the_context_leaves_the_engine_and_history_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = demo_engine(dir.path(), 64);
    let mut session = ChatSession::new(None, Default::default());
    turn(&mut engine, &mut session, "Hi", 4).0.expect("a short turn");
    let (history, cached) = (session.messages.clone(), engine.cached_len());
    let long = "borrow ".repeat(200);
    let (res, seen) = turn(&mut engine, &mut session, &long, 4);
    assert!(matches!(res, Err(EngineError::PromptTooLong { ctx: 64, .. })), "{:?}", res.err());
    assert!(seen.prompt.is_none() && seen.ids.is_empty(), "nothing was generated");
    assert_eq!(session.messages, history, "not recorded");
    assert_eq!(engine.cached_len(), cached, "the cache is kept for the next turn");
}

#[test]
fn a_turn_without_a_tokenizer_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = demo_engine(dir.path(), 64);
    engine.set_tokenizer(None);
    let mut session = ChatSession::new(None, Default::default());
    let (res, _) = turn(&mut engine, &mut session, "Hi", 4);
    let e = res.expect_err("no tokenizer");
    assert!(e.to_string().contains("no tokenizer"), "{e}");
    assert!(session.messages.is_empty());
}

/// A template whose generation prompt opens the reasoning block (GLM-4.5's and DeepSeek-R1's
/// thinking modes): the turn says the reply begins inside it; one that closes it, or never
/// opens it, does not.
#[test]
fn a_generation_prompt_that_opens_think_says_the_reply_begins_inside_it() {
    use moescope::engine::chat_template::ChatTemplate;
    let dir = tempfile::tempdir().unwrap();
    let mut engine = demo_engine(dir.path(), 512);
    let body = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
    for (tail, opens) in
        [("<|assistant|><think>\n", true), ("<|assistant|><think></think>", false), ("<|assistant|>", false)]
    {
        let src = format!("{body}{{% if add_generation_prompt %}}{tail}{{% endif %}}");
        let t = ChatTemplate::new(&src, None, None).expect("template");
        engine.set_template(Some(std::sync::Arc::new(t)));
        engine.reset();
        let mut session = ChatSession::new(None, Default::default());
        let (res, seen) = turn(&mut engine, &mut session, "Hi", 2);
        res.expect("turn");
        assert_eq!(seen.in_reasoning, opens, "generation prompt {tail:?}");
    }
}
