//! The plain line REPL (`moescope run` without a prompt, `moescope chat --plain`): a
//! multi-turn chat through the model's template, reusing the KV cache of earlier turns.

use std::io::{IsTerminal, Write};

use anyhow::{Result, bail};
use moescope::engine::sampler::Sampler;
use moescope::engine::session::ChatSession;
use moescope::engine::tokenizer::StreamDecoder;
use moescope::engine::{Engine, EngineError, GenRequest};

use super::interrupt::{self, Interruptible};
use super::run::{RunConfig, stats_line};

pub fn repl(mut engine: Engine, cfg: &RunConfig) -> Result<()> {
    let Some(tok) = engine.tok.clone() else {
        bail!(
            "{}: this package has no tokenizer, so it cannot chat: give a prompt with --prompt-ids",
            cfg.model.display()
        );
    };
    let template = engine.template.clone();
    let chat = template.is_some();
    let interactive = std::io::stdin().is_terminal();
    if !chat {
        eprintln!("moescope: this model has no chat template: each line is continued as plain text");
    }
    if interactive {
        eprintln!("moescope: type a message. /reset clears the conversation, /quit exits, Ctrl+C stops a reply.");
    }
    let mut session = ChatSession::new(cfg.system.clone(), cfg.enable_thinking);
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
        let ids = if let Some(tmpl) = &template {
            match session.prompt_with(&tok, tmpl, msg) {
                Ok(ids) => ids,
                Err(e) => {
                    eprintln!("error: {e}");
                    continue;
                }
            }
        } else {
            tok.encode(msg).map_err(anyhow::Error::msg)?
        };
        let mut dec = StreamDecoder::new(&tok, true);
        let mut out = std::io::stdout().lock();
        let eos = engine.eos_ids().to_vec();
        let res = {
            let _g = Interruptible::start();
            let req = GenRequest { max_tokens: cfg.max_tokens, stop_at_eos: !cfg.ignore_eos, cancel: &interrupt::STOP };
            engine.generate(&ids, &mut sampler, req, &mut |id, _| {
                if let Ok(Some(p)) = dec.push(id) {
                    let _ = out.write_all(p.as_bytes());
                    let _ = out.flush();
                }
                true
            })
        };
        if let Ok(Some(p)) = dec.flush() {
            let _ = out.write_all(p.as_bytes());
        }
        let _ = writeln!(out);
        drop(out);
        match res {
            Ok(stats) => {
                let reply_ids: Vec<u32> = stats.generated.iter().copied().filter(|i| !eos.contains(i)).collect();
                let reply = tok.decode(&reply_ids, true).map_err(anyhow::Error::msg)?;
                session.push(msg, &reply);
                eprintln!("{}", stats_line(&stats, cfg.sampler.seed));
            }
            Err(e @ EngineError::PromptTooLong { .. }) => eprintln!("error: {e}; /reset starts over"),
            Err(e) => return Err(e.into()),
        }
    }
    super::experts_report::finish_routing_log(&mut engine)?;
    Ok(())
}
