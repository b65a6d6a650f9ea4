//! A multi-turn chat: the messages so far, rendered through the model's template each turn.
//! The engine's prefix reuse then evaluates only what the new turn added.
//!
//! [`ChatSession::turn`] is the one chat turn every front end runs (the REPL, the workbench):
//! the template-or-plain choice, streamed decoding, end-of-sequence filtering, the history, and
//! the rule that a failed turn forgets the KV cache.

use super::chat_template::{ChatTemplate, Message, TemplateArgs, opens_reasoning};
use super::sampler::Sampler;
use super::tokenizer::{StreamDecoder, Tok};
use super::{Engine, EngineError, GenRequest, GenStats};
use crate::model::Observer;

/// What a turn reports as it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEvent<'a> {
    /// The prompt is ready: `tokens` ids, the first `cached` of them already in the KV cache;
    /// `in_reasoning`: the template's generation prompt opened a `<think>` block, so the reply
    /// begins inside it (its pieces do not repeat the tag).
    Prompt { tokens: usize, cached: usize, in_reasoning: bool },
    /// A sampled id and the text it completes: None for an end-of-sequence id, and while a
    /// character split over several tokens is incomplete.
    Token { id: u32, piece: Option<&'a str> },
    /// After the last token: text the decoder still held back.
    Tail(&'a str),
}

/// A finished turn.
#[derive(Debug, Clone)]
pub struct Turn {
    pub stats: GenStats,
    /// The reply's text, end-of-sequence ids left out (of a harmony reply: its content).
    pub reply: String,
    /// A harmony reply's reasoning (its `analysis` channel).
    pub reasoning: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ChatSession {
    pub system: Option<String>,
    pub messages: Vec<Message>,
    /// `enable_thinking`, `reasoning_effort`, ... for the template.
    pub args: TemplateArgs,
}

impl ChatSession {
    pub fn new(system: Option<String>, args: TemplateArgs) -> ChatSession {
        ChatSession { system, messages: Vec::new(), args }
    }

    pub fn reset(&mut self) {
        self.messages.clear();
    }

    /// Prompt ids for the conversation plus a new user message (not yet recorded), ending
    /// with the assistant's generation prompt.
    pub fn prompt_with(&self, tok: &Tok, tmpl: &ChatTemplate, user: &str) -> Result<Vec<u32>, EngineError> {
        tok.encode(&self.render(tmpl, user)?).map_err(EngineError::Tokenizer)
    }

    /// The conversation plus `user`'s new message through the template, ending with the
    /// assistant's generation prompt.
    fn render(&self, tmpl: &ChatTemplate, user: &str) -> Result<String, EngineError> {
        let mut msgs = Vec::with_capacity(self.messages.len() + 2);
        if let Some(s) = &self.system {
            msgs.push(Message::new("system", s));
        }
        msgs.extend(self.messages.iter().cloned());
        msgs.push(Message::new("user", user));
        tmpl.render(&msgs, true, &self.args).map_err(EngineError::Template)
    }

    /// Prompt ids for `user`'s new message: through the model's chat template with the history
    /// when it has one, else the message alone as plain text to continue.
    pub fn prompt(&self, engine: &Engine, user: &str) -> Result<Vec<u32>, EngineError> {
        self.prompt_and_state(engine, user).map(|(ids, _)| ids)
    }

    /// [`prompt`](Self::prompt), and whether its generation prompt opened a reasoning block.
    fn prompt_and_state(&self, engine: &Engine, user: &str) -> Result<(Vec<u32>, bool), EngineError> {
        let tok = engine.tokenizer().map(|t| &**t).ok_or_else(no_tokenizer)?;
        let text = match engine.template().map(|t| &**t) {
            Some(t) => self.render(t, user)?,
            None => return Ok((tok.encode(user).map_err(EngineError::Tokenizer)?, false)),
        };
        Ok((tok.encode(&text).map_err(EngineError::Tokenizer)?, opens_reasoning(&text)))
    }

    /// One turn: `user`'s message through the model, the reply streamed to `on_event` and
    /// recorded in the history. A prompt that cannot be made or does not fit the context is an
    /// error that leaves the engine and the history as they were. An error once generation has
    /// begun forgets the engine's KV cache (its state is unknown) and records the turn with an
    /// empty reply, so the history still matches what the user saw.
    pub fn turn(
        &mut self,
        engine: &mut Engine,
        sampler: &mut Sampler,
        req: GenRequest<'_>,
        user: &str,
        obs: &mut dyn Observer,
        on_event: &mut dyn FnMut(TurnEvent<'_>),
    ) -> Result<Turn, EngineError> {
        let tok = engine.tokenizer().cloned().ok_or_else(no_tokenizer)?;
        let (ids, in_reasoning) = self.prompt_and_state(engine, user)?;
        if ids.len() >= engine.ctx_size() {
            return Err(EngineError::PromptTooLong { n: ids.len(), ctx: engine.ctx_size() });
        }
        let prompt = Prompted { ids: &ids, in_reasoning };
        let res = generate(engine, &tok, prompt, sampler, req, obs, on_event);
        match &res {
            Ok(t) => self.push(user, &t.reply),
            Err(_) => {
                engine.reset();
                self.push(user, "");
            }
        }
        res
    }

    /// The last turn's user message, if the history ends with a turn.
    pub fn last_user(&self) -> Option<&str> {
        match self.messages.as_slice() {
            [.., u, a] if u.role == "user" && a.role == "assistant" => Some(&u.content),
            _ => None,
        }
    }

    /// Forget the last turn (to generate its reply again).
    pub fn pop_turn(&mut self) {
        if self.last_user().is_some() {
            self.messages.truncate(self.messages.len() - 2);
        }
    }
    pub fn push(&mut self, user: &str, assistant: &str) {
        self.messages.push(Message::new("user", user));
        self.messages.push(Message::new("assistant", assistant));
    }
}

/// A turn's prompt ids, and whether they end inside a reasoning block.
struct Prompted<'a> {
    ids: &'a [u32],
    in_reasoning: bool,
}

/// Generate the reply to the prompt, streaming it to `on_event`.
fn generate(
    engine: &mut Engine,
    tok: &Tok,
    prompt: Prompted<'_>,
    sampler: &mut Sampler,
    req: GenRequest<'_>,
    obs: &mut dyn Observer,
    on_event: &mut dyn FnMut(TurnEvent<'_>),
) -> Result<Turn, EngineError> {
    let Prompted { ids, in_reasoning } = prompt;
    on_event(TurnEvent::Prompt { tokens: ids.len(), cached: engine.cached_prefix_len(ids), in_reasoning });
    let eos = engine.eos_ids().to_vec();
    // a harmony reply's markup is special tokens, and the splitting needs it
    let harmony = engine.harmony();
    let mut dec = StreamDecoder::new(tok, !harmony);
    let stats = engine.generate(ids, sampler, req, obs, &mut |id, _logits| {
        let piece = if eos.contains(&id) { None } else { dec.push(id).ok().flatten() };
        on_event(TurnEvent::Token { id, piece: piece.as_deref() });
        true
    });
    if let Ok(Some(p)) = dec.flush() {
        on_event(TurnEvent::Tail(&p));
    }
    let stats = stats?;
    let reply_ids: Vec<u32> = stats.generated.iter().copied().filter(|i| !eos.contains(i)).collect();
    let text = tok.decode(&reply_ids, !harmony).map_err(EngineError::Tokenizer)?;
    if !harmony {
        return Ok(Turn { stats, reply: text, reasoning: None });
    }
    // the history keeps the answer (the template drops earlier turns' reasoning, and refuses
    // channel markup in a message's content)
    let (reasoning, mut reply, calls) = super::harmony::split(&text);
    for (name, args) in calls {
        reply.push_str(&format!("\n[call {name} {args}]"));
    }
    Ok(Turn { stats, reply, reasoning })
}

fn no_tokenizer() -> EngineError {
    EngineError::Tokenizer("this model has no tokenizer, so it cannot chat (give prompt ids instead)".into())
}
