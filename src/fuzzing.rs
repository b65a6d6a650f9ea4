//! Fuzz targets: each takes arbitrary bytes, feeds them to one of the readers a user's file or
//! request reaches, and returns. An error is a correct answer to bad input; a panic, an abort, a
//! hang or an allocation past the process's limit is a bug. Shared by the cargo-fuzz targets
//! (fuzz/, libFuzzer, nightly) and the replay harness (replay/, stable, in CI), which run the
//! same functions on the same inputs.
//!
//! Each returns how far the input got (0: refused at once, up to 3: converted or parsed and
//! run), so a harness can tell mutations that reach deep from ones every reader refuses.
//!
//! Inputs that are several files (a checkpoint directory, a template with its messages) come as
//! a [bundle]: named parts, so a mutator can change one file and keep the others valid.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::convert::{ConvertOptions, QuantMode};
use crate::engine::{Engine, EngineOptions};
use crate::model::{Logits, NoObserver};

/// A target: the input, and how far it got.
pub type Target = fn(&[u8]) -> u8;

/// The targets, by name (the replay harness's and the fuzz/ binaries' names).
pub const TARGETS: [(&str, Target); 7] = [
    ("gguf", gguf),
    ("package", package),
    ("checkpoint", checkpoint),
    ("chat_template", chat_template),
    ("request", request),
    ("routing_trace", routing_trace),
    ("tool_calls", tool_calls),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// `parts` as one input: per part a name (u8 length, then the bytes) and its data (u32 LE length,
/// then the bytes).
pub fn bundle(parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in parts {
        out.push(name.len().min(255) as u8);
        out.extend_from_slice(&name.as_bytes()[..name.len().min(255)]);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// The parts of a [bundle], as far as it is well formed (a part that runs past the end is cut at
/// the end; the rest is dropped).
pub fn unbundle(mut data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut parts = Vec::new();
    while let Some((&n, rest)) = data.split_first() {
        let Some((name, rest)) = (rest.len() >= n as usize).then(|| rest.split_at(n as usize)) else { break };
        let Some((len, rest)) = (rest.len() >= 4).then(|| rest.split_at(4)) else { break };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let (body, rest) = rest.split_at(len.min(rest.len()));
        parts.push((String::from_utf8_lossy(name).into_owned(), body.to_vec()));
        data = rest;
    }
    parts
}

/// An empty scratch folder of this process (the same one every call: cases run one at a time).
fn scratch() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let d = DIR.get_or_init(|| std::env::temp_dir().join(format!("moescope-fuzz-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(d);
    let _ = std::fs::create_dir_all(d);
    d.clone()
}

/// Load the package at `path` and run two tokens through it: whether both worked.
fn run_package(path: &Path) -> bool {
    let opts = EngineOptions {
        threads: 1,
        ctx_size: Some(32),
        isa: moescope_kernels::Isa::detect(),
        stream: None,
        panels: true,
        kv: crate::model::KvTypes::default(),
    };
    let Ok(mut e) = Engine::load(path, opts) else { return false };
    let vocab = e.package().meta.model.vocab_size as u32;
    e.eval(&[0, vocab.saturating_sub(1)], Logits::Last, &mut NoObserver).is_ok()
}

/// A GGUF file: its metadata and tensor index, the config and tokenizer they give, and, where
/// those are whole, its conversion into a package and two tokens through that.
pub fn gguf(data: &[u8]) -> u8 {
    let d = scratch();
    let path = d.join("case.gguf");
    if std::fs::write(&path, data).is_err() {
        return 0;
    }
    let Ok(m) = crate::convert::gguf::model::GgufModel::open(&path) else { return 0 };
    let _ = m.config();
    let _ = crate::convert::gguf::vocab::tokenizer(&m);
    let out = d.join("out.moe");
    if crate::convert::convert_gguf(&path, &out, ConvertOptions::new(QuantMode::File)).is_err() {
        return 1;
    }
    2 + u8::from(run_package(&out))
}

/// A .moe package: opened, its dense tensors, every expert blob and every multi-token-prediction
/// tensor verified, loaded by the engine and run for two tokens.
pub fn package(data: &[u8]) -> u8 {
    let d = scratch();
    let path = d.join("case.moe");
    if std::fs::write(&path, data).is_err() {
        return 0;
    }
    let Ok(p) = crate::package::Package::open(&path) else { return 0 };
    let dense = p.verify_dense().is_ok();
    if let Some(ex) = p.meta.experts.as_ref() {
        for &l in ex.layers.iter().take(64) {
            for e in 0..ex.num_experts.min(512) {
                let _ = p.expert(l, e);
            }
        }
    }
    let _ = p.verify_mtp();
    drop(p);
    1 + u8::from(dense) + u8::from(run_package(&path))
}

/// A routing trace (plain, gzipped or xz; `sim` and `--route-from` read them): read back record
/// by record, made into a replay, and simulated against a pool of a few experts.
pub fn routing_trace(data: &[u8]) -> u8 {
    use crate::experts::{routing_log, sim};
    let path = scratch().join("case.jsonl");
    if std::fs::write(&path, data).is_err() {
        return 0;
    }
    let Ok((h, recs)) = routing_log::read(&path) else { return 0 };
    let steps = sim::steps(&recs);
    let capacity = (h.top_k * h.moe_layers.len()).clamp(1, 4096);
    let _ = sim::simulate(&h, &steps, capacity, sim::SimPolicy::Policy(crate::experts::PolicyKind::Foresight));
    match routing_log::replay("case", &h, recs) {
        Ok(_) => 2,
        Err(_) => 1,
    }
}

/// File names a checkpoint bundle may write (anything else is skipped, so no input writes
/// outside the scratch folder).
pub const CHECKPOINT_FILES: [&str; 9] = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "tiktoken.model",
    "chat_template.jinja",
];

/// A HuggingFace checkpoint directory (a [bundle] of its files): converted into a package, and
/// two tokens through that.
pub fn checkpoint(data: &[u8]) -> u8 {
    let d = scratch();
    let dir = d.join("ck");
    if std::fs::create_dir_all(&dir).is_err() {
        return 0;
    }
    for (name, body) in unbundle(data) {
        if CHECKPOINT_FILES.contains(&name.as_str()) && std::fs::write(dir.join(&name), body).is_err() {
            return 0;
        }
    }
    if crate::convert::hf_config::read_config(&dir).is_err() {
        return 0;
    }
    let out = d.join("out.moe");
    if crate::convert::convert_hf(&dir, &out, ConvertOptions::new(QuantMode::File)).is_err() {
        return 1;
    }
    2 + u8::from(run_package(&out))
}

/// A chat template and what it renders: a [bundle] of `template` (Jinja source), `messages`
/// and `tools` (JSON), rendered with and without the generation prompt.
pub fn chat_template(data: &[u8]) -> u8 {
    let parts = unbundle(data);
    let get = |n: &str| parts.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_slice());
    let Some(src) = get("template").and_then(|t| std::str::from_utf8(t).ok()) else { return 0 };
    let Ok(t) = crate::engine::chat_template::ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())) else {
        return 0;
    };
    let json = |n: &str| get(n).and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok());
    let messages = json("messages").unwrap_or_else(|| serde_json::json!([{"role": "user", "content": "hi"}]));
    let tools = json("tools");
    let mut rendered = 0;
    use crate::engine::chat_template::TemplateArgs;
    let effort = TemplateArgs { reasoning_effort: Some("high".into()), ..TemplateArgs::default() };
    for (gen_prompt, args) in
        [(true, TemplateArgs::default()), (false, TemplateArgs::thinking(Some(false))), (true, effort)]
    {
        rendered += u8::from(t.render_json(&messages, tools.as_ref(), gen_prompt, &args).is_ok());
    }
    1 + rendered
}

/// A reply's text through the tool-call splitter of one syntax (the first byte: `<tool_call>`
/// blocks, DeepSeek's or Kimi's markers; the second: the streamed pieces' length in
/// characters): streamed, it must give what the whole text gives.
pub fn tool_calls(data: &[u8]) -> u8 {
    use crate::engine::call_syntax::CallSyntax;
    use crate::serve::tools::{Piece, ToolSplitter, split_reply};
    let [which, step, rest @ ..] = data else { return 0 };
    let syntax = [CallSyntax::Tagged, CallSyntax::DeepSeek, CallSyntax::Kimi][*which as usize % 3];
    let text = String::from_utf8_lossy(rest);
    let props =
        serde_json::json!({"city": {"type": "string"}, "days": {"type": "integer"}, "hourly": {"type": "boolean"}});
    let tools = std::sync::Arc::new(serde_json::json!([{"type": "function",
        "function": {"name": "get_weather", "parameters": {"properties": props}}}]));
    let whole = split_reply(syntax, None, &text, Some(tools.clone()));
    let mut sp = ToolSplitter::new(syntax, Some(tools));
    let chars: Vec<char> = text.chars().collect();
    let mut got: Vec<Piece> =
        chars.chunks(*step as usize % 16 + 1).flat_map(|c| sp.push(&c.iter().collect::<String>())).collect();
    got.extend(sp.finish());
    let content: String =
        got.iter().filter_map(|p| if let Piece::Text(t) = p { Some(t.as_str()) } else { None }).collect();
    let calls: Vec<_> = got.into_iter().filter_map(|p| if let Piece::Call(c) = p { Some(c) } else { None }).collect();
    assert_eq!(calls, whole.1, "streamed calls differ from the whole reply's");
    if !calls.is_empty() {
        assert_eq!(Some(content.trim()), whole.0.as_deref().or(Some("")), "streamed content differs");
    }
    1 + u8::from(!calls.is_empty())
}

/// The address of this process's server: `moescope serve` on the built-in demo model, started
/// on the first call (None if it cannot start).
fn server() -> Option<std::net::SocketAddr> {
    static ADDR: OnceLock<Option<std::net::SocketAddr>> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let pkg = crate::demo::ensure_package(&scratch_root().join("demo")).ok()?.0;
        let (tx, rx) = std::sync::mpsc::channel();
        let opts = crate::serve::ServeOptions {
            host: "127.0.0.1".into(),
            port: 0,
            api_key: None,
            alias: None,
            queue: 4,
            metrics: true,
            body_limit: 1 << 20,
            // a fixed seed, and replies of at most 64 tokens unless a request asks otherwise
            defaults: crate::serve::api::Defaults {
                sampler: crate::engine::sampler::SamplerParams::default(),
                seed: Some(1),
                max_tokens: Some(64),
                template_args: Default::default(),
            },
            watch: None,
            on_queue: None,
            shutdown: None,
        };
        let load: crate::serve::Loader = Box::new(move || {
            let o = EngineOptions {
                threads: 1,
                ctx_size: Some(256),
                isa: moescope_kernels::Isa::detect(),
                stream: None,
                panels: true,
                kv: crate::model::KvTypes::default(),
            };
            Engine::load_serving(&pkg, o, Some((Some(2), Some(16 << 20)))).map_err(|e| e.to_string())
        });
        std::thread::Builder::new()
            .name("fuzz-server".into())
            .spawn(move || {
                let _ = crate::serve::run(opts, load, |a| {
                    let _ = tx.send(a);
                });
            })
            .ok()?;
        let addr = rx.recv_timeout(std::time::Duration::from_secs(30)).ok()?;
        // until the engine has loaded, requests are answered 503
        for _ in 0..600 {
            if http(addr, "GET", "/health", b"").is_some_and(|r| r.starts_with(b"HTTP/1.1 200")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Some(addr)
    })
}

/// The process's scratch root (kept across cases, unlike [scratch]'s contents).
fn scratch_root() -> PathBuf {
    std::env::temp_dir().join(format!("moescope-fuzz-keep-{}", std::process::id()))
}

/// One HTTP/1.1 request with `Connection: close`, and the whole response (None when the
/// connection fails or stalls for 30 s).
fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &[u8]) -> Option<Vec<u8>> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    Some(out)
}

/// Routes a request body goes to, by the input's first byte.
const ROUTES: [&str; 5] = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/apply-template"];

/// A request body to the server's handlers (the route chosen by the first byte), in process
/// over loopback, answered in full (streams to their end).
pub fn request(data: &[u8]) -> u8 {
    let Some((&which, body)) = data.split_first() else { return 0 };
    let Some(addr) = server() else { return 0 };
    match http(addr, "POST", ROUTES[which as usize % ROUTES.len()], body) {
        None => 0,
        Some(r) if r.starts_with(b"HTTP/1.1 200") => 3,
        Some(r) if r.starts_with(b"HTTP/1.1 4") => 2,
        Some(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_round_trip_and_damaged_ones_keep_their_whole_parts() {
        let b = bundle(&[("config.json", b"{}"), ("model.safetensors", &[1, 2, 3])]);
        let parts = unbundle(&b);
        assert_eq!(parts, vec![("config.json".into(), b"{}".to_vec()), ("model.safetensors".into(), vec![1, 2, 3])]);
        // cut inside the second part's data: the first whole, the second cut
        let cut = unbundle(&b[..b.len() - 1]);
        assert_eq!(cut[0], parts[0]);
        assert_eq!(cut[1].1, vec![1, 2]);
        assert!(unbundle(&[200]).is_empty());
    }
}
