//! A multi-turn chat: the messages so far, rendered through the model's template each turn.
//! The engine's prefix reuse then evaluates only what the new turn added.

use super::EngineError;
use super::chat_template::{ChatTemplate, Message};
use super::tokenizer::Tok;

#[derive(Debug, Clone, Default)]
pub struct ChatSession {
    pub system: Option<String>,
    pub messages: Vec<Message>,
    /// Passed to the template as `enable_thinking` when set.
    pub enable_thinking: Option<bool>,
}

impl ChatSession {
    pub fn new(system: Option<String>, enable_thinking: Option<bool>) -> ChatSession {
        ChatSession { system, messages: Vec::new(), enable_thinking }
    }

    pub fn reset(&mut self) {
        self.messages.clear();
    }

    /// Prompt ids for the conversation plus a new user message (not yet recorded), ending
    /// with the assistant's generation prompt.
    pub fn prompt_with(&self, tok: &Tok, tmpl: &ChatTemplate, user: &str) -> Result<Vec<u32>, EngineError> {
        let mut msgs = Vec::with_capacity(self.messages.len() + 2);
        if let Some(s) = &self.system {
            msgs.push(Message::new("system", s));
        }
        msgs.extend(self.messages.iter().cloned());
        msgs.push(Message::new("user", user));
        let text = tmpl.render(&msgs, true, self.enable_thinking).map_err(EngineError::Template)?;
        tok.encode(&text).map_err(EngineError::Tokenizer)
    }

    pub fn push(&mut self, user: &str, assistant: &str) {
        self.messages.push(Message::new("user", user));
        self.messages.push(Message::new("assistant", assistant));
    }
}
