//! The model's Jinja chat template, rendered with minijinja configured like transformers'
//! `apply_chat_template`: trim_blocks + lstrip_blocks, Python string methods, loop controls,
//! `raise_exception`, and a `tojson` that prints like Python's `json.dumps(ensure_ascii=False)`.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into() }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string()).map_err(|e| format!("chat template: {e}"))?;
        Ok(ChatTemplate { env, bos_token, eos_token })
    }

    /// The prompt text for `messages`; `enable_thinking` is passed only when given (the Qwen3
    /// template treats "undefined" and `true` alike).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, String> {
        let messages = serde_json::to_value(messages).map_err(|e| e.to_string())?;
        self.render_json(&messages, None, add_generation_prompt, enable_thinking)
    }

    /// [`render`](Self::render) for messages as OpenAI's API gives them (any fields: an
    /// assistant's `tool_calls`, a tool reply's `tool_call_id`), and the request's `tools`
    /// (passed only when given: templates test `if tools`).
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut ctx = minijinja::context! {
            messages => minijinja::value::Serde(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        if let Some(t) = enable_thinking {
            ctx = minijinja::context! { enable_thinking => t, ..ctx };
        }
        if let Some(t) = tools {
            ctx = minijinja::context! { tools => minijinja::value::Serde(t), ..ctx };
        }
        tmpl.render(ctx).map_err(|e| format!("chat template: {e}"))
    }
}

/// `x | tojson` / `x | tojson(indent=2)`, printed as Python's `json.dumps(x, ensure_ascii=False)`
/// does: `", "` and `": "` separators, keys in insertion order, no HTML escaping.
fn tojson(v: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let j = serde_json::to_value(&v).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_py_json(&j, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_py_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let nl = |out: &mut String, d: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * d));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                nl(out, depth + 1);
                write_py_json(x, indent, depth + 1, out);
            }
            nl(out, depth);
            out.push(']');
        }
        J::Object(o) if !o.is_empty() => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                nl(out, depth + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                write_py_json(x, indent, depth + 1, out);
            }
            nl(out, depth);
            out.push('}');
        }
        other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_prints_like_python() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", None, None).unwrap();
        let tmpl = t.env.get_template("chat").unwrap();
        let x: serde_json::Value = serde_json::from_str(r#"{"b": [1, "<é>"], "a": {}}"#).unwrap();
        let s = tmpl.render(minijinja::context! { x => minijinja::value::Serde(&x) }).unwrap();
        assert_eq!(s, "{\"b\": [1, \"<é>\"], \"a\": {}}|{\n  \"b\": [\n    1,\n    \"<é>\"\n  ],\n  \"a\": {}\n}");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('nope') }}", None, None).unwrap();
        let e = t.render(&[], false, None).unwrap_err();
        assert!(e.contains("nope"), "{e}");
    }
}
