//! Tool calls in a reply: Qwen's templates ask the model for
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks; each complete block
//! becomes one of OpenAI's `tool_calls`, the text around them stays content. Streamed: text that
//! may be the start of a block is held back, and a block is sent whole once it closes.

use serde_json::Value;

use super::text::held_back;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
/// A part of a reply as the client gets it: content, a tool call, or reasoning (the last made
/// by `think.rs`, never by the tool splitter).
pub enum Piece {
    Text(String),
    Call(ToolCall),
    Reasoning(String),
}

#[derive(Debug, Default)]
pub struct ToolSplitter {
    buf: String,
    inside: bool,
    /// Whitespace between blocks, sent only if text follows it (a model puts newlines between
    /// and after its calls).
    space: String,
    pub calls: usize,
}

impl ToolSplitter {
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.inside {
                let Some(end) = self.buf.find(CLOSE) else { break };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.inside = false;
                match parse_call(&body) {
                    Some(c) => {
                        self.space.clear();
                        self.calls += 1;
                        out.push(Piece::Call(c));
                    }
                    // not a call after all: the block as the model wrote it
                    None => self.text(&format!("{OPEN}{body}{CLOSE}"), &mut out),
                }
            } else if let Some(at) = self.buf.find(OPEN) {
                let before = self.buf[..at].to_string();
                self.buf.drain(..at + OPEN.len());
                self.text(&before, &mut out);
                self.inside = true;
            } else {
                // keep what may be the start of "<tool_call>"
                let keep = held_back(&self.buf, &[OPEN]);
                let now: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.text(&now, &mut out);
                break;
            }
        }
        out
    }

    /// At the end: an unclosed block or a held `<tool` goes out as text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        let rest = if self.inside { format!("{OPEN}{rest}") } else { rest };
        self.inside = false;
        self.text(&rest, &mut out);
        if self.calls == 0 && !self.space.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut self.space)));
        }
        out
    }

    fn text(&mut self, t: &str, out: &mut Vec<Piece>) {
        if t.is_empty() {
            return;
        }
        if t.trim().is_empty() {
            self.space.push_str(t);
            return;
        }
        let mut s = std::mem::take(&mut self.space);
        s.push_str(t);
        // trailing whitespace waits to see what follows
        let trimmed = s.trim_end().len();
        self.space = s[trimmed..].to_string();
        s.truncate(trimmed);
        out.push(Piece::Text(s));
    }
}

/// `{"name": "f", "arguments": {...}}` (arguments may also be a JSON string).
fn parse_call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// The whole reply at once: its content (None when only calls and whitespace) and calls. A
/// `prefill` the reply continues (a trailing assistant message) counts for its calls only: its
/// text is the client's own.
pub fn split_reply(prefill: Option<&str>, text: &str) -> (Option<String>, Vec<ToolCall>) {
    let mut sp = ToolSplitter::default();
    let mut calls: Vec<ToolCall> = Vec::new();
    if let Some(p) = prefill {
        calls.extend(sp.push(p).into_iter().filter_map(|p| if let Piece::Call(c) = p { Some(c) } else { None }));
    }
    let mut pieces = sp.push(text);
    pieces.extend(sp.finish());
    let mut content = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) | Piece::Reasoning(t) => content.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    // beside calls, the text's surrounding whitespace is the model's layout, not content
    let content = match content.trim() {
        _ if calls.is_empty() => Some(content),
        "" => None,
        t => Some(t.to_string()),
    };
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> Piece {
        Piece::Call(ToolCall { name: name.into(), arguments: args.into() })
    }

    const REPLY: &str = "Let me check é.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n";

    #[test]
    fn whole_reply() {
        let (content, calls) = split_reply(None, REPLY);
        assert_eq!(content.as_deref(), Some("Let me check é."));
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", r#"{"city":"Paris"}"#));
        assert_eq!(calls[1].arguments, "{}");
        let (content, calls) = split_reply(None, &REPLY[REPLY.find("<tool").unwrap()..]);
        assert_eq!((content, calls.len()), (None, 2));
        // not JSON: stays text; unclosed: stays text
        assert_eq!(split_reply(None, "<tool_call>oops</tool_call>").0.as_deref(), Some("<tool_call>oops</tool_call>"));
        assert_eq!(split_reply(None, "a <tool_call>{\"na").0.as_deref(), Some("a <tool_call>{\"na"));
        assert_eq!(split_reply(None, "x < y").0.as_deref(), Some("x < y"));
        // a prefilled call counts, the prefill's text does not come back
        let (content, calls) = split_reply(Some("ok <tool_call>{\"name\": \"f\"}</tool_call>"), "\nbye");
        assert_eq!((content.as_deref(), calls.len()), (Some("bye"), 1));
    }

    #[test]
    fn streamed_in_any_pieces_gives_the_same() {
        let whole = {
            let mut sp = ToolSplitter::default();
            let mut p = sp.push(REPLY);
            p.extend(sp.finish());
            p
        };
        assert_eq!(
            whole,
            [Piece::Text("Let me check é.".into()), call("get_weather", r#"{"city":"Paris"}"#), call("now", "{}")]
        );
        for n in 1..12 {
            let mut sp = ToolSplitter::default();
            let mut got = Vec::new();
            let chars: Vec<char> = REPLY.chars().collect();
            for c in chars.chunks(n) {
                got.extend(sp.push(&c.iter().collect::<String>()));
            }
            got.extend(sp.finish());
            // text may come in more pieces; joined, it is the same
            let mut merged: Vec<Piece> = Vec::new();
            for p in got {
                match (merged.last_mut(), p) {
                    (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
                    (_, p) => merged.push(p),
                }
            }
            assert_eq!(merged, whole, "pieces of {n}");
        }
    }
}
