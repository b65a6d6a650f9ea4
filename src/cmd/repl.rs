//! The plain line REPL (`moescope run` without a prompt, `moescope chat --plain`): a
//! multi-turn chat through the model's template, reusing the KV cache of earlier turns.

use std::io::{IsTerminal, Write};

use anyhow::{Result, bail};
use moescope::engine::sampler::Sampler;
use moescope::engine::session::{ChatSession, TurnEvent};
use moescope::engine::{Engine, EngineError, GenRequest};
use moescope::experts::routing_log::RoutingLog;

use super::interrupt::{self, Interruptible};
use super::run_config::{RunConfig, stats_line};

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
        let res = {
            let _g = Interruptible::start();
            let req = GenRequest {
                max_tokens: cfg.max_tokens,
                stop_at_eos: !cfg.ignore_eos,
                cancel: &interrupt::STOP,
                progress: None,
            };
            session.turn(&mut engine, &mut sampler, req, msg, &mut log, &mut |ev| {
                if let TurnEvent::Token { piece: Some(p), .. } | TurnEvent::Tail(p) = ev {
                    let _ = out.write_all(p.as_bytes());
                    let _ = out.flush();
                }
            })
        };
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
