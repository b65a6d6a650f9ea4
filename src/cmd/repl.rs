//! The plain line REPL (`moescope run` without a prompt, `moescope chat --plain`): a
//! multi-turn chat through the model's template, reusing the KV cache of earlier turns.

use std::io::{IsTerminal, Write};

use anyhow::{Result, bail};
use moescope::engine::harmony::{HarmonySplitter, Part};
use moescope::engine::sampler::Sampler;
use moescope::engine::session::{ChatSession, TurnEvent};
use moescope::engine::{Engine, EngineError, GenRequest};
use moescope::experts::routing_log::RoutingLog;
use moescope::serve::think::{self, ThinkSplitter};

use super::interrupt::{self, Interruptible};
use super::prefill_progress::PrefillProgress;
use super::run_config::{RunConfig, stats_line};

/// A harmony reply's parts: content and calls to `out`; reasoning dimmed there when `out` is a
/// terminal, else to `err`.
pub(super) fn show_parts(
    out: &mut impl Write,
    err: &mut impl Write,
    tty: bool,
    parts: Vec<Part>,
) -> std::io::Result<()> {
    for part in parts {
        match part {
            Part::Content(c) => out.write_all(c.as_bytes())?,
            Part::Reasoning(r) if tty => write!(out, "\x1b[2m{r}\x1b[0m")?,
            Part::Reasoning(r) => err.write_all(r.as_bytes())?,
            Part::Call { name, arguments } => write!(out, "[call {name} {arguments}]")?,
        }
    }
    out.flush()?;
    err.flush()
}

/// A `<think>` block's split parts (Qwen3, GLM-4.5, DeepSeek-R1 replies) as a harmony reply's,
/// for [`show_parts`].
fn think_parts(parts: Vec<think::Part>) -> Vec<Part> {
    parts
        .into_iter()
        .map(|p| match p {
            think::Part::Reasoning(r) => Part::Reasoning(r),
            think::Part::Content(c) => Part::Content(c),
        })
        .collect()
}

/// `log`: the routing log being recorded, if any.
pub fn repl(mut engine: Engine, cfg: &RunConfig, mut log: Option<RoutingLog>) -> Result<()> {
    if engine.tokenizer().is_none() {
        bail!(
            "{}: this package has no tokenizer, so it cannot chat: give a prompt with --prompt-ids",
            cfg.model.display()
        );
    };
    let chat = engine.template().is_some();
    let interactive = std::io::stdin().is_terminal();
    if !chat {
        eprintln!("moescope: this model has no chat template: each line is continued as plain text");
    }
    if interactive {
        eprintln!("moescope: type a message. /reset clears the conversation, /quit exits, Ctrl+C stops a reply.");
    }
    let mut session = ChatSession::new(cfg.system.clone(), cfg.template_args.clone());
    let mut sampler = Sampler::new(cfg.sampler);
    let mut lines = interrupt::StdinLines::default();
    loop {
        if interactive {
            print!("> ");
            std::io::stdout().flush()?;
        }
        let Some(line) = lines.next_line()? else {
            break;
        };
        let msg = line.trim_end_matches('\r');
        match msg.trim() {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                session.reset();
                engine.reset();
                eprintln!("(conversation cleared)");
                continue;
            }
            c if c.starts_with('/') => {
                eprintln!("unknown command {c} (/reset, /quit)");
                continue;
            }
            _ => {}
        }
        let mut out = std::io::stdout().lock();
        // gpt-oss: the answer on stdout, the reasoning dimmed (or, when stdout is not a
        // terminal, on stderr, so a redirected answer is the answer alone); a chat reply that
        // opens with a <think> block the same way
        let mut harmony = engine.harmony().then(HarmonySplitter::default);
        let mut thinking = (chat && harmony.is_none()).then(ThinkSplitter::default);
        let tty = std::io::stdout().is_terminal();
        let show = |out: &mut std::io::StdoutLock, parts: Vec<Part>| {
            let _ = show_parts(out, &mut std::io::stderr(), tty, parts);
        };
        // a long prompt's progress on a terminal's stderr, cleared as the reply begins
        let prefill = PrefillProgress::default();
        let report = |n: usize| prefill.report(n);
        let res = {
            let _g = Interruptible::start();
            let req = GenRequest {
                max_tokens: cfg.max_tokens,
                stop_at_eos: !cfg.ignore_eos,
                cancel: &interrupt::STOP,
                progress: std::io::stderr().is_terminal().then_some(&report as &(dyn Fn(usize) + Sync)),
            };
            session.turn(&mut engine, &mut sampler, req, msg, &mut log, &mut |ev| {
                match &ev {
                    TurnEvent::Prompt { tokens, cached, .. } => prefill.start(tokens - cached),
                    _ => prefill.clear_line(),
                }
                // the template opened the reasoning block: the reply begins inside it
                if let (TurnEvent::Prompt { in_reasoning: true, .. }, Some(t)) = (&ev, thinking.as_mut()) {
                    show(&mut out, think_parts(t.push("<think>")));
                }
                if let TurnEvent::Token { piece: Some(p), .. } | TurnEvent::Tail(p) = ev {
                    match (harmony.as_mut(), thinking.as_mut()) {
                        (Some(h), _) => show(&mut out, h.push(p)),
                        (None, Some(t)) => show(&mut out, think_parts(t.push(p))),
                        (None, None) => {
                            let _ = out.write_all(p.as_bytes());
                            let _ = out.flush();
                        }
                    }
                }
            })
        };
        if let Some(mut h) = harmony {
            show(&mut out, h.finish());
        }
        if let Some(mut t) = thinking {
            show(&mut out, think_parts(t.finish()));
        }
        let _ = writeln!(out);
        drop(out);
        if let Some(n) = engine.resize_auto_pool() {
            eprintln!("moescope: {n}");
        }
        match res {
            Ok(turn) => eprintln!("{}", stats_line(&turn.stats, cfg.sampler.seed)),
            Err(e @ (EngineError::PromptTooLong { .. } | EngineError::Template(_))) => {
                eprintln!("error: {e}; /reset starts over")
            }
            Err(e) => return Err(e.into()),
        }
    }
    super::experts_report::finish_routing_log(log)?;
    if let Some(l) = super::experts_report::pool_peak_line(&engine) {
        eprintln!("moescope: {l}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use moescope::engine::harmony::split_parts;

    #[test]
    fn a_harmony_reply_goes_out_split() {
        let reply = "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>final<|message|>4";
        let (mut out, mut err) = (Vec::new(), Vec::new());
        show_parts(&mut out, &mut err, false, split_parts(reply)).unwrap();
        assert_eq!(
            (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap()),
            ("4".into(), "Add them.".into())
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        show_parts(&mut out, &mut err, true, split_parts(reply)).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "\x1b[2mAdd them.\x1b[0m4");
        assert!(err.is_empty());
    }

    #[test]
    fn a_think_block_goes_out_split_streamed() {
        // "<think>\nAdd them.\n</think>\n\n4" as it streams
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut t = ThinkSplitter::default();
        for piece in ["<thi", "nk>\nAdd", " them.\n</th", "ink>\n\n", "4"] {
            show_parts(&mut out, &mut err, false, think_parts(t.push(piece))).unwrap();
        }
        show_parts(&mut out, &mut err, false, think_parts(t.finish())).unwrap();
        assert_eq!(
            (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap()),
            ("4".into(), "\nAdd them.\n".into())
        );
    }
}
