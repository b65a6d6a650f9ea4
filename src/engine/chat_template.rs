//! The model's Jinja chat template, rendered with minijinja configured like transformers'
//! `apply_chat_template`: trim_blocks + lstrip_blocks, Python string methods, loop controls,
//! `raise_exception`, and a `tojson` that prints like Python's `json.dumps(ensure_ascii=False)`.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use super::call_syntax::CallSyntax;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

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

/// What the caller passes to the template besides the messages and tools, as transformers'
/// `apply_chat_template(**kwargs)` and llama-server's `chat_template_kwargs` do. Each is passed
/// only when set (templates test `is defined`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateArgs {
    /// Qwen3's switch (its template treats "undefined" and `true` alike).
    pub enable_thinking: Option<bool>,
    /// gpt-oss's `reasoning_effort`: low, medium or high (see [`reasoning_effort`]).
    pub reasoning_effort: Option<String>,
    /// Anything else a request names (`model_identity`, `builtin_tools`, ...); the two above
    /// win over the same keys here.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl TemplateArgs {
    pub fn thinking(enable_thinking: Option<bool>) -> TemplateArgs {
        TemplateArgs { enable_thinking, ..TemplateArgs::default() }
    }
}

/// The reasoning efforts gpt-oss was trained with.
pub const REASONING_EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// `v` as a reasoning effort, or an error that names the choices.
/// Whether a rendered prompt ends inside an open reasoning block (`<think>` last, trailing
/// whitespace aside): a template that opens the block in its generation prompt (GLM-4.5's and
/// DeepSeek-R1's thinking modes, Qwen3's thinking-only models), so the reply begins inside it.
pub fn opens_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with("<think>")
}

pub fn reasoning_effort(v: &str) -> Result<String, String> {
    let l = v.trim().to_ascii_lowercase();
    REASONING_EFFORTS
        .contains(&l.as_str())
        .then_some(l)
        .ok_or_else(|| format!("reasoning effort '{v}' is not one of low, medium, high"))
}

/// The effort a system prompt asks for the way OpenAI's guide for gpt-oss says to
/// (`Reasoning: high`, any case), if it does.
pub fn effort_in_system_prompt(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    lower.match_indices("reasoning:").find_map(|(at, m)| {
        let rest = lower[at + m.len()..].trim_start();
        REASONING_EFFORTS
            .iter()
            .find(|e| rest.starts_with(*e) && !rest[e.len()..].starts_with(|c: char| c.is_alphanumeric()))
            .map(|e| e.to_string())
    })
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The clock `strftime_now` reads: 0 is the system's (UTC), else seconds since the epoch
    /// (tests pin it to compare renders with transformers').
    now: Arc<AtomicI64>,
    /// The template reads `reasoning_effort` (gpt-oss's harmony format).
    reads_effort: bool,
    /// The template prints tool calls' `arguments` with `tojson` and never tests whether they
    /// are a string (gpt-oss's): OpenAI's JSON-text arguments are given to it parsed, as
    /// transformers' callers pass them (llama.cpp does the same for such templates).
    object_arguments: bool,
    calls: CallSyntax,
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
        let now = Arc::new(AtomicI64::new(0));
        let clock = now.clone();
        env.add_function("strftime_now", move |fmt: String| -> Result<Value, Error> {
            let pinned = clock.load(Ordering::Relaxed);
            let secs = if pinned != 0 {
                pinned
            } else {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
            };
            Ok(Value::from(strftime(secs, &fmt)))
        });
        env.add_template_owned("chat", source.to_string()).map_err(|e| format!("chat template: {e}"))?;
        let reads_effort = source.contains("reasoning_effort");
        let object_arguments = source.contains("arguments|tojson") && !source.contains("arguments is string");
        let calls = CallSyntax::of(source);
        let mut t = ChatTemplate { env, bos_token, eos_token, now, reads_effort, object_arguments, calls };
        t.object_arguments |= t.needs_object_arguments();
        Ok(t)
    }

    /// The template fails on a call whose arguments are JSON text (GLM-4.5's raises unless they
    /// are a mapping, Qwen3-Coder's iterates their items) and renders them as an object: it is
    /// given OpenAI's JSON-text arguments parsed (llama.cpp probes templates the same way).
    fn needs_object_arguments(&self) -> bool {
        let probe = |arguments: serde_json::Value| {
            let call = serde_json::json!({"type": "function", "function": {"name": "probe", "arguments": arguments}});
            let messages = serde_json::json!([{"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [call]}]);
            let tools = serde_json::json!([{"type": "function", "function": {"name": "probe", "parameters": {}}}]);
            self.render_json(&messages, Some(&tools), false, &TemplateArgs::default())
        };
        probe(r#"{"a": 1}"#.into()).is_err() && probe(serde_json::json!({"a": 1})).is_ok()
    }

    /// A harmony template (gpt-oss): the model answers in channels (`engine::harmony`).
    pub fn harmony(&self) -> bool {
        self.calls == CallSyntax::Harmony
    }

    /// How the model writes tool calls.
    pub fn call_syntax(&self) -> CallSyntax {
        self.calls
    }

    /// Pin the clock `strftime_now` reads to `secs` since the epoch (None: the system's).
    pub fn pin_clock(&self, secs: Option<i64>) {
        self.now.store(secs.unwrap_or(0), Ordering::Relaxed);
    }

    /// The prompt text for `messages`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        args: &TemplateArgs,
    ) -> Result<String, String> {
        let messages = serde_json::to_value(messages).map_err(|e| e.to_string())?;
        self.render_json(&messages, None, add_generation_prompt, args)
    }

    /// [`render`](Self::render) for messages as OpenAI's API gives them (any fields: an
    /// assistant's `tool_calls`, a tool reply's `tool_call_id`), and the request's `tools`
    /// (passed only when given: templates test `if tools`). As transformers does, a message's
    /// reasoning (`reasoning_content`, `thinking` or `reasoning`) is given under both
    /// `thinking` (gpt-oss's template reads it) and `reasoning_content`. A template that reads
    /// `reasoning_effort` gets the one a system prompt asks for when `args` sets none.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        args: &TemplateArgs,
    ) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut ctx = args.extra.clone();
        let mut put = |k: &str, v: serde_json::Value| {
            ctx.insert(k.to_string(), v);
        };
        put("messages", alias_reasoning(messages, self.object_arguments));
        put("add_generation_prompt", add_generation_prompt.into());
        put("bos_token", self.bos_token.clone().unwrap_or_default().into());
        put("eos_token", self.eos_token.clone().unwrap_or_default().into());
        if let Some(t) = args.enable_thinking {
            put("enable_thinking", t.into());
        }
        let effort = args.reasoning_effort.clone().or_else(|| {
            let first = messages.get(0).filter(|m| matches!(m["role"].as_str(), Some("system" | "developer")));
            self.reads_effort.then(|| first.and_then(|m| m["content"].as_str()).and_then(effort_in_system_prompt))?
        });
        if let Some(e) = effort {
            put("reasoning_effort", e.into());
        }
        if let Some(t) = tools {
            put("tools", t.clone());
        }
        tmpl.render(minijinja::value::Serde(&ctx)).map_err(|e| format!("chat template: {e}"))
    }
}

/// The messages with each one's reasoning under `thinking` and `reasoning_content` both, keys
/// ordered as transformers' `{"thinking": r, **message, "reasoning_content": r}` leaves them
/// (and, with `object_arguments`, tool calls' JSON-text arguments parsed).
fn alias_reasoning(messages: &serde_json::Value, object_arguments: bool) -> serde_json::Value {
    let Some(list) = messages.as_array() else { return messages.clone() };
    let aliased = list.iter().map(|m| {
        let mut m = m.clone();
        if object_arguments && let Some(calls) = m.get_mut("tool_calls").and_then(|c| c.as_array_mut()) {
            for c in calls {
                let f = if c.get("function").is_some() { &mut c["function"] } else { c };
                let parsed = f["arguments"].as_str().and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok());
                if let Some(p) = parsed.filter(|p| p.is_object()) {
                    f["arguments"] = p;
                }
            }
        }
        let Some(obj) = m.as_object() else { return m };
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| obj.get(*k).filter(|v| !v.is_null()))
            .cloned();
        let Some(r) = reasoning else { return m };
        let mut out = serde_json::Map::new();
        out.insert("thinking".into(), r.clone());
        for (k, v) in obj {
            out.insert(k.clone(), v.clone());
        }
        out.insert("reasoning_content".into(), r);
        serde_json::Value::Object(out)
    });
    serde_json::Value::Array(aliased.collect())
}

/// `secs` (UTC) formatted as C's strftime does for the directives chat templates use: `%Y %m
/// %d %e %H %M %S %j %B %b %A %a %y %%`; other directives are kept as written.
fn strftime(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let t = crate::sysinfo::UtcTime::from_unix(secs.max(0) as u64);
    let (y, m, d) = (t.year, t.month, t.day);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[m as usize - 1] + d + u32::from(leap && m > 2);
    let weekday = (secs.max(0) / 86_400 % 7) as usize; // 1970-01-01 was a Thursday
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out += &y.to_string(),
            Some('y') => out += &format!("{:02}", y.rem_euclid(100)),
            Some('m') => out += &format!("{m:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('e') => out += &format!("{d:2}"),
            Some('j') => out += &format!("{yday:03}"),
            Some('H') => out += &format!("{:02}", t.hour),
            Some('M') => out += &format!("{:02}", t.minute),
            Some('S') => out += &format!("{:02}", t.second),
            Some('B') => out += MONTHS[m as usize - 1],
            Some('b') => out += &MONTHS[m as usize - 1][..3],
            Some('A') => out += DAYS[weekday],
            Some('a') => out += &DAYS[weekday][..3],
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `x | tojson` with transformers' keyword arguments (`indent`, `ensure_ascii`, `sort_keys`),
/// printed as Python's `json.dumps(x, ensure_ascii=False)` does by default: `", "` and `": "`
/// separators, keys in insertion order, no HTML escaping.
fn tojson(v: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let style =
        PyJson { indent: kwargs.get("indent")?, sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false) };
    let ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let j = serde_json::to_value(&v).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_py_json(&j, style, 0, &mut out);
    if ascii {
        // past ASCII only inside strings: each UTF-16 unit as \uXXXX, as Python writes it
        out = out
            .chars()
            .flat_map(|c| {
                let mut units = [0u16; 2];
                let esc: Vec<String> = if c.is_ascii() {
                    vec![c.to_string()]
                } else {
                    c.encode_utf16(&mut units).iter().map(|u| format!("\\u{u:04x}")).collect()
                };
                esc
            })
            .collect();
    }
    Ok(Value::from_safe_string(out))
}

/// How `write_py_json` prints: Python's `indent` and `sort_keys`.
#[derive(Clone, Copy)]
struct PyJson {
    indent: Option<usize>,
    sort_keys: bool,
}

fn write_py_json(v: &serde_json::Value, style: PyJson, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let indent = style.indent;
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
                write_py_json(x, style, depth + 1, out);
            }
            nl(out, depth);
            out.push(']');
        }
        J::Object(o) if !o.is_empty() => {
            out.push('{');
            let mut items: Vec<(&String, &J)> = o.iter().collect();
            if style.sort_keys {
                items.sort_by(|a, b| a.0.cmp(b.0));
            }
            for (i, (k, x)) in items.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                nl(out, depth + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                write_py_json(x, style, depth + 1, out);
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
        // Python's json.dumps(x, ensure_ascii=True, sort_keys=True)
        let t = ChatTemplate::new("{{ x | tojson(ensure_ascii=true, sort_keys=true) }}", None, None).unwrap();
        let s = t.env.get_template("chat").unwrap().render(minijinja::context! { x => minijinja::value::Serde(&x) });
        assert_eq!(s.unwrap(), "{\"a\": {}, \"b\": [1, \"<\\u00e9>\"]}");
        let y: serde_json::Value = serde_json::from_str(r#"["😀"]"#).unwrap();
        let s = t.env.get_template("chat").unwrap().render(minijinja::context! { x => minijinja::value::Serde(&y) });
        assert_eq!(s.unwrap(), "[\"\\ud83d\\ude00\"]");
    }

    #[test]
    fn strftime_matches_cs_for_dates_around_leap_days() {
        // (seconds since the epoch, what Python's time.strftime gives in UTC)
        for (secs, want) in [
            (0, "1970-01-01 Thu Jan 001 00:00:00"),
            (951_782_400, "2000-02-29 Tue Feb 060 00:00:00"),
            (1_709_251_199, "2024-02-29 Thu Feb 060 23:59:59"),
            (1_796_428_800, "2026-12-05 Sat Dec 339 00:00:00"),
        ] {
            assert_eq!(strftime(secs, "%Y-%m-%d %a %b %j %H:%M:%S"), want, "{secs}");
        }
        assert_eq!(strftime(1_796_428_800, "%d %B %Y, %A %%"), "05 December 2026, Saturday %");
    }

    #[test]
    fn the_effort_a_system_prompt_asks_for() {
        assert_eq!(effort_in_system_prompt("Be brief.\nReasoning: HIGH").as_deref(), Some("high"));
        assert_eq!(effort_in_system_prompt("reasoning:low please").as_deref(), Some("low"));
        assert_eq!(effort_in_system_prompt("Reasoning: lowest"), None);
        assert_eq!(effort_in_system_prompt("No reasoning here"), None);
        assert!(reasoning_effort("Medium").is_ok() && reasoning_effort("max").is_err());
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('nope') }}", None, None).unwrap();
        let e = t.render(&[], false, &TemplateArgs::default()).unwrap_err();
        assert!(e.contains("nope"), "{e}");
    }
}
