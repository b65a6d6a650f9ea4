//! Reasoning in a reply: Qwen3's models open with a `<think>...</think>` block; as llama-server
//! does by default (`reasoning_format` deepseek), it comes back as `reasoning_content` and the
//! text after it as `content`. Only a reply that begins with the block (after whitespace) is
//! split; streamed, text that may still be `<think>` or `</think>` is held back.

use super::text::held_back;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// `<think>` when the prompt ends with it (trailing whitespace aside): a template that opens
/// the reasoning block in its generation prompt, so the reply begins inside it.
pub fn opened_by(prompt: &str) -> Option<&'static str> {
    crate::engine::chat_template::opens_reasoning(prompt).then_some(OPEN)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    /// Nothing but whitespace or a start of `<think>` so far.
    #[default]
    Start,
    Thinking,
    /// After `</think>`: its separating whitespace is dropped first.
    AfterThinking,
    Content,
}

#[derive(Debug, Default)]
pub struct ThinkSplitter {
    state: State,
    buf: String,
}

impl ThinkSplitter {
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.starts_with(OPEN) {
                        let skip = self.buf.len() - t.len() + OPEN.len();
                        self.buf.drain(..skip);
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(t) {
                        break;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking => match self.buf.find(CLOSE) {
                    Some(i) => {
                        let r = self.buf[..i].to_string();
                        self.buf.drain(..i + CLOSE.len());
                        if !r.is_empty() {
                            out.push(Part::Reasoning(r));
                        }
                        self.state = State::AfterThinking;
                    }
                    None => {
                        let keep = held_back(&self.buf, &[CLOSE]);
                        let r: String = self.buf.drain(..self.buf.len() - keep).collect();
                        if !r.is_empty() {
                            out.push(Part::Reasoning(r));
                        }
                        break;
                    }
                },
                State::AfterThinking => {
                    let lead = self.buf.len() - self.buf.trim_start().len();
                    self.buf.drain(..lead);
                    if self.buf.is_empty() {
                        break;
                    }
                    self.state = State::Content;
                }
                State::Content => {
                    if !self.buf.is_empty() {
                        out.push(Part::Content(std::mem::take(&mut self.buf)));
                    }
                    break;
                }
            }
        }
        out
    }

    /// Inside a block that has not closed (at the end: the reply ended in its reasoning).
    pub fn unclosed(&self) -> bool {
        self.state == State::Thinking
    }

    /// At the end: what was held back (an unclosed block is all reasoning).
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            _ if rest.is_empty() => vec![],
            State::Thinking => vec![Part::Reasoning(rest)],
            State::AfterThinking => vec![],
            State::Start | State::Content => vec![Part::Content(rest)],
        }
    }
}

/// A whole reply split: its reasoning (trimmed; None when there is none), and the content of
/// the prefill it continued and of its own text. The prefill's own reasoning is the client's
/// and is left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: Option<String>,
    pub prefill: String,
    pub content: String,
    /// The reply ended inside its reasoning block.
    pub unclosed: bool,
}

pub fn split_reasoning(prefill: Option<&str>, text: &str) -> Split {
    let mut sp = ThinkSplitter::default();
    let join = |parts: Vec<Part>, reasoning: &mut String| {
        let mut content = String::new();
        for p in parts {
            match p {
                Part::Reasoning(r) => reasoning.push_str(&r),
                Part::Content(c) => content.push_str(&c),
            }
        }
        content
    };
    let prefill = join(prefill.map(|p| sp.push(p)).unwrap_or_default(), &mut String::new());
    let mut parts = sp.push(text);
    parts.extend(sp.finish());
    let mut reasoning = String::new();
    let content = join(parts, &mut reasoning);
    let r = reasoning.trim();
    Split { reasoning: (!r.is_empty()).then(|| r.to_string()), prefill, content, unclosed: sp.unclosed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(text: &str) -> (Option<String>, String) {
        let s = split_reasoning(None, text);
        (s.reasoning, s.content)
    }

    #[test]
    fn splits_a_leading_block_only() {
        assert_eq!(whole("<think>\nhmm\n</think>\n\nHello"), (Some("hmm".into()), "Hello".into()));
        assert_eq!(whole("<think>\n\n</think>\n\nHello"), (None, "Hello".into()));
        assert_eq!(whole("Hello <think>x</think>"), (None, "Hello <think>x</think>".into()));
        assert_eq!(whole("<think>unclosed"), (Some("unclosed".into()), String::new()));
        assert_eq!(whole("<thin"), (None, "<thin".into()));
        // a prefill that opened the block: the reply goes on inside it
        let s = split_reasoning(Some("<think>\n"), "plan\n</think>\n\nok");
        assert_eq!((s.reasoning.as_deref(), s.prefill.as_str(), s.content.as_str()), (Some("plan"), "", "ok"));
        let s = split_reasoning(Some("<think>mine</think>\n\nSure: "), "yes");
        assert_eq!((s.reasoning, s.prefill.as_str(), s.content.as_str()), (None, "Sure: ", "yes"));
    }

    #[test]
    fn a_prompt_that_opens_the_block_starts_the_reply_inside_it() {
        // DeepSeek-V3.1's generation prompt with thinking on (tests/fixtures/family_chat_reference.json)
        let prompt = "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>";
        let state = opened_by(prompt);
        assert_eq!(state, Some("<think>"));
        let s = split_reasoning(state, "Greet back.</think>Hello!");
        assert_eq!((s.reasoning.as_deref(), s.content.as_str()), (Some("Greet back."), "Hello!"));
        // thinking off (an empty block), and Qwen3's prompt: the reply is all content
        assert_eq!(opened_by("<｜User｜>Hi<｜Assistant｜><think></think>"), None);
        assert_eq!(opened_by("<|im_start|>assistant\n"), None);
    }

    #[test]
    fn streamed_in_any_pieces_gives_the_same() {
        let text = "  <think>\nI should say hi é.\n</think>\n\nHi é, </think> stays.";
        let want = whole(text);
        assert_eq!(want, (Some("I should say hi é.".into()), "Hi é, </think> stays.".into()));
        let chars: Vec<char> = text.chars().collect();
        for n in 1..10 {
            let mut sp = ThinkSplitter::default();
            let mut parts = Vec::new();
            for c in chars.chunks(n) {
                parts.extend(sp.push(&c.iter().collect::<String>()));
            }
            parts.extend(sp.finish());
            let (mut r, mut c) = (String::new(), String::new());
            for p in parts {
                match p {
                    Part::Reasoning(x) => r.push_str(&x),
                    Part::Content(x) => c.push_str(&x),
                }
            }
            assert_eq!((Some(r.trim().to_string()), c), want, "pieces of {n}");
        }
    }
}
