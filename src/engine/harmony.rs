//! gpt-oss's replies in OpenAI's harmony format, split as they stream. The reply continues the
//! prompt's `<|start|>assistant`, so it is one or more messages:
//!
//! ```text
//! [ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY END
//! ```
//!
//! where END is `<|end|>` (and the next message opens with `<|start|>assistant`), `<|return|>`
//! (the answer is complete) or `<|call|>` (a tool call, the turn's end). `analysis` bodies are
//! reasoning, `final` bodies (and `commentary` with no recipient: a preamble to the user) are
//! content, and a body sent to `functions.NAME` is a call of NAME with the body as its JSON
//! arguments. The text must be decoded with special tokens kept; the two that end a reply
//! (`<|return|>`, `<|call|>`) are end-of-sequence ids a generator leaves out, so the end of the
//! text ends the open message too. Text that does not start as a message is content as it is
//! (a model that does not follow the format loses nothing).

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];
/// A header longer than this without `<|message|>` is not one: it goes out as content.
const MAX_HEADER: usize = 512;

/// A part of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Content(String),
    /// A call of `name` (the recipient without its `functions.` namespace) with the body as
    /// its arguments (JSON text).
    Call {
        name: String,
        arguments: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum State {
    /// Nothing yet, or only what may still open a message.
    #[default]
    Start,
    /// Inside a header (after `<|start|>` or at the reply's start), until `<|message|>`.
    Header,
    Body(Body),
    /// Not harmony after all: everything is content.
    Plain,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    Call(String),
}

#[derive(Debug, Default)]
pub struct HarmonySplitter {
    state: State,
    buf: String,
    /// A call's arguments so far (sent whole once the call ends).
    call: String,
}

impl HarmonySplitter {
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state.clone() {
                State::Start => {
                    let opens = [CHANNEL, " to=", START];
                    if opens.iter().any(|o| self.buf.starts_with(o)) {
                        self.state = State::Header;
                    } else if opens.iter().any(|o| o.starts_with(self.buf.as_str())) {
                        break;
                    } else {
                        self.state = State::Plain;
                    }
                }
                State::Header => match self.buf.find(MESSAGE) {
                    Some(i) => {
                        let header = self.buf[..i].to_string();
                        self.buf.drain(..i + MESSAGE.len());
                        self.state = State::Body(body_of(&header));
                        self.call.clear();
                    }
                    None if self.buf.len() > MAX_HEADER => self.state = State::Plain,
                    None => break,
                },
                State::Body(kind) => {
                    let end = ENDS.iter().filter_map(|e| self.buf.find(e).map(|i| (i, e.len()))).min();
                    let (text, done) = match end {
                        Some((i, n)) => {
                            let t = self.buf[..i].to_string();
                            self.buf.drain(..i + n);
                            (t, true)
                        }
                        None => {
                            let keep = held_back(&self.buf);
                            (self.buf.drain(..self.buf.len() - keep).collect(), false)
                        }
                    };
                    self.body_text(&kind, text, &mut out);
                    if !done {
                        break;
                    }
                    self.end_message(&kind, &mut out);
                    // the next message opens with <|start|>assistant
                    self.state = State::Header;
                }
                State::Plain => {
                    if !self.buf.is_empty() {
                        out.push(Part::Content(std::mem::take(&mut self.buf)));
                    }
                    break;
                }
            }
        }
        out
    }

    /// At the end of the reply: the open message ends (a call is complete: `<|call|>` ended
    /// it), and what was held back goes out.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match std::mem::take(&mut self.state) {
            State::Body(kind) => {
                self.body_text(&kind, rest, &mut out);
                self.end_message(&kind, &mut out);
            }
            State::Start | State::Plain if !rest.is_empty() => out.push(Part::Content(rest)),
            // a header with no body: nothing was said
            _ => {}
        }
        out
    }

    fn body_text(&mut self, kind: &Body, text: String, out: &mut Vec<Part>) {
        if text.is_empty() {
            return;
        }
        match kind {
            Body::Reasoning => out.push(Part::Reasoning(text)),
            Body::Content => out.push(Part::Content(text)),
            Body::Call(_) => self.call.push_str(&text),
        }
    }

    fn end_message(&mut self, kind: &Body, out: &mut Vec<Part>) {
        if let Body::Call(name) = kind {
            out.push(Part::Call { name: name.clone(), arguments: std::mem::take(&mut self.call).trim().to_string() });
        }
    }
}

/// A harmony reply as Qwen-style text, for views that show `<think>` blocks (the workbench's
/// chat pane dims and folds them): reasoning inside `<think>` ... `</think>`, content as it
/// is, a call as `[call NAME ARGS]`.
#[derive(Default)]
pub struct ThinkTags {
    split: HarmonySplitter,
    thinking: bool,
}

impl ThinkTags {
    pub fn push(&mut self, text: &str) -> String {
        let parts = self.split.push(text);
        self.show(parts)
    }

    pub fn finish(&mut self) -> String {
        let parts = self.split.finish();
        let mut s = self.show(parts);
        if std::mem::take(&mut self.thinking) {
            s.push_str("</think>");
        }
        s
    }

    fn show(&mut self, parts: Vec<Part>) -> String {
        let mut s = String::new();
        for p in parts {
            let reasoning = matches!(p, Part::Reasoning(_));
            if reasoning != self.thinking {
                s.push_str(if reasoning { "<think>" } else { "</think>" });
                self.thinking = reasoning;
            }
            match p {
                Part::Reasoning(t) | Part::Content(t) => s.push_str(&t),
                Part::Call { name, arguments } => s.push_str(&format!("[call {name} {arguments}]")),
            }
        }
        s
    }
}

/// What a header says the body is: a call when it names a recipient, else by channel.
fn body_of(header: &str) -> Body {
    let recipient = header.split(" to=").nth(1).map(|r| {
        let r = r.split(CHANNEL).next().unwrap_or(r);
        r.split([' ', '<']).next().unwrap_or(r).to_string()
    });
    if let Some(r) = recipient.filter(|r| !r.is_empty() && r != "assistant") {
        return Body::Call(r.strip_prefix("functions.").unwrap_or(&r).to_string());
    }
    let channel = header.split(CHANNEL).nth(1).map(|c| c.split([' ', '<']).next().unwrap_or(c));
    match channel {
        Some("analysis") => Body::Reasoning,
        _ => Body::Content,
    }
}

/// How many bytes at the end of `buf` may be the start of a message's end.
fn held_back(buf: &str) -> usize {
    (1..=buf.len().min(10))
        .rev()
        .find(|&n| buf.is_char_boundary(buf.len() - n) && ENDS.iter().any(|e| e.starts_with(&buf[buf.len() - n..])))
        .unwrap_or(0)
}

/// A whole reply's parts, in order.
pub fn split_parts(text: &str) -> Vec<Part> {
    let mut s = HarmonySplitter::default();
    let mut parts = s.push(text);
    parts.extend(s.finish());
    parts
}

/// A whole reply split: its reasoning and content (each joined; None when empty), and its calls.
pub fn split(text: &str) -> (Option<String>, String, Vec<(String, String)>) {
    let parts = split_parts(text);
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
    for p in parts {
        match p {
            Part::Reasoning(r) => reasoning.push_str(&r),
            Part::Content(c) => content.push_str(&c),
            Part::Call { name, arguments } => calls.push((name, arguments)),
        }
    }
    ((!reasoning.is_empty()).then_some(reasoning), content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLY: &str = "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";

    /// `text` fed `step` bytes at a time (on char boundaries), the parts merged by kind.
    fn streamed(text: &str, step: usize) -> Vec<Part> {
        let mut s = HarmonySplitter::default();
        let mut parts = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            parts.extend(s.push(&text[at..end]));
            at = end;
        }
        parts.extend(s.finish());
        merged(parts)
    }

    /// Parts with adjacent reasoning, and adjacent content, joined.
    fn merged(parts: Vec<Part>) -> Vec<Part> {
        let mut merged: Vec<Part> = Vec::new();
        for p in parts {
            match (merged.last_mut(), p) {
                (Some(Part::Reasoning(a)), Part::Reasoning(b)) => a.push_str(&b),
                (Some(Part::Content(a)), Part::Content(b)) => a.push_str(&b),
                (_, p) => merged.push(p),
            }
        }
        merged
    }

    #[test]
    fn channels_split_at_any_chunking() {
        let want = vec![Part::Reasoning("User asks 2+2. Answer 4.".into()), Part::Content("2 + 2 = 4.".into())];
        for step in [1, 2, 3, 7, 1000] {
            assert_eq!(streamed(REPLY, step), want, "step {step}");
        }
    }

    #[test]
    fn calls_either_way_round_with_a_constraint() {
        for text in [
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}<|call|>",
        ] {
            for step in [1, 5, 1000] {
                assert_eq!(
                    streamed(text, step),
                    vec![
                        Part::Reasoning("Need weather.".into()),
                        Part::Call { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() }
                    ],
                    "{text} step {step}"
                );
            }
        }
    }

    /// `text` streamed in three pieces cut at every pair of byte offsets (char boundaries: the
    /// engine's text comes as whole characters), merged.
    fn cut_everywhere(text: &str, each: &mut dyn FnMut(&[&str])) {
        let at: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for (k, &i) in at.iter().enumerate() {
            for &j in &at[k..] {
                each(&[&text[..i], &text[i..j], &text[j..]]);
            }
        }
    }

    #[test]
    fn a_call_cut_at_every_byte_offset_gives_the_same_parts() {
        let text = "<|channel|>analysis<|message|>Wetter é?<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Zürich\"}<|call|>";
        let want = streamed(text, 1000);
        assert_eq!(want.len(), 2, "{want:?}");
        cut_everywhere(text, &mut |pieces| {
            let mut s = HarmonySplitter::default();
            let mut parts: Vec<Part> = pieces.iter().flat_map(|p| s.push(p)).collect();
            parts.extend(s.finish());
            assert_eq!(merged(parts), want, "{pieces:?}");
        });
    }

    #[test]
    fn a_preamble_is_content_and_plain_text_stays_whole() {
        let pre = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>";
        assert_eq!(split(pre), (None, "Checking.Done.".into(), vec![]));
        assert_eq!(split("Just text <|end|> here"), (None, "Just text <|end|> here".into(), vec![]));
        assert_eq!(split("<|chan"), (None, "<|chan".into(), vec![]));
        // an analysis cut off by the token limit is all reasoning
        assert_eq!(
            split("<|channel|>analysis<|message|>Thinking <|en"),
            (Some("Thinking <|en".into()), String::new(), vec![])
        );
    }

    #[test]
    fn think_tags_for_views_of_qwen_style_text() {
        let mut v = ThinkTags::default();
        let mut s: String = REPLY.chars().map(|c| v.push(&c.to_string())).collect();
        s += &v.finish();
        assert_eq!(s, "<think>User asks 2+2. Answer 4.</think>2 + 2 = 4.");
        let mut v = ThinkTags::default();
        assert_eq!(v.push("<|channel|>analysis<|message|>cut"), "<think>cut");
        assert_eq!(v.finish(), "</think>");
    }

    #[test]
    fn held_back_only_what_may_end_a_message() {
        assert_eq!(held_back("abc<|e"), 3);
        assert_eq!(held_back("abc<|ret"), 5);
        assert_eq!(held_back("abc<"), 1);
        assert_eq!(held_back("abc"), 0);
        assert_eq!(held_back("é<|"), 2);
    }
}
