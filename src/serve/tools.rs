//! Tool calls in a reply: Qwen's templates ask the model for `<tool_call>` blocks, Qwen3's with
//! JSON in them (`{"name": ..., "arguments": {...}}`), Qwen3.5's, Qwen3.6's and Qwen3-Coder's
//! with XML function calls:
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE (any text, several lines; objects and lists as JSON)
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//! Each complete block becomes one of OpenAI's `tool_calls`, the text around them stays content.
//! An XML call's values take the type the request's tool schema gives the parameter (a number,
//! a boolean, an object), as a string otherwise. Streamed: text that may be the start of a block
//! is held back, and a block is sent whole once it closes.

use std::sync::Arc;

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
    /// The request's `tools` (their parameters' types).
    tools: Option<Arc<Value>>,
    buf: String,
    inside: bool,
    /// Whitespace between blocks, sent only if text follows it (a model puts newlines between
    /// and after its calls).
    space: String,
    pub calls: usize,
}

impl ToolSplitter {
    /// A splitter whose XML calls take their values' types from `tools` (a request's array).
    pub fn new(tools: Option<Arc<Value>>) -> ToolSplitter {
        ToolSplitter { tools, ..ToolSplitter::default() }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.inside {
                let Some(end) = self.buf.find(CLOSE) else { break };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.inside = false;
                match parse_call(&body, self.tools.as_deref()) {
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

/// A block's body: `{"name": "f", "arguments": {...}}` (arguments may also be a JSON string), or
/// an XML function call.
fn parse_call(body: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let body = body.trim();
    if body.starts_with(FUNCTION) {
        return parse_xml_call(body, tools);
    }
    let v: Value = serde_json::from_str(body).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some(ToolCall { name, arguments })
}

const FUNCTION: &str = "<function=";
const PARAMETER: &str = "<parameter=";
const END_PARAMETER: &str = "</parameter>";
const END_FUNCTION: &str = "</function>";

/// `<function=NAME> (<parameter=KEY>\nVALUE\n</parameter>)* </function>`: the arguments as a
/// JSON object in the model's order. A value ends at its `</parameter>`, or where the next
/// parameter or the function's end begins (a model that left the tag out); the newline the
/// template puts on each side of it is not part of it.
fn parse_xml_call(body: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let rest = body.strip_prefix(FUNCTION)?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim();
    let inner_end = rest.rfind(END_FUNCTION)?;
    if !rest[inner_end + END_FUNCTION.len()..].trim().is_empty() || name.is_empty() || name.contains('<') {
        return None;
    }
    rest = &rest[..inner_end];
    let mut args = String::from("{");
    loop {
        let r = rest.trim_start();
        if r.is_empty() {
            break;
        }
        let r = r.strip_prefix(PARAMETER)?;
        let (key, r) = r.split_once('>')?;
        let end = [END_PARAMETER, PARAMETER].iter().filter_map(|t| r.find(t)).min().unwrap_or(r.len());
        let value = r[..end].strip_prefix('\n').unwrap_or(&r[..end]);
        let value = value.strip_suffix('\n').unwrap_or(value);
        rest = r[end..].strip_prefix(END_PARAMETER).unwrap_or(&r[end..]);
        if args.len() > 1 {
            args.push_str(", ");
        }
        let key = key.trim();
        args.push_str(&Value::String(key.to_string()).to_string());
        args.push_str(": ");
        args.push_str(&typed(value, param_type(tools, name, key)).to_string());
    }
    args.push('}');
    Some(ToolCall { name: name.to_string(), arguments: args })
}

/// The JSON-schema type(s) the request's tool `function` gives parameter `key`.
fn param_type<'t>(tools: Option<&'t Value>, function: &str, key: &str) -> Vec<&'t str> {
    let f = tools.and_then(Value::as_array).and_then(|ts| {
        ts.iter()
            .map(|t| t.get("function").unwrap_or(t))
            .find(|f| f.get("name").and_then(Value::as_str) == Some(function))
    });
    match f
        .and_then(|f| f.pointer(&format!("/parameters/properties/{}/type", key.replace('~', "~0").replace('/', "~1"))))
    {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// An XML call's value as its schema types allow: the first that reads it (a string last, as
/// it always does); without a schema, JSON where it reads as an object, a list, a number, a
/// boolean or null, else the text.
fn typed(value: &str, types: Vec<&str>) -> Value {
    let json = || serde_json::from_str::<Value>(value.trim()).ok();
    let fits = |t: &str, v: &Value| match t {
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        _ => false,
    };
    if types.is_empty() {
        return json().unwrap_or_else(|| Value::String(value.to_string()));
    }
    for t in types.iter().filter(|t| **t != "string") {
        // Jinja's `string` of a boolean is Python's spelling
        let v = match (*t, value.trim()) {
            ("boolean", "True") => Some(Value::Bool(true)),
            ("boolean", "False") => Some(Value::Bool(false)),
            ("null", "None") => Some(Value::Null),
            _ => json(),
        };
        if let Some(v) = v.filter(|v| fits(t, v)) {
            return v;
        }
    }
    Value::String(value.to_string())
}

/// The whole reply at once: its content (None when only calls and whitespace) and calls. A
/// `prefill` the reply continues (a trailing assistant message) counts for its calls only: its
/// text is the client's own.
pub fn split_reply(prefill: Option<&str>, text: &str, tools: Option<Arc<Value>>) -> (Option<String>, Vec<ToolCall>) {
    let mut sp = ToolSplitter::new(tools);
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
        let (content, calls) = split_reply(None, REPLY, None);
        assert_eq!(content.as_deref(), Some("Let me check é."));
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", r#"{"city":"Paris"}"#));
        assert_eq!(calls[1].arguments, "{}");
        let (content, calls) = split_reply(None, &REPLY[REPLY.find("<tool").unwrap()..], None);
        assert_eq!((content, calls.len()), (None, 2));
        // not JSON: stays text; unclosed: stays text
        assert_eq!(
            split_reply(None, "<tool_call>oops</tool_call>", None).0.as_deref(),
            Some("<tool_call>oops</tool_call>")
        );
        assert_eq!(split_reply(None, "a <tool_call>{\"na", None).0.as_deref(), Some("a <tool_call>{\"na"));
        assert_eq!(split_reply(None, "x < y", None).0.as_deref(), Some("x < y"));
        // a prefilled call counts, the prefill's text does not come back
        let (content, calls) = split_reply(Some("ok <tool_call>{\"name\": \"f\"}</tool_call>"), "\nbye", None);
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

    /// Qwen3.5's / Qwen3-Coder's XML call, with a schema for some of its parameters.
    const XML: &str = "Checking é.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/é.rs\n</parameter>\n<parameter=line>\n42\n</parameter>\n<parameter=dry>\nTrue\n</parameter>\n<parameter=text>\nfn a() {}\n\nfn b() {}\n</parameter>\n<parameter=opts>\n{\"x\": [1, 2]}\n</parameter>\n<parameter=id>\n7\n</parameter>\n</function>\n</tool_call>";

    fn schema() -> Option<Arc<Value>> {
        let props = serde_json::json!({"path": {"type": "string"}, "line": {"type": "integer"},
            "dry": {"type": "boolean"}, "text": {"type": "string"}, "id": {"type": ["string", "null"]}});
        Some(Arc::new(
            serde_json::json!([{"type": "function", "function": {"name": "edit", "parameters": {"properties": props}}}]),
        ))
    }

    #[test]
    fn xml_calls_take_their_schemas_types() {
        let (content, calls) = split_reply(None, XML, schema());
        assert_eq!(content.as_deref(), Some("Checking é."));
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "edit");
        // the model's order; typed by the schema (a string id stays a string), JSON without one
        let want = r#"{"path": "src/é.rs", "line": 42, "dry": true, "text": "fn a() {}\n\nfn b() {}", "opts": {"x":[1,2]}, "id": "7"}"#;
        assert_eq!(calls[0].arguments, want);
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args["text"], "fn a() {}\n\nfn b() {}");
        // no schema: what reads as JSON is JSON
        let none = split_reply(None, XML, None).1;
        assert!(none[0].arguments.contains(r#""id": 7"#) && none[0].arguments.contains(r#""dry": "True""#));
        // a missing </parameter> ends at the next tag; a call without </function> stays text
        let open = "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\nx\n</function>\n</tool_call>";
        assert_eq!(split_reply(None, open, None).1[0].arguments, r#"{"a": 1, "b": "x"}"#);
        let bad = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>";
        assert_eq!(split_reply(None, bad, None), (Some(bad.to_string()), vec![]));
    }

    #[test]
    fn xml_calls_cut_at_every_byte_offset_give_the_same() {
        let want = split_reply(None, XML, schema());
        let at: Vec<usize> = (0..=XML.len()).filter(|&i| XML.is_char_boundary(i)).collect();
        for (k, &i) in at.iter().enumerate() {
            for &j in at[k..].iter().step_by(3) {
                let mut sp = ToolSplitter::new(schema());
                let mut got: Vec<Piece> = [&XML[..i], &XML[i..j], &XML[j..]].iter().flat_map(|p| sp.push(p)).collect();
                got.extend(sp.finish());
                let text: String =
                    got.iter().filter_map(|p| if let Piece::Text(t) = p { Some(t.as_str()) } else { None }).collect();
                let calls: Vec<ToolCall> =
                    got.into_iter().filter_map(|p| if let Piece::Call(c) = p { Some(c) } else { None }).collect();
                assert_eq!((Some(text), calls), want, "cut at {i} and {j}");
            }
        }
    }
}
