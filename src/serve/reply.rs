//! The engine's events as OpenAI's response objects: whole (`chat.completion`,
//! `text_completion`) or as the stream's chunks in the order clients rely on: the role chunk,
//! content (or tool call) deltas, a chunk with `finish_reason` and an empty delta, the usage
//! chunk when asked, and `[DONE]` after everything, errors included.

use std::sync::Arc;

use serde_json::{Value, json};

use super::think::{Part, ThinkSplitter, split_reasoning};
use super::tools::{Piece, ToolCall, ToolSplitter, split_reply};
use super::worker::{Event, Finish, TokenLogprob, Usage};
use crate::engine::call_syntax::CallSyntax;
use crate::engine::harmony::{self, HarmonySplitter};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// What every chunk of one response shares, and what the request asked for.
#[derive(Debug, Clone)]
pub struct Shape {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Parse `<tool_call>` blocks out of the reply: the request's `tools` (their parameters'
    /// types type an XML call's values); None: no tools given.
    pub tools: Option<Arc<Value>>,
    /// Send a leading `<think>` block as `reasoning_content` (chat only).
    pub think: bool,
    /// How the model writes tool calls. Harmony (gpt-oss's channels): with `think`, `analysis`
    /// is `reasoning_content`, `final` the content and calls `tool_calls` (engine/harmony.rs),
    /// instead of the `<think>` and tool splitters.
    pub calls: CallSyntax,
    pub include_usage: bool,
    /// Send the `Progress` events as chunks with a `prompt_progress` object (and nothing else).
    pub progress: bool,
    /// A trailing assistant message the reply continues: tool calls in it count, its text is
    /// not sent again.
    pub prefill: Option<String>,
}

/// The SSE payload of `[DONE]`.
pub const DONE: &str = "[DONE]";

/// Streamed responses: each engine event to the `data:` payloads it gives.
pub struct Chunks {
    shape: Shape,
    think: Option<ThinkSplitter>,
    /// The reasoning so far, where tools were given: calls in a block the reply never closed
    /// are returned at its end (the model meant to call; a closed block's are its drafts).
    reasoning: String,
    split: Option<ToolSplitter>,
    harmony: Option<HarmonySplitter>,
    calls: usize,
    ended: bool,
}

impl Chunks {
    pub fn new(shape: Shape) -> Chunks {
        let chat_think = shape.think && shape.kind == Kind::Chat;
        let harmony = (chat_think && shape.calls == CallSyntax::Harmony).then(HarmonySplitter::default);
        let split =
            (shape.tools.is_some() && harmony.is_none()).then(|| ToolSplitter::new(shape.calls, shape.tools.clone()));
        let think = (chat_think && harmony.is_none()).then(ThinkSplitter::default);
        Chunks { shape, think, reasoning: String::new(), split, harmony, calls: 0, ended: false }
    }

    /// True once `[DONE]` has been given.
    pub fn ended(&self) -> bool {
        self.ended
    }

    pub fn on(&mut self, ev: Event) -> Vec<String> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        match ev {
            Event::Started { .. } => {
                if self.shape.kind == Kind::Chat {
                    out.push(self.chunk(json!({"role": "assistant", "content": null}), None, None));
                }
                // the prefill is the client's own text: only the state it leaves (inside a
                // <think> block) and the tool calls in it count
                if let Some(p) = self.shape.prefill.clone() {
                    let calls: Vec<Piece> =
                        self.split_text(&p, false).into_iter().filter(|p| matches!(p, Piece::Call(_))).collect();
                    self.pieces(calls, Vec::new(), &mut out);
                }
            }
            Event::Progress { total, cache, processed, time_ms } if self.shape.progress => {
                // llama-server's: a chunk with nothing in its choice and the progress beside it
                let mut c = self.base();
                c["choices"] = match self.shape.kind {
                    Kind::Chat => json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": null}]),
                    Kind::Completion => json!([{"index": 0, "text": "", "logprobs": null, "finish_reason": null}]),
                };
                c["prompt_progress"] =
                    json!({"total": total, "cache": cache, "processed": processed, "time_ms": time_ms});
                out.push(c.to_string());
            }
            Event::Progress { .. } => {}
            Event::Text { text, logprobs } => {
                let pieces = self.split_text(&text, false);
                self.pieces(pieces, logprobs, &mut out);
            }
            Event::Done { finish, usage } => {
                let rest = self.split_text("", true);
                self.pieces(rest, Vec::new(), &mut out);
                if self.calls == 0 && self.think.as_ref().is_some_and(ThinkSplitter::unclosed) {
                    let calls = split_reply(self.shape.calls, None, &self.reasoning, self.shape.tools.clone()).1;
                    self.pieces(calls.into_iter().map(Piece::Call).collect(), Vec::new(), &mut out);
                }
                let reason = finish_reason(finish, self.calls);
                out.push(match self.shape.kind {
                    Kind::Chat => self.chunk(json!({}), None, Some(reason)),
                    Kind::Completion => self.text_chunk("", None, Some(reason)),
                });
                if self.shape.include_usage {
                    let mut u = self.base();
                    u["choices"] = json!([]);
                    u["usage"] = usage_json(&usage);
                    out.push(u.to_string());
                }
                out.push(DONE.into());
                self.ended = true;
            }
            Event::Error { message } => out.extend(self.error(&message)),
        }
        out
    }

    /// An error chunk, then `[DONE]` (the engine failed, or its channel closed without an end:
    /// the server is stopping).
    pub fn error(&mut self, message: &str) -> Vec<String> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        vec![json!({"error": {"message": message, "type": "server_error", "code": 500}}).to_string(), DONE.into()]
    }

    /// Text through the reasoning and tool splitters (`end`: flush what they hold).
    fn split_text(&mut self, text: &str, end: bool) -> Vec<Piece> {
        if let Some(h) = self.harmony.as_mut() {
            let mut parts = h.push(text);
            if end {
                parts.extend(h.finish());
            }
            return parts.into_iter().map(harmony_piece).collect();
        }
        let parts = match self.think.as_mut() {
            Some(t) => {
                let mut p = t.push(text);
                if end {
                    p.extend(t.finish());
                }
                p
            }
            None => vec![Part::Content(text.to_string())],
        };
        let mut out = Vec::new();
        for p in parts {
            match (p, self.split.as_mut()) {
                (Part::Reasoning(r), Some(_)) => {
                    self.reasoning.push_str(&r);
                    out.push(Piece::Reasoning(r));
                }
                (Part::Reasoning(r), None) => out.push(Piece::Reasoning(r)),
                (Part::Content(c), Some(sp)) => out.extend(sp.push(&c)),
                (Part::Content(c), None) if !c.is_empty() => out.push(Piece::Text(c)),
                (Part::Content(_), None) => {}
            }
        }
        if end && let Some(sp) = self.split.as_mut() {
            out.extend(sp.finish());
        }
        out
    }

    fn pieces(&mut self, pieces: Vec<Piece>, mut logprobs: Vec<TokenLogprob>, out: &mut Vec<String>) {
        for p in pieces {
            let lp = std::mem::take(&mut logprobs);
            let lp = (!lp.is_empty()).then_some(lp);
            out.push(match (p, self.shape.kind) {
                (Piece::Text(t), Kind::Chat) => self.chunk(json!({"content": t}), lp.as_deref(), None),
                (Piece::Text(t), Kind::Completion) => self.text_chunk(&t, lp.as_deref(), None),
                (Piece::Reasoning(r), _) => self.chunk(json!({"reasoning_content": r}), lp.as_deref(), None),
                (Piece::Call(c), _) => {
                    let call = tool_call_json(&c, self.calls, &self.shape.id);
                    self.calls += 1;
                    self.chunk(json!({"tool_calls": [call]}), lp.as_deref(), None)
                }
            });
        }
        // tokens whose text is still held back: their numbers go out on their own
        if !logprobs.is_empty() {
            out.push(match self.shape.kind {
                Kind::Chat => self.chunk(json!({"content": ""}), Some(&logprobs), None),
                Kind::Completion => self.text_chunk("", Some(&logprobs), None),
            });
        }
    }

    fn base(&self) -> Value {
        let object = match self.shape.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        json!({"id": self.shape.id, "object": object, "created": self.shape.created, "model": self.shape.model})
    }

    fn chunk(&self, delta: Value, lp: Option<&[TokenLogprob]>, finish: Option<&str>) -> String {
        let mut c = self.base();
        c["choices"] =
            json!([{"index": 0, "delta": delta, "logprobs": lp.map(chat_logprobs), "finish_reason": finish}]);
        c.to_string()
    }

    fn text_chunk(&self, text: &str, lp: Option<&[TokenLogprob]>, finish: Option<&str>) -> String {
        let mut c = self.base();
        c["choices"] =
            json!([{"index": 0, "text": text, "logprobs": lp.map(|l| legacy_logprobs(l, 0)), "finish_reason": finish}]);
        c.to_string()
    }
}

fn harmony_piece(p: harmony::Part) -> Piece {
    match p {
        harmony::Part::Reasoning(r) => Piece::Reasoning(r),
        harmony::Part::Content(c) => Piece::Text(c),
        harmony::Part::Call { name, arguments } => Piece::Call(ToolCall { name, arguments }),
    }
}

fn finish_reason(f: Finish, calls: usize) -> &'static str {
    if calls > 0 && f == Finish::Stop { "tool_calls" } else { f.name() }
}

fn tool_call_json(c: &ToolCall, index: usize, id: &str) -> Value {
    let call_id = format!("call_{}_{index}", id.rsplit('-').next().unwrap_or(id));
    json!({"index": index, "id": call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// llama-server's `timings`.
pub fn timings_json(u: &Usage) -> Value {
    let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1000.0 / ms } else { 0.0 };
    let prompt_n = u.prompt_tokens - u.cached_tokens;
    json!({
        "cache_n": u.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": u.prompt_ms,
        "prompt_per_second": per_s(prompt_n, u.prompt_ms),
        "predicted_n": u.completion_tokens,
        "predicted_ms": u.predicted_ms,
        "predicted_per_second": per_s(u.decode_steps, u.predicted_ms),
    })
}

fn chat_logprobs(l: &[TokenLogprob]) -> Value {
    let one = |t: &str, lp: f32| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()});
    let content: Vec<Value> = l
        .iter()
        .map(|t| {
            let mut v = one(&t.token, t.logprob);
            v["top_logprobs"] = t.top.iter().map(|(s, lp)| one(s, *lp)).collect();
            v
        })
        .collect();
    json!({"content": content})
}

/// The legacy endpoint's form; `offset` is where the first token's text starts in the reply.
fn legacy_logprobs(l: &[TokenLogprob], offset: usize) -> Value {
    let mut at = offset;
    let offsets: Vec<usize> = l
        .iter()
        .map(|t| {
            let o = at;
            at += t.token.len();
            o
        })
        .collect();
    json!({
        "tokens": l.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": l.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": l.iter().map(|t| t.top.iter().map(|(s, lp)| (s.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// A whole reply gathered from the events.
#[derive(Debug, Default)]
pub struct Whole {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub end: Option<(Finish, Usage)>,
}

impl Whole {
    /// Add an event; Err with the engine's message for an error.
    pub fn add(&mut self, ev: Event) -> Result<(), String> {
        match ev {
            Event::Started { .. } | Event::Progress { .. } => {}
            Event::Text { text, logprobs } => {
                self.text.push_str(&text);
                self.logprobs.extend(logprobs);
            }
            Event::Done { finish, usage } => self.end = Some((finish, usage)),
            Event::Error { message } => return Err(message),
        }
        Ok(())
    }

    /// The response object; `want_logprobs` as the request asked.
    pub fn response(&self, shape: &Shape, want_logprobs: bool) -> Value {
        let (finish, usage) = self.end.unwrap_or((Finish::Stop, Usage::default()));
        let lp = want_logprobs.then_some(self.logprobs.as_slice());
        let (object, choice) = match shape.kind {
            Kind::Chat => {
                let (reasoning, content, calls) = self.chat_content(shape);
                let mut message = json!({"role": "assistant", "content": content});
                if let Some(r) = reasoning {
                    message["reasoning_content"] = r.into();
                }
                if !calls.is_empty() {
                    let calls: Vec<Value> =
                        calls.iter().enumerate().map(|(i, c)| tool_call_json(c, i, &shape.id)).collect();
                    message["tool_calls"] = Value::Array(calls);
                }
                let choice = json!({"index": 0, "message": message, "logprobs": lp.map(chat_logprobs), "finish_reason": finish_reason(finish, calls.len())});
                ("chat.completion", choice)
            }
            Kind::Completion => (
                "text_completion",
                json!({"index": 0, "text": self.text, "logprobs": lp.map(|l| legacy_logprobs(l, 0)), "finish_reason": finish.name()}),
            ),
        };
        json!({
            "id": shape.id, "object": object, "created": shape.created, "model": shape.model,
            "choices": [choice], "usage": usage_json(&usage), "timings": timings_json(&usage),
        })
    }

    /// The reply's reasoning, content and tool calls.
    fn chat_content(&self, shape: &Shape) -> (Option<String>, Option<String>, Vec<ToolCall>) {
        if shape.think && shape.calls == CallSyntax::Harmony {
            // the prefill is the client's: only the calls in it count
            let mut h = HarmonySplitter::default();
            let mut calls: Vec<ToolCall> = h
                .push(shape.prefill.as_deref().unwrap_or(""))
                .into_iter()
                .filter_map(|p| match harmony_piece(p) {
                    Piece::Call(c) => Some(c),
                    _ => None,
                })
                .collect();
            let (mut reasoning, mut content) = (String::new(), String::new());
            let mut parts = h.push(&self.text);
            parts.extend(h.finish());
            for p in parts.into_iter().map(harmony_piece) {
                match p {
                    Piece::Reasoning(r) => reasoning.push_str(&r),
                    Piece::Text(t) => content.push_str(&t),
                    Piece::Call(c) => calls.push(c),
                }
            }
            let content = (!content.is_empty() || calls.is_empty()).then_some(content);
            return ((!reasoning.is_empty()).then_some(reasoning), content, calls);
        }
        let (reasoning, prefill, text, unclosed) = match shape.think {
            true => {
                let s = split_reasoning(shape.prefill.as_deref(), &self.text);
                (s.reasoning, Some(s.prefill), s.content, s.unclosed)
            }
            false => (None, shape.prefill.clone(), self.text.clone(), false),
        };
        if shape.tools.is_none() {
            return (reasoning, Some(text), Vec::new());
        }
        let (content, mut calls) = split_reply(shape.calls, prefill.as_deref(), &text, shape.tools.clone());
        // a reply that ended inside its reasoning: the calls written there are returned (the
        // reasoning keeps their text, as the stream sent it)
        if unclosed && calls.is_empty() {
            calls = split_reply(shape.calls, None, reasoning.as_deref().unwrap_or(""), shape.tools.clone()).1;
        }
        (reasoning, content, calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chat reply's stream, and the same reply whole: its reasoning, content and calls.
    fn both(text: &str) -> (Vec<Value>, Value) {
        let tools = Some(Arc::new(json!([{"type": "function", "function": {"name": "f"}}])));
        let shape = Shape {
            kind: Kind::Chat,
            id: "chatcmpl-1-0".into(),
            created: 0,
            model: "m".into(),
            tools,
            think: true,
            calls: CallSyntax::Tagged,
            include_usage: false,
            progress: false,
            prefill: None,
        };
        let (done, text) = (Event::Done { finish: Finish::Stop, usage: Usage::default() }, text.to_string());
        let mut c = Chunks::new(shape.clone());
        let mut whole = Whole::default();
        let mut out = Vec::new();
        for ev in [Event::Started { prompt_tokens: 1, cached_tokens: 0 }, Event::Text { text, logprobs: vec![] }, done]
        {
            out.extend(c.on(ev.clone()).into_iter().filter(|s| s != DONE));
            whole.add(ev).unwrap();
        }
        (out.iter().map(|s| serde_json::from_str(s).unwrap()).collect(), whole.response(&shape, false))
    }

    #[test]
    fn a_call_in_reasoning_that_never_closed_is_returned_a_closed_ones_is_not() {
        let call = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";
        for (closed, text) in
            [(false, format!("<think>\nI will call.\n{call}")), (true, format!("<think>\n{call}\n</think>\n\nNo."))]
        {
            let (chunks, whole) = both(&text);
            let streamed: Vec<&Value> =
                chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
            let msg = &whole["choices"][0]["message"];
            let finish = &whole["choices"][0]["finish_reason"];
            if closed {
                assert!(streamed.is_empty() && msg.get("tool_calls").is_none(), "{chunks:?} {whole}");
                assert_eq!((msg["content"].as_str(), finish.as_str()), (Some("No."), Some("stop")));
            } else {
                assert_eq!(streamed.len(), 1, "{chunks:?}");
                assert_eq!(streamed[0][0]["function"]["arguments"], r#"{"a": 1}"#);
                assert_eq!(msg["tool_calls"][0]["function"]["arguments"], r#"{"a": 1}"#, "{whole}");
                assert_eq!(finish, "tool_calls");
                // the reasoning keeps the call's text, as the stream sent it
                assert!(msg["reasoning_content"].as_str().is_some_and(|r| r.contains("<function=f>")), "{whole}");
            }
        }
    }
}
