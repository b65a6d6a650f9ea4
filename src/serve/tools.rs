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
//! GLM-4.5's and 4.6's with the name and key/value pairs:
//! ```text
//! <tool_call>NAME
//! <arg_key>KEY</arg_key>
//! <arg_value>VALUE</arg_value>
//! </tool_call>
//! ```
//! DeepSeek-V3/V3.1 and Kimi-K2 mark calls with special tokens (`engine::call_syntax`) around a
//! name and JSON arguments. Each complete call becomes one of OpenAI's `tool_calls`, the text
//! around them stays content, a section's markers around a run of calls are dropped. XML and
//! GLM values take the type the request's tool schema gives the parameter (a number, a boolean,
//! an object), as a string otherwise. Streamed: text that may be the start of a marker is held
//! back, and a call is sent whole once it closes.

use std::sync::Arc;

use serde_json::Value;

use super::text::held_back;
use crate::engine::call_syntax::{CallSyntax, Markers, TAGGED};

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

#[derive(Debug)]
pub struct ToolSplitter {
    syntax: CallSyntax,
    markers: Markers,
    /// What text may be the start of: the call's opening and the section markers.
    starts: Vec<&'static str>,
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
    /// A splitter of `syntax`'s calls (harmony's are engine/harmony.rs's: `<tool_call>` blocks
    /// here), whose XML and GLM values take their types from `tools` (a request's array).
    pub fn new(syntax: CallSyntax, tools: Option<Arc<Value>>) -> ToolSplitter {
        let markers = syntax.markers().unwrap_or(TAGGED);
        let starts = std::iter::once(markers.open).chain(markers.section.iter().copied()).collect();
        let (buf, inside, space, calls) = (String::new(), false, String::new(), 0);
        ToolSplitter { syntax, markers, starts, tools, buf, inside, space, calls }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let Markers { open, close, section, .. } = self.markers;
        let mut out = Vec::new();
        loop {
            if self.inside {
                let Some(end) = self.buf.find(close) else { break };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + close.len());
                self.inside = false;
                match parse_call(self.syntax, &body, self.tools.as_deref()) {
                    Some(c) => {
                        self.space.clear();
                        self.calls += 1;
                        out.push(Piece::Call(c));
                    }
                    // not a call after all: the block as the model wrote it
                    None => self.text(&format!("{open}{body}{close}"), &mut out),
                }
                continue;
            }
            // text up to the next call (or up to what may start a marker), its section
            // markers dropped; a marker inside a call's body is the body's
            let at = self.buf.find(open);
            let end = at.unwrap_or_else(|| self.buf.len() - held_back(&self.buf, &self.starts));
            let mut before: String = self.buf.drain(..end).collect();
            for m in section {
                before = before.replace(m, "");
            }
            self.text(&before, &mut out);
            if at.is_none() {
                break;
            }
            self.buf.drain(..open.len());
            self.inside = true;
        }
        out
    }

    /// At the end: an unclosed block or a held `<tool` goes out as text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        let rest = match self.inside {
            true => format!("{}{rest}", self.markers.open),
            // a section's last marker may have been held back whole
            false => self.markers.section.iter().fold(rest, |r, m| r.replace(m, "")),
        };
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

/// A call's body, between its markers, in `syntax`.
fn parse_call(syntax: CallSyntax, body: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let body = body.trim();
    match syntax {
        CallSyntax::DeepSeek => parse_deepseek_call(body),
        CallSyntax::Kimi => parse_kimi_call(body),
        _ if body.starts_with(FUNCTION) => parse_xml_call(body, tools),
        _ if body.starts_with('{') => parse_json_call(body),
        _ => parse_glm_call(body, tools),
    }
}

/// `{"name": "f", "arguments": {...}}` (arguments may also be a JSON string).
fn parse_json_call(body: &str) -> Option<ToolCall> {
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

/// GLM's `NAME (<arg_key>KEY</arg_key> <arg_value>VALUE</arg_value>)*`: the arguments as a
/// JSON object in the model's order (the template prints a string value as it is, any other
/// as JSON).
fn parse_glm_call(body: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let (name, mut rest) = body.split_once(ARG_KEY).map_or((body, ""), |(n, r)| (n, r));
    let name = name.trim();
    // a bare word is a call only if a tool has that name (else any `<tool_call>x</tool_call>` is)
    let declared = param_tool(tools, name).is_some();
    if name.is_empty() || name.contains(['<', '>', '{', '\n']) || (rest.is_empty() && !declared) {
        return None;
    }
    let mut args = serde_json::Map::new();
    while !rest.is_empty() {
        let (key, r) = rest.split_once(END_ARG_KEY)?;
        let r = r.trim_start().strip_prefix(ARG_VALUE)?;
        let (value, r) = r.split_once(END_ARG_VALUE)?;
        let key = key.trim();
        args.insert(key.to_string(), typed(value, param_type(tools, name, key)));
        rest = r.trim_start();
        if !rest.is_empty() {
            rest = rest.strip_prefix(ARG_KEY)?;
        }
    }
    Some(ToolCall { name: name.to_string(), arguments: Value::Object(args).to_string() })
}

const ARG_KEY: &str = "<arg_key>";
const END_ARG_KEY: &str = "</arg_key>";
const ARG_VALUE: &str = "<arg_value>";
const END_ARG_VALUE: &str = "</arg_value>";

/// DeepSeek-V3.1's `NAME<｜tool▁sep｜>JSON`, or V3's `function<｜tool▁sep｜>NAME` then the JSON
/// in a json code fence.
fn parse_deepseek_call(body: &str) -> Option<ToolCall> {
    let (head, rest) = body.split_once(crate::engine::call_syntax::DEEPSEEK.inner[0])?;
    let (name, json) = match rest.split_once("```json") {
        Some((name, fenced)) if head.trim() == "function" => (name, fenced.trim_end().strip_suffix("```")?),
        _ => (head, rest),
    };
    json_call(name, json)
}

/// Kimi-K2's `functions.NAME:INDEX<|tool_call_argument_begin|>JSON` (the id's `functions.` and
/// `:INDEX` are Kimi's numbering, not the name).
fn parse_kimi_call(body: &str) -> Option<ToolCall> {
    let (id, json) = body.split_once(crate::engine::call_syntax::KIMI.inner[0])?;
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = id.rsplit_once(':').filter(|(_, i)| i.parse::<u32>().is_ok()).map_or(id, |(n, _)| n);
    json_call(name, json)
}

/// A call of `name` with JSON `arguments` (an object; a model's empty arguments are `{}`).
fn json_call(name: &str, arguments: &str) -> Option<ToolCall> {
    let name = name.trim();
    let arguments = arguments.trim();
    let arguments = if arguments.is_empty() { "{}" } else { arguments };
    let valid = serde_json::from_str::<Value>(arguments).is_ok_and(|v| v.is_object());
    (valid && !name.is_empty() && !name.contains(['<', '\n']))
        .then(|| ToolCall { name: name.to_string(), arguments: arguments.to_string() })
}

/// The JSON-schema type(s) the request's tool `function` gives parameter `key`.
fn param_type<'t>(tools: Option<&'t Value>, function: &str, key: &str) -> Vec<&'t str> {
    match param_tool(tools, function)
        .and_then(|f| f.pointer(&format!("/parameters/properties/{}/type", key.replace('~', "~0").replace('/', "~1"))))
    {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// The request's tool `function` (its `function` object).
fn param_tool<'t>(tools: Option<&'t Value>, function: &str) -> Option<&'t Value> {
    tools.and_then(Value::as_array).and_then(|ts| {
        ts.iter()
            .map(|t| t.get("function").unwrap_or(t))
            .find(|f| f.get("name").and_then(Value::as_str) == Some(function))
    })
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
pub fn split_reply(
    syntax: CallSyntax,
    prefill: Option<&str>,
    text: &str,
    tools: Option<Arc<Value>>,
) -> (Option<String>, Vec<ToolCall>) {
    let mut sp = ToolSplitter::new(syntax, tools);
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
        let (content, calls) = split_reply(CallSyntax::Tagged, None, REPLY, None);
        assert_eq!(content.as_deref(), Some("Let me check é."));
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", r#"{"city":"Paris"}"#));
        assert_eq!(calls[1].arguments, "{}");
        let (content, calls) = split_reply(CallSyntax::Tagged, None, &REPLY[REPLY.find("<tool").unwrap()..], None);
        assert_eq!((content, calls.len()), (None, 2));
        // not JSON: stays text; unclosed: stays text
        assert_eq!(
            split_reply(CallSyntax::Tagged, None, "<tool_call>oops</tool_call>", None).0.as_deref(),
            Some("<tool_call>oops</tool_call>")
        );
        assert_eq!(
            split_reply(CallSyntax::Tagged, None, "a <tool_call>{\"na", None).0.as_deref(),
            Some("a <tool_call>{\"na")
        );
        assert_eq!(split_reply(CallSyntax::Tagged, None, "x < y", None).0.as_deref(), Some("x < y"));
        // a prefilled call counts, the prefill's text does not come back
        let (content, calls) =
            split_reply(CallSyntax::Tagged, Some("ok <tool_call>{\"name\": \"f\"}</tool_call>"), "\nbye", None);
        assert_eq!((content.as_deref(), calls.len()), (Some("bye"), 1));
    }

    #[test]
    fn streamed_in_any_pieces_gives_the_same() {
        let whole = {
            let mut sp = ToolSplitter::new(CallSyntax::Tagged, None);
            let mut p = sp.push(REPLY);
            p.extend(sp.finish());
            p
        };
        assert_eq!(
            whole,
            [Piece::Text("Let me check é.".into()), call("get_weather", r#"{"city":"Paris"}"#), call("now", "{}")]
        );
        for n in 1..12 {
            let mut sp = ToolSplitter::new(CallSyntax::Tagged, None);
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
        let (content, calls) = split_reply(CallSyntax::Tagged, None, XML, schema());
        assert_eq!(content.as_deref(), Some("Checking é."));
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "edit");
        // the model's order; typed by the schema (a string id stays a string), JSON without one
        let want = r#"{"path": "src/é.rs", "line": 42, "dry": true, "text": "fn a() {}\n\nfn b() {}", "opts": {"x":[1,2]}, "id": "7"}"#;
        assert_eq!(calls[0].arguments, want);
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args["text"], "fn a() {}\n\nfn b() {}");
        // no schema: what reads as JSON is JSON
        let none = split_reply(CallSyntax::Tagged, None, XML, None).1;
        assert!(none[0].arguments.contains(r#""id": 7"#) && none[0].arguments.contains(r#""dry": "True""#));
        // a missing </parameter> ends at the next tag; a call without </function> stays text
        let open = "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\nx\n</function>\n</tool_call>";
        assert_eq!(split_reply(CallSyntax::Tagged, None, open, None).1[0].arguments, r#"{"a": 1, "b": "x"}"#);
        let bad = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>";
        assert_eq!(split_reply(CallSyntax::Tagged, None, bad, None), (Some(bad.to_string()), vec![]));
    }

    /// `text` cut in three at every pair of character boundaries (the second every third one)
    /// and streamed through a splitter gives `split_reply`'s content and calls.
    fn cut_everywhere_gives_the_whole(syntax: CallSyntax, text: &str, tools: Option<Arc<Value>>) {
        let want = split_reply(syntax, None, text, tools.clone());
        let at: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for (k, &i) in at.iter().enumerate() {
            for &j in at[k..].iter().step_by(3) {
                let mut sp = ToolSplitter::new(syntax, tools.clone());
                let mut got: Vec<Piece> =
                    [&text[..i], &text[i..j], &text[j..]].iter().flat_map(|p| sp.push(p)).collect();
                got.extend(sp.finish());
                let content: String =
                    got.iter().filter_map(|p| if let Piece::Text(t) = p { Some(t.as_str()) } else { None }).collect();
                let calls: Vec<ToolCall> =
                    got.into_iter().filter_map(|p| if let Piece::Call(c) = p { Some(c) } else { None }).collect();
                assert_eq!((Some(content), calls), want, "{syntax:?} cut at {i} and {j}");
            }
        }
    }

    #[test]
    fn xml_calls_cut_at_every_byte_offset_give_the_same() {
        cut_everywhere_gives_the_whole(CallSyntax::Tagged, XML, schema());
    }

    /// A reply as each family's template prints an assistant turn with two calls (rendered
    /// by the template itself, which tests/family_chat.rs shows renders as transformers'), and
    /// the calls it holds.
    fn rendered_turn(file: &str) -> (String, Vec<ToolCall>, Option<Arc<Value>>) {
        use crate::engine::chat_template::{ChatTemplate, TemplateArgs};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        let source = std::fs::read_to_string(dir.join(file)).expect(file);
        let t = ChatTemplate::new(&source, None, Some("<EOS>".into())).expect(file);
        let args = [serde_json::json!({"city": "Zürich", "days": 3, "hourly": true}), serde_json::json!({})];
        let calls: Vec<Value> = ["get_weather", "now"]
            .iter()
            .zip(&args)
            .map(|(n, a)| serde_json::json!({"type": "function", "function": {"name": n, "arguments": a}}))
            .collect();
        let messages = serde_json::json!([{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Checking é.", "tool_calls": calls}]);
        let props =
            serde_json::json!({"city": {"type": "string"}, "days": {"type": "integer"}, "hourly": {"type": "boolean"}});
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"properties": props}}},
            {"type": "function", "function": {"name": "now", "parameters": {"properties": {}}}}]);
        let text = t.render_json(&messages, Some(&tools), false, &TemplateArgs::default()).expect(file);
        // the assistant's turn, without the end-of-turn markup that stops a reply
        let turn = &text[text.rfind("Checking é.").expect("content")..];
        let turn =
            ["<EOS>", "<|im_end|>", "<｜end▁of▁sentence｜>"].iter().fold(turn, |t, e| t.trim_end().trim_end_matches(e));
        let want =
            args.iter().zip(["get_weather", "now"]).map(|(a, n)| ToolCall { name: n.into(), arguments: a.to_string() });
        (turn.to_string(), want.collect(), Some(Arc::new(tools)))
    }

    /// The calls' arguments as JSON values (a parser may space them otherwise).
    fn parsed(calls: &[ToolCall]) -> Vec<(String, Value)> {
        calls.iter().map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).expect("JSON arguments"))).collect()
    }

    #[test]
    fn glm_deepseek_and_kimi_calls_as_their_templates_print_them_are_parsed_whole_and_cut_anywhere() {
        let files = [
            ("GLM-4.6.jinja", CallSyntax::Tagged),
            ("deepseek-ai-DeepSeek-V3.1.jinja", CallSyntax::DeepSeek),
            ("moonshotai-Kimi-K2.jinja", CallSyntax::Kimi),
        ];
        for (file, syntax) in files {
            let (turn, want, tools) = rendered_turn(file);
            let (content, calls) = split_reply(syntax, None, &turn, tools.clone());
            assert_eq!(content.as_deref(), Some("Checking é."), "{file}: {turn:?}");
            assert_eq!(parsed(&calls), parsed(&want), "{file}: {turn:?}");
            cut_everywhere_gives_the_whole(syntax, &turn, tools);
        }
    }

    #[test]
    fn deepseek_v3s_fenced_calls_kimis_ids_and_broken_calls() {
        let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let (content, calls) = split_reply(CallSyntax::DeepSeek, None, v3, None);
        assert_eq!(
            (content, parsed(&calls)),
            (None, vec![("get_weather".into(), serde_json::json!({"city": "Oslo"}))])
        );
        // a name with a colon of its own keeps it; no index, no prefix
        let kimi = "<|tool_calls_section_begin|><|tool_call_begin|>a:b<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
        assert_eq!(split_reply(CallSyntax::Kimi, None, kimi, None).1[0].name, "a:b");
        // arguments that are not a JSON object, or no separator: the text as written
        for bad in [
            "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": <｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>f {}<｜tool▁call▁end｜>",
        ] {
            assert_eq!(split_reply(CallSyntax::DeepSeek, None, bad, None), (Some(bad.to_string()), vec![]));
        }
        // GLM: a bare word is a call only when a tool has that name
        let tools = Some(Arc::new(serde_json::json!([{"type": "function", "function": {"name": "now"}}])));
        assert_eq!(split_reply(CallSyntax::Tagged, None, "<tool_call>now\n</tool_call>", tools).1.len(), 1);
        let bare = "<tool_call>oops</tool_call>";
        assert_eq!(split_reply(CallSyntax::Tagged, None, bare, None), (Some(bare.to_string()), vec![]));
    }
}
