//! How a model writes its tool calls, read off its chat template: a template prints past calls
//! the way the model was trained to write them, so its markup names the syntax. The markers of
//! DeepSeek's, Kimi's and gpt-oss's calls are special tokens, which a reply's decoder must keep
//! (`kept_tokens`) for the server to find them (serve/tools.rs parses them).

/// A tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallSyntax {
    /// `<tool_call>` blocks: Qwen3's JSON (`{"name": .., "arguments": {..}}`), Qwen3.5's,
    /// Qwen3.6's and Qwen3-Coder's XML functions (`<function=NAME><parameter=KEY>`), GLM-4.5's
    /// `NAME` followed by `<arg_key>`/`<arg_value>` pairs.
    #[default]
    Tagged,
    /// DeepSeek-V3 and V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>JSON<｜tool▁call▁end｜>`
    /// (V3: `function<｜tool▁sep｜>NAME` and the JSON in a json code fence) in a
    /// `<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>` section.
    DeepSeek,
    /// Kimi-K2: `<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>JSON<|tool_call_end|>`
    /// in a `<|tool_calls_section_begin|>` ... `<|tool_calls_section_end|>` section.
    Kimi,
    /// gpt-oss's harmony channels (engine/harmony.rs): every special token is markup.
    Harmony,
}

/// One syntax's markers: a call is the text between `open` and `close`; `section` markers
/// around a run of calls are dropped from the content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Markers {
    pub open: &'static str,
    pub close: &'static str,
    pub section: &'static [&'static str],
    /// Markers inside a call.
    pub inner: &'static [&'static str],
}

pub const TAGGED: Markers = Markers {
    open: "<tool_call>",
    close: "</tool_call>",
    section: &[],
    inner: &["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
};

pub const DEEPSEEK: Markers = Markers {
    open: "<｜tool▁call▁begin｜>",
    close: "<｜tool▁call▁end｜>",
    section: &["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"],
    inner: &["<｜tool▁sep｜>"],
};

pub const KIMI: Markers = Markers {
    open: "<|tool_call_begin|>",
    close: "<|tool_call_end|>",
    section: &["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"],
    inner: &["<|tool_call_argument_begin|>"],
};

/// The reasoning block's tags, kept where a tokenizer makes them special tokens.
const THINK: [&str; 2] = ["<think>", "</think>"];

impl CallSyntax {
    /// The syntax a template's source prints calls in.
    pub fn of(source: &str) -> CallSyntax {
        if source.contains("<|channel|>") {
            CallSyntax::Harmony
        } else if source.contains(DEEPSEEK.open) {
            CallSyntax::DeepSeek
        } else if source.contains(KIMI.open) {
            CallSyntax::Kimi
        } else {
            CallSyntax::Tagged
        }
    }

    /// The markers of a `<tool_call>`-like syntax (None for harmony, which has its own parser).
    pub fn markers(self) -> Option<Markers> {
        match self {
            CallSyntax::Tagged => Some(TAGGED),
            CallSyntax::DeepSeek => Some(DEEPSEEK),
            CallSyntax::Kimi => Some(KIMI),
            CallSyntax::Harmony => None,
        }
    }

    /// The ids of the special tokens a reply's text must keep, from `id` (the tokenizer's
    /// lookup); None: keep every special token (harmony). A marker that is not one token is
    /// ordinary text already.
    pub fn kept_tokens(self, id: impl Fn(&str) -> Option<u32>) -> Option<Vec<u32>> {
        let m = self.markers()?;
        let all = [m.open, m.close].into_iter().chain(m.section.iter().copied()).chain(m.inner.iter().copied());
        Some(all.chain(THINK).filter_map(id).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_familys_template_names_its_syntax() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect(f);
        assert_eq!(CallSyntax::of(&read("deepseek-ai-DeepSeek-V3.1.jinja")), CallSyntax::DeepSeek);
        assert_eq!(CallSyntax::of(&read("moonshotai-Kimi-K2.jinja")), CallSyntax::Kimi);
        assert_eq!(CallSyntax::of(&read("GLM-4.6.jinja")), CallSyntax::Tagged);
        assert_eq!(CallSyntax::of("{{ '<|start|>assistant<|channel|>final' }}"), CallSyntax::Harmony);
        let kept = CallSyntax::Kimi.kept_tokens(|t| (t == KIMI.open).then_some(7)).expect("kept");
        assert_eq!(kept, vec![7]);
        assert!(CallSyntax::Harmony.kept_tokens(|_| Some(1)).is_none());
    }
}
