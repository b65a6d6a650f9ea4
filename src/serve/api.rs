//! OpenAI request bodies -> what the engine runs: the prompt (chat messages for the template,
//! raw text, or token ids) and the generation parameters, every field checked with an error
//! that names it. Unknown fields are ignored, as OpenAI's clients send ones we have no use for
//! (`user`, `store`, `metadata`, `parallel_tool_calls`).

use crate::engine::chat_template::{TemplateArgs, reasoning_effort};
use serde_json::{Map, Value, json};

use crate::engine::sampler::{Adjustments, SamplerParams};

/// An error as OpenAI's API returns it: an HTTP status and `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<String>,
}

impl ApiError {
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            code: None,
            param: (!param.is_empty()).then(|| param.to_string()),
        }
    }

    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, code: None, param: None }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

type Res<T> = Result<T, ApiError>;

/// The server's defaults for what a request leaves out (`serve`'s sampling options).
#[derive(Debug, Clone)]
pub struct Defaults {
    pub sampler: SamplerParams,
    /// None: the request's seed, else a fresh one per request.
    pub seed: Option<u64>,
    pub max_tokens: Option<usize>,
    /// `enable_thinking`, `reasoning_effort` (`serve --no-think`, `--reasoning-effort`).
    pub template_args: TemplateArgs,
}

/// How a reply is generated.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    pub sampler: SamplerParams,
    pub adjust: Adjustments,
    /// None: until the end of sequence or the context is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Some(n): log-probabilities of each token and its n most likely alternatives.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// Stream `prompt_progress` chunks while the prompt is evaluated (llama-server's
    /// `return_progress`).
    pub return_progress: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Messages for the chat template (normalized: `content` a string, `developer` as `system`);
    /// `prefill` is a trailing assistant message the reply continues.
    Chat {
        messages: Value,
        tools: Option<Value>,
        args: Box<TemplateArgs>,
        prefill: Option<String>,
    },
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub prompt: Prompt,
    pub params: GenParams,
    pub stream: bool,
    pub include_usage: bool,
    /// A leading `<think>` block comes back as `reasoning_content` (llama-server's
    /// `reasoning_format` deepseek, the default; `none` keeps it in the content).
    pub reasoning: bool,
}

/// Fields of one JSON object, read with errors naming the field.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    fn num(&self, k: &str) -> Res<Option<f64>> {
        self.get(k)
            .map(|v| v.as_f64().ok_or_else(|| ApiError::invalid(k, format!("'{k}' must be a number"))))
            .transpose()
    }
    fn bool(&self, k: &str) -> Res<Option<bool>> {
        self.get(k)
            .map(|v| v.as_bool().ok_or_else(|| ApiError::invalid(k, format!("'{k}' must be a boolean"))))
            .transpose()
    }
    fn uint(&self, k: &str) -> Res<Option<u64>> {
        self.get(k)
            .map(|v| v.as_u64().ok_or_else(|| ApiError::invalid(k, format!("'{k}' must be a non-negative integer"))))
            .transpose()
    }
    fn in_range(&self, k: &str, lo: f64, hi: f64) -> Res<Option<f32>> {
        match self.num(k)? {
            Some(x) if !(lo..=hi).contains(&x) => {
                Err(ApiError::invalid(k, format!("'{k}' must be in [{lo}, {hi}], got {x}")))
            }
            x => Ok(x.map(|x| x as f32)),
        }
    }
}

fn object<'a>(body: &'a Value) -> Res<Fields<'a>> {
    body.as_object().map(Fields).ok_or_else(|| ApiError::invalid("", "the request body must be a JSON object"))
}

/// Fields both endpoints share.
fn gen_params(f: &Fields, d: &Defaults, chat: bool) -> Res<GenParams> {
    if let Some(n) = f.uint("n")?
        && n != 1
    {
        return Err(ApiError::invalid("n", "only n = 1 is supported"));
    }
    let mut s = d.sampler;
    if let Some(t) = f.in_range("temperature", 0.0, 100.0)? {
        s.temperature = t;
    }
    if let Some(p) = f.num("top_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid("top_p", format!("'top_p' must be in (0, 1], got {p}")));
        }
        s.top_p = p as f32;
    }
    if let Some(k) = f.uint("top_k")? {
        s.top_k = k as usize;
    }
    if let Some(m) = f.in_range("min_p", 0.0, 1.0)? {
        s.min_p = m;
    }
    if let Some(r) = f.in_range("repeat_penalty", 1e-3, 100.0)? {
        s.repeat_penalty = r;
    }
    if let Some(n) = f.uint("repeat_last_n")? {
        s.repeat_last_n = n as usize;
    }
    s.seed = match f.get("seed") {
        // OpenAI's seed is any integer: a negative one keeps its bits
        Some(v) => v
            .as_i64()
            .map(|x| x as u64)
            .or(v.as_u64())
            .ok_or_else(|| ApiError::invalid("seed", "'seed' must be an integer"))?,
        None => d.seed.unwrap_or_else(fresh_seed),
    };
    let adjust = Adjustments {
        logit_bias: logit_bias(f)?,
        presence: f.in_range("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency: f.in_range("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
    };
    // max_completion_tokens supersedes the deprecated max_tokens
    let max_tokens = match f.uint("max_completion_tokens")? {
        Some(n) => Some(n as usize),
        None => f.uint("max_tokens")?.map(|n| n as usize).or(d.max_tokens),
    };
    let logprobs = if chat {
        let top = f.uint("top_logprobs")?;
        match (f.bool("logprobs")?.unwrap_or(false), top) {
            (_, Some(t)) if t > 20 => {
                return Err(ApiError::invalid("top_logprobs", "'top_logprobs' must be at most 20"));
            }
            (false, Some(_)) => return Err(ApiError::invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true")),
            (true, t) => Some(t.unwrap_or(0) as usize),
            (false, None) => None,
        }
    } else {
        // the legacy endpoint's logprobs is the number of alternatives (0-5)
        match f.uint("logprobs")? {
            Some(n) if n > 5 => return Err(ApiError::invalid("logprobs", "'logprobs' must be at most 5")),
            n => n.map(|n| n as usize),
        }
    };
    Ok(GenParams {
        sampler: s,
        adjust,
        max_tokens,
        stop: stop(f)?,
        logprobs,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        return_progress: f.bool("return_progress")?.unwrap_or(false),
    })
}

fn fresh_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn logit_bias(f: &Fields) -> Res<Vec<(u32, f32)>> {
    let Some(v) = f.get("logit_bias") else { return Ok(Vec::new()) };
    let o = v
        .as_object()
        .ok_or_else(|| ApiError::invalid("logit_bias", "'logit_bias' must be an object of token id -> bias"))?;
    let mut out = Vec::with_capacity(o.len());
    for (k, b) in o {
        let id = k
            .parse::<u32>()
            .map_err(|_| ApiError::invalid("logit_bias", format!("logit_bias: '{k}' is not a token id")))?;
        let b = b.as_f64().filter(|b| (-100.0..=100.0).contains(b));
        let b = b.ok_or_else(|| {
            ApiError::invalid("logit_bias", format!("logit_bias: the bias of {k} must be a number in [-100, 100]"))
        })?;
        out.push((id, b as f32));
    }
    Ok(out)
}

fn stop(f: &Fields) -> Res<Vec<String>> {
    let stops: Vec<String> = match f.get("stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::invalid("stop", "'stop' must be a string or a list of strings"))
            })
            .collect::<Res<_>>()?,
        Some(_) => return Err(ApiError::invalid("stop", "'stop' must be a string or a list of strings")),
    };
    if stops.len() > 4 {
        return Err(ApiError::invalid("stop", "'stop' takes at most 4 strings"));
    }
    if stops.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid("stop", "'stop' strings must not be empty"));
    }
    Ok(stops)
}

fn stream_fields(f: &Fields) -> Res<(bool, bool)> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let usage = match f.get("stream_options") {
        None => false,
        Some(o) => object(o)
            .map_err(|_| ApiError::invalid("stream_options", "'stream_options' must be an object"))?
            .bool("include_usage")?
            .unwrap_or(false),
    };
    Ok((stream, usage))
}

/// `POST /v1/chat/completions`.
pub fn parse_chat(body: &Value, d: &Defaults) -> Res<Request> {
    let f = object(body)?;
    if let Some(rf) = f.get("response_format")
        && rf.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::invalid("response_format", "'response_format' (JSON mode, schemas) is not supported"));
    }
    let params = gen_params(&f, d, true)?;
    let (stream, include_usage) = stream_fields(&f)?;
    let msgs = f.get("messages").and_then(Value::as_array);
    let msgs = msgs
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::invalid("messages", "'messages' must be a non-empty array"))?;
    let mut messages: Vec<Value> = msgs.iter().enumerate().map(|(i, m)| message(i, m)).collect::<Res<_>>()?;
    // a trailing assistant message is the start of the reply
    let prefill = match messages.last() {
        Some(m) if m["role"] == "assistant" && m.get("tool_calls").is_none() => {
            let p = m["content"].as_str().unwrap_or_default().to_string();
            messages.pop();
            Some(p)
        }
        _ => None,
    };
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' holds only the assistant's prefill"));
    }
    let tools = match (f.get("tools"), f.get("tool_choice").and_then(Value::as_str)) {
        (None, _) | (_, Some("none")) => None,
        (Some(Value::Array(t)), None | Some("auto")) if !t.is_empty() => Some(Value::Array(t.clone())),
        (Some(Value::Array(t)), None | Some("auto")) if t.is_empty() => None,
        (Some(Value::Array(_)), _) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "'tool_choice' may be auto or none (no grammar forces a call)",
            ));
        }
        (Some(_), _) => return Err(ApiError::invalid("tools", "'tools' must be an array")),
    };
    let args = template_args(&f, d)?;
    let reasoning = match f.get("reasoning_format").map(|v| v.as_str()) {
        None | Some(Some("deepseek" | "auto")) => true,
        Some(Some("none")) => false,
        Some(_) => {
            return Err(ApiError::invalid("reasoning_format", "'reasoning_format' may be deepseek, auto or none"));
        }
    };
    Ok(Request {
        prompt: Prompt::Chat { messages: Value::Array(messages), tools, args: Box::new(args), prefill },
        params,
        stream,
        include_usage,
        reasoning,
    })
}

/// One message, normalized for the template: `content` a string (text parts joined; null for
/// an assistant's tool calls), `developer` read as `system`, other fields kept.
/// The template's arguments: the server's, then the request's `chat_template_kwargs` (any keys,
/// as llama-server passes them; `enable_thinking` a boolean, `reasoning_effort` one of low,
/// medium, high), then its top-level `reasoning_effort` (OpenAI's field for reasoning models);
/// a null effort is one not given.
fn template_args(f: &Fields, d: &Defaults) -> Res<TemplateArgs> {
    let mut args = d.template_args.clone();
    let effort = |k: &str, v: &Value| -> Res<String> {
        v.as_str()
            .ok_or(())
            .and_then(|s| reasoning_effort(s).map_err(|_| ()))
            .map_err(|_| ApiError::invalid(k, format!("'{k}' must be low, medium or high")))
    };
    if let Some(k) = f.get("chat_template_kwargs") {
        let kw = object(k)
            .map_err(|_| ApiError::invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object"))?;
        for (name, v) in kw.0 {
            match name.as_str() {
                "enable_thinking" => args.enable_thinking = kw.bool(name)?.or(args.enable_thinking),
                // null: not given (the server's or the template's default)
                "reasoning_effort" if v.is_null() => {}
                "reasoning_effort" => args.reasoning_effort = Some(effort("reasoning_effort", v)?),
                _ => {
                    args.extra.insert(name.clone(), v.clone());
                }
            }
        }
    }
    if let Some(v) = f.get("reasoning_effort").filter(|v| !v.is_null()) {
        args.reasoning_effort = Some(effort("reasoning_effort", v)?);
    }
    Ok(args)
}

fn message(i: usize, m: &Value) -> Res<Value> {
    let param = format!("messages[{i}]");
    let o = m.as_object().ok_or_else(|| ApiError::invalid(&param, format!("{param} must be an object")))?;
    let role = o
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(&param, format!("{param}.role is missing")))?;
    let role = match role {
        "developer" => "system",
        r @ ("system" | "user" | "assistant" | "tool") => r,
        r => {
            return Err(ApiError::invalid(
                &param,
                format!("{param}.role '{r}' is not one of system, developer, user, assistant, tool"),
            ));
        }
    };
    let content = match o.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(t), _) if t != "text" => {
                        return Err(ApiError::invalid(
                            &param,
                            format!("{param}: content of type '{t}' is not supported (text only)"),
                        ));
                    }
                    _ => return Err(ApiError::invalid(&param, format!("{param}: a content part needs type and text"))),
                }
            }
            text
        }
        Some(_) => {
            return Err(ApiError::invalid(&param, format!("{param}.content must be a string or a list of parts")));
        }
    };
    let mut out = o.clone();
    out.insert("role".into(), role.into());
    out.insert("content".into(), content.into());
    Ok(Value::Object(out))
}

/// `POST /v1/completions`: `prompt` a string, a list of one string, or token ids.
pub fn parse_completion(body: &Value, d: &Defaults) -> Res<Request> {
    let f = object(body)?;
    if f.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::invalid("echo", "'echo' is not supported"));
    }
    if f.get("suffix").is_some() {
        return Err(ApiError::invalid("suffix", "'suffix' is not supported"));
    }
    if f.uint("best_of")?.is_some_and(|b| b > 1) {
        return Err(ApiError::invalid("best_of", "only best_of = 1 is supported"));
    }
    let params = gen_params(&f, d, false)?;
    let (stream, include_usage) = stream_fields(&f)?;
    let bad = || ApiError::invalid("prompt", "'prompt' must be a string, a list of one string, or a list of token ids");
    let prompt = match f.get("prompt").ok_or_else(bad)? {
        Value::String(s) => Prompt::Text(s.clone()),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Prompt::Text(a[0].as_str().unwrap_or_default().to_string())
        }
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_u64) => Prompt::Ids(
            a.iter().map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(bad)).collect::<Res<_>>()?,
        ),
        Value::Array(a) if a.len() > 1 && a.iter().all(Value::is_string) => {
            return Err(ApiError::invalid("prompt", "one prompt per request (a list of prompts is a batch)"));
        }
        _ => return Err(bad()),
    };
    Ok(Request { prompt, params, stream, include_usage, reasoning: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            sampler: SamplerParams::default(),
            seed: Some(5),
            max_tokens: None,
            template_args: Default::default(),
        }
    }

    fn chat(body: Value) -> Res<Request> {
        parse_chat(&body, &defaults())
    }

    #[test]
    fn reads_the_fields() {
        let r = chat(json!({
            "model": "x", "messages": [{"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "Sure:"}],
            "temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.1, "seed": -1, "stop": "\n\n",
            "max_tokens": 7, "max_completion_tokens": 9, "presence_penalty": 0.5, "logit_bias": {"12": -100},
            "logprobs": true, "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true},
            "chat_template_kwargs": {"enable_thinking": false}, "ignore_eos": true, "user": "ignored"
        }))
        .unwrap();
        let Prompt::Chat { messages, tools, args, prefill } = &r.prompt else { panic!() };
        assert_eq!(messages, &json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]));
        assert_eq!((tools, args.enable_thinking, prefill.as_deref()), (&None, Some(false), Some("Sure:")));
        let g = &r.params;
        assert_eq!((g.sampler.temperature, g.sampler.top_p, g.sampler.top_k, g.sampler.seed), (0.0, 0.5, 3, u64::MAX));
        assert_eq!(
            (g.max_tokens, g.stop.clone(), g.logprobs, g.ignore_eos),
            (Some(9), vec!["\n\n".into()], Some(2), true)
        );
        assert_eq!((g.adjust.presence, g.adjust.logit_bias.clone()), (0.5, vec![(12, -100.0)]));
        assert!(r.stream && r.include_usage);
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        let m = json!([{"role": "user", "content": "hi"}]);
        let param = |b: Value| chat(b).unwrap_err().param;
        assert_eq!(param(json!({"messages": m, "n": 2})).as_deref(), Some("n"));
        assert_eq!(
            param(json!({"messages": m, "response_format": {"type": "json_object"}})).as_deref(),
            Some("response_format")
        );
        assert_eq!(param(json!({"messages": m, "temperature": "hot"})).as_deref(), Some("temperature"));
        assert_eq!(param(json!({"messages": m, "stop": ["a", "b", "c", "d", "e"]})).as_deref(), Some("stop"));
        assert_eq!(param(json!({"messages": m, "top_logprobs": 3})).as_deref(), Some("top_logprobs"));
        assert_eq!(param(json!({"messages": m, "logit_bias": {"x": 1}})).as_deref(), Some("logit_bias"));
        assert_eq!(param(json!({"messages": []})).as_deref(), Some("messages"));
        let img = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
        assert_eq!(param(json!({"messages": img})).as_deref(), Some("messages[0]"));
        assert_eq!(chat(json!([1])).unwrap_err().status, 400);
        let c = |b: Value| parse_completion(&b, &defaults());
        assert_eq!(c(json!({"prompt": "a", "echo": true})).unwrap_err().param.as_deref(), Some("echo"));
        assert_eq!(c(json!({"prompt": ["a", "b"]})).unwrap_err().param.as_deref(), Some("prompt"));
        assert_eq!(c(json!({"prompt": [1, 2, 3]})).unwrap().prompt, Prompt::Ids(vec![1, 2, 3]));
        assert_eq!(c(json!({"prompt": "x", "logprobs": 2})).unwrap().params.logprobs, Some(2));
    }
}
