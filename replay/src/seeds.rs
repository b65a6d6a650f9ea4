//! The inputs mutations start from, per target: the saved corpus (fuzz/corpus/TARGET/, which
//! also holds every input that once killed or hung a child), the repository's test fixtures, and
//! a tiny Qwen3-MoE checkpoint made here (its package too), so each reader sees whole, valid
//! files of every kind before it sees damaged ones.

use std::path::{Path, PathBuf};

use moescope::convert::{ConvertOptions, QuantMode, plan};
use moescope::fuzzing::bundle;
use moescope::model_config::ModelConfig;

use crate::mutate::Rng;

/// GPT-2's byte-to-character map: byte-level BPE spells every byte as one printable character.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap_or('?');
    }
    let mut next = 256;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(next).unwrap_or('?');
            next += 1;
            printable.push(b);
        }
    }
    chars
}

/// A byte-level BPE tokenizer.json with the 256 byte tokens, a few merges and Qwen's specials.
fn tokenizer_json() -> String {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), i.into());
    }
    let merges = ["Ġ t", "h e", "i n"];
    for (i, m) in merges.iter().enumerate() {
        vocab.insert(m.replace(' ', ""), (256 + i).into());
    }
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            serde_json::json!({"id": 259 + i, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges}
    })
    .to_string()
}

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// config.json of a tiny Qwen3-MoE: 2 layers, 4 experts of which 2 are used, vocabulary 264.
fn tiny_config() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 264,
        "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4,
        "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": false, "eos_token_id": 261
    })
}

/// model.safetensors for `cfg`: every tensor the converter asks for, bf16, small random values.
/// Every tensor a checkpoint of `cfg` holds: (name, shape).
fn tensor_list(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let mut tensors: Vec<(String, Vec<usize>)> =
        plan::dense_tensors(cfg).into_iter().map(|t| (t.name, t.shape.to_vec())).collect();
    for l in cfg.moe_layers() {
        for e in 0..cfg.num_experts {
            tensors.extend(plan::expert_tensors(cfg, l, e).into_iter().map(|(n, s)| (n, s.to_vec())));
        }
    }
    tensors
}

fn safetensors_for(cfg: &ModelConfig) -> Vec<u8> {
    safetensors_of(tensor_list(cfg))
}

/// A safetensors file of `tensors` in bf16, small seeded values (norms near 1).
fn safetensors_of(tensors: Vec<(String, Vec<usize>)>) -> Vec<u8> {
    let mut rng = Rng::new(7);
    let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
    for (name, shape) in tensors {
        let n: usize = shape.iter().product();
        let start = data.len();
        for _ in 0..n {
            let v = (rng.below(2001) as f32 - 1000.0) * 1e-4 + if name.ends_with("norm.weight") { 1.0 } else { 0.0 };
            data.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }
        header.insert(name, serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}));
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// The tiny checkpoint as a bundle of its files.
pub fn tiny_checkpoint() -> Vec<u8> {
    let cfg_json = tiny_config();
    let cfg = moescope::convert::hf_config::parse_config(&cfg_json, Path::new("config.json"))
        .unwrap_or_else(|e| panic!("the tiny config does not parse: {e}"));
    let tc = serde_json::json!({"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "bos_token": null}).to_string();
    bundle(&[
        ("config.json", cfg_json.to_string().as_bytes()),
        ("model.safetensors", &safetensors_for(&cfg)),
        ("tokenizer.json", tokenizer_json().as_bytes()),
        ("tokenizer_config.json", tc.as_bytes()),
    ])
}

/// The tiny checkpoint with Kimi-K2's tokenizer files instead: a tiktoken.model (the 256 bytes
/// and a few merged tokens) and a tokenizer_config.json naming Kimi's tokenizer class.
pub fn tiny_kimi_checkpoint() -> Vec<u8> {
    let mut cfg_json = tiny_config();
    cfg_json["vocab_size"] = 520.into();
    let cfg = moescope::convert::hf_config::parse_config(&cfg_json, Path::new("config.json"))
        .unwrap_or_else(|e| panic!("the tiny config does not parse: {e}"));
    let mut ranks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    ranks.extend([&b"th"[..], b"he", b"the", b" the"].map(<[u8]>::to_vec));
    let refs: Vec<&[u8]> = ranks.iter().map(Vec::as_slice).collect();
    let model = moescope::convert::tiktoken::tiktoken_model_text(&refs);
    let tc = serde_json::json!({
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "chat_template": TEMPLATE,
        "added_tokens_decoder": {"260": {"content": "[BOS]"}, "261": {"content": "[EOS]"}},
    })
    .to_string();
    bundle(&[
        ("config.json", cfg_json.to_string().as_bytes()),
        ("model.safetensors", &safetensors_for(&cfg)),
        ("tiktoken.model", model.as_bytes()),
        ("tokenizer_config.json", tc.as_bytes()),
    ])
}

/// The tiny checkpoint in two shards with their index (model.safetensors.index.json), so the
/// index's structure is mutated too.
pub fn tiny_sharded_checkpoint() -> Vec<u8> {
    let cfg_json = tiny_config();
    let cfg = moescope::convert::hf_config::parse_config(&cfg_json, Path::new("config.json"))
        .unwrap_or_else(|e| panic!("the tiny config does not parse: {e}"));
    let mut all = tensor_list(&cfg);
    let second = all.split_off(all.len() / 2);
    let names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    let mut map = serde_json::Map::new();
    for (list, file) in [(&all, names[0]), (&second, names[1])] {
        for (n, _) in list {
            map.insert(n.clone(), file.into());
        }
    }
    let shards = [safetensors_of(all), safetensors_of(second)];
    let index = serde_json::json!({"metadata": {"total_size": shards[0].len() + shards[1].len()}, "weight_map": map});
    bundle(&[
        ("config.json", cfg_json.to_string().as_bytes()),
        ("model.safetensors.index.json", index.to_string().as_bytes()),
        (names[0], &shards[0]),
        (names[1], &shards[1]),
        ("tokenizer.json", tokenizer_json().as_bytes()),
    ])
}

/// The repository's tests/fixtures as the tests read it (its packed files unpacked, see
/// `moescope::packed`), in the target folder; the packed folder itself if that fails.
pub fn fixtures(root: &Path) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let from = root.join("tests/fixtures");
        let key = moescope::packed::tree_key(&from).unwrap_or(0);
        let to = root.join("target").join(format!("replay-fixtures-{key:08x}"));
        match moescope::packed::unpack_tree(&from, &to) {
            Ok(()) => to,
            Err(e) => {
                eprintln!("moescope-replay: {e}: fixture seeds left out");
                from
            }
        }
    })
    .clone()
}

/// A checkpoint bundle of a test fixture's files (those present), None if it has no config.
fn fixture_checkpoint(root: &Path, name: &str) -> Option<Vec<u8>> {
    let dir = fixtures(root).join(name);
    let read: Vec<(&str, Vec<u8>)> = moescope::fuzzing::CHECKPOINT_FILES
        .iter()
        .filter_map(|f| Some((*f, std::fs::read(dir.join(f)).ok()?)))
        .collect();
    read.iter()
        .any(|(f, _)| *f == "config.json")
        .then(|| bundle(&read.iter().map(|(f, b)| (*f, b.as_slice())).collect::<Vec<_>>()))
}

/// gpt-oss's bf16 release layout, derived from the MXFP4 fixture (moescope::derived_fixture).
fn gpt_oss_bf16_checkpoint(root: &Path) -> Option<Vec<u8>> {
    derived_checkpoint(root, "gpt-oss-mxfp4", &moescope::derived_fixture::gpt_oss_bf16_release)
}

/// The bundle (config.json, model.safetensors) `make` derives from fixture `from`.
fn derived_checkpoint(root: &Path, from: &str, make: &dyn Fn(&Path, &Path) -> Result<(), String>) -> Option<Vec<u8>> {
    let d = std::env::temp_dir().join(format!("moescope-replay-{from}-{}", std::process::id()));
    std::fs::create_dir_all(&d).ok()?;
    let ok = make(&fixtures(root).join(from), &d).is_ok();
    let read = |f: &str| std::fs::read(d.join(f)).ok();
    let parts = ok.then(|| Some((read("config.json")?, read("model.safetensors")?))).flatten();
    let _ = std::fs::remove_dir_all(&d);
    let (config, model) = parts?;
    Some(bundle(&[("config.json", &config), ("model.safetensors", &model)]))
}

/// The package a checkpoint bundle converts into (in a scratch folder of its own).
fn package_of(checkpoint: &[u8]) -> Option<Vec<u8>> {
    let d = std::env::temp_dir().join(format!("moescope-replay-seed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("ck")).ok()?;
    for (name, body) in moescope::fuzzing::unbundle(checkpoint) {
        std::fs::write(d.join("ck").join(name), body).ok()?;
    }
    let out = d.join("seed.moe");
    let ok = moescope::convert::convert_hf(&d.join("ck"), &out, ConvertOptions::new(QuantMode::File)).is_ok();
    let bytes = if ok { std::fs::read(&out).ok() } else { None };
    let _ = std::fs::remove_dir_all(&d);
    bytes
}

/// The package of a GGUF file as the file holds it (a Q4_K_M file: k4 records, parts per
/// layer; a low-bit mix: the file's blocks).
fn package_of_gguf(gguf: &Path) -> Option<Vec<u8>> {
    let out = std::env::temp_dir().join(format!("moescope-replay-gguf-seed-{}.moe", std::process::id()));
    let ok = moescope::convert::convert_gguf(gguf, &out, ConvertOptions::new(QuantMode::File)).is_ok();
    let bytes = if ok { std::fs::read(&out).ok() } else { None };
    let _ = std::fs::remove_file(&out);
    bytes
}

/// The packages of the low-bit mixes ([`low_bit_ggufs`]): tensors kept as the file's blocks.
fn low_bit_packages(root: &Path) -> Vec<(String, Vec<u8>)> {
    let tmp = std::env::temp_dir().join(format!("moescope-replay-low-bit-pkg-{}.gguf", std::process::id()));
    let pkgs = low_bit_ggufs(root)
        .into_iter()
        .filter_map(|(name, gguf)| {
            std::fs::write(&tmp, gguf).ok()?;
            Some((format!("{name} package (the file's blocks)"), package_of_gguf(&tmp)?))
        })
        .collect();
    let _ = std::fs::remove_file(&tmp);
    pkgs
}

fn messages() -> serde_json::Value {
    serde_json::json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1",
            "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
        {"role": "tool", "content": "4", "tool_call_id": "c1"},
        {"role": "user", "content": "Thanks"}
    ])
}

fn tools() -> serde_json::Value {
    serde_json::json!([{"type": "function", "function": {"name": "add", "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}])
}

/// The tiny Q8_0 GGUF with its tensors re-typed by each of `moescope::derived_gguf`'s mixes, and
/// with YaRN's keys: (what it is, the file).
fn low_bit_ggufs(root: &Path) -> Vec<(String, Vec<u8>)> {
    let out = std::env::temp_dir().join(format!("moescope-replay-low-bit-{}.gguf", std::process::id()));
    let src = fixtures(root).join("gguf/tiny/tiny-q8_0.gguf");
    let files = moescope::derived_gguf::MIXES
        .iter()
        .filter_map(|(name, types)| {
            moescope::derived_gguf::low_bit_mix(&src, &out, types).ok()?;
            Some((format!("tiny qwen3-moe, {name} mixed"), std::fs::read(&out).ok()?))
        })
        .chain(moescope::derived_gguf::with_yarn(&src, &out).ok().and_then(|()| {
            Some(("tiny qwen3-moe with YaRN's rope.scaling keys".to_string(), std::fs::read(&out).ok()?))
        }))
        .collect();
    let _ = std::fs::remove_file(&out);
    files
}

/// The tiny Q8_0 GGUF re-typed to each single type of `moescope::derived_gguf::ONE_TYPE_FILES`,
/// as `out`/tiny-TYPE.gguf (TYPE in lower case), and with YaRN's keys as `out`/tiny-yarn.gguf.
pub fn write_typed_ggufs(root: &Path, out: &Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let src = fixtures(root).join("gguf/tiny/tiny-q8_0.gguf");
    for t in moescope::derived_gguf::ONE_TYPE_FILES {
        let file = out.join(format!("tiny-{}.gguf", t.name().to_lowercase()));
        moescope::derived_gguf::low_bit_mix(&src, &file, &[t])?;
    }
    moescope::derived_gguf::with_yarn(&src, &out.join("tiny-yarn.gguf"))
}

/// The built-in and fixture seeds of `target`, then the saved corpus's.
pub fn seeds(target: &str, root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = vec![];
    let file = |p: &str| std::fs::read(root.join(p)).ok().map(|b| (p.to_string(), b));
    match target {
        "checkpoint" => {
            out.push(("tiny qwen3-moe".into(), tiny_checkpoint()));
            out.push(("tiny qwen3-moe in two shards".into(), tiny_sharded_checkpoint()));
            out.push(("tiny qwen3-moe with Kimi's tiktoken.model".into(), tiny_kimi_checkpoint()));
            for f in ["next", "qwen35", "odd", "gpt-oss-mxfp4", "glm", "deepseek", "deepseek-noqlora"] {
                out.extend(fixture_checkpoint(root, f).map(|b| (format!("tests/fixtures/{f}"), b)));
            }
            out.extend(gpt_oss_bf16_checkpoint(root).map(|b| ("gpt-oss bf16 release layout".into(), b)));
            let mtp = derived_checkpoint(root, "deepseek", &moescope::derived_fixture::with_mtp_layer);
            out.extend(mtp.map(|b| ("deepseek with its MTP layer".into(), b)));
        }
        "package" => {
            out.extend(package_of(&tiny_checkpoint()).map(|b| ("tiny qwen3-moe package".into(), b)));
            for f in ["next", "gpt-oss-mxfp4", "glm", "deepseek"] {
                let pkg = fixture_checkpoint(root, f).and_then(|c| package_of(&c));
                out.extend(pkg.map(|b| (format!("{f} package"), b)));
            }
            let pkg = gpt_oss_bf16_checkpoint(root).and_then(|c| package_of(&c));
            out.extend(pkg.map(|b| ("gpt-oss bf16 package".into(), b)));
            let mtp = derived_checkpoint(root, "glm", &moescope::derived_fixture::with_mtp_layer);
            out.extend(mtp.and_then(|c| package_of(&c)).map(|b| ("glm package with its MTP layer".into(), b)));
            let k = package_of_gguf(&fixtures(root).join("gguf/tiny/tiny-q4_k_m.gguf"));
            out.extend(k.map(|b| ("tiny q4_k_m package (Q4_K blocks, k6 records)".into(), b)));
            for t in ["q8_0", "q4_0"] {
                let h = package_of_gguf(&fixtures(root).join(format!("gguf/tiny/tiny-{t}.gguf")));
                out.extend(h.map(|b| (format!("tiny {t} package (f16 scales)"), b)));
            }
            out.extend(low_bit_packages(root));
        }
        "gguf" => {
            for p in [
                "gguf/tiny.gguf",
                "gguf/next/next-moe-q8_0.gguf",
                "gguf/qwen35/qwen35-q8_0.gguf",
                "gguf/tiny/tiny-q4_k_m.gguf",
                "gguf/gpt-oss/gpt-oss-mxfp4.gguf",
                "gguf/glm/glm-q8_0.gguf",
                "gguf/deepseek/deepseek-q8_0.gguf",
                "gguf/harmony-vocab.gguf",
            ] {
                out.extend(std::fs::read(fixtures(root).join(p)).ok().map(|b| (format!("tests/fixtures/{p}"), b)));
            }
            out.extend(low_bit_ggufs(root));
        }
        "tool_calls" => {
            // each syntax's calls as its template prints them (serve/tools.rs's tests render
            // them), with text around them, as one whole and cut in 3-character pieces
            let replies = [
                (
                    0u8,
                    "Checking é.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
                ),
                (
                    0,
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=hourly>\nTrue\n</parameter>\n</function>\n</tool_call>\nok",
                ),
                (0, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
                (
                    1,
                    "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Zürich\", \"days\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                ),
                (
                    1,
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                ),
                (
                    2,
                    "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Zürich\"}<|tool_call_end|><|tool_calls_section_end|>",
                ),
            ];
            for (i, (syntax, text)) in replies.into_iter().enumerate() {
                for step in [255u8, 2] {
                    let mut b = vec![syntax, step];
                    b.extend_from_slice(text.as_bytes());
                    out.push((format!("tool calls {i}, pieces of {}", step as usize % 16 + 1), b));
                }
            }
        }
        "routing_trace" => {
            // the demo's trace (its first 300 records), plain, gzipped and in xz
            let trace = std::fs::read(root.join("traces/demo-routing-500.jsonl.xz"))
                .ok()
                .and_then(|xz| moescope::packed::xz_decompress(&xz, 1 << 24).ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            let head: String = trace.lines().take(301).map(|l| format!("{l}\n")).collect();
            out.push(("demo trace".into(), head.clone().into_bytes()));
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            let _ = std::io::Write::write_all(&mut gz, head.as_bytes());
            out.extend(gz.finish().ok().map(|b| ("demo trace, gzipped".into(), b)));
            let mut xz = Vec::new();
            if lzma_rs::xz_compress(&mut head.as_bytes(), &mut xz).is_ok() {
                out.push(("demo trace, xz".into(), xz));
            }
        }
        "chat_template" => {
            let m = messages().to_string();
            let t = tools().to_string();
            let mut templates = vec![("simple".to_string(), TEMPLATE.to_string())];
            if let Some(v) = file("assets/tokenizers/qwen3/tokenizer_config.json")
                .and_then(|(_, b)| serde_json::from_slice::<serde_json::Value>(&b).ok())
                && let Some(s) = v["chat_template"].as_str()
            {
                templates.push(("qwen3".into(), s.to_string()));
            }
            for (name, path) in [
                ("qwen3.5", "assets/tokenizers/qwen3.5/chat_template.jinja"),
                ("gpt-oss harmony", "assets/tokenizers/o200k_harmony/chat_template.jinja"),
                ("glm-4.6", "tests/fixtures/templates/GLM-4.6.jinja"),
                ("deepseek-v3.1", "tests/fixtures/templates/deepseek-ai-DeepSeek-V3.1.jinja"),
                ("kimi-k2", "tests/fixtures/templates/moonshotai-Kimi-K2.jinja"),
            ] {
                if let Some((_, b)) = file(path) {
                    templates.push((name.into(), String::from_utf8_lossy(&b).into_owned()));
                }
            }
            for (name, t_src) in templates {
                let b = bundle(&[("template", t_src.as_bytes()), ("messages", m.as_bytes()), ("tools", t.as_bytes())]);
                out.push((format!("{name} template"), b));
            }
        }
        "request" => {
            let m = messages();
            let bodies = [
                (0u8, serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})),
                (
                    0,
                    serde_json::json!({"messages": m, "tools": tools(), "max_tokens": 4, "stream": true,
                    "stream_options": {"include_usage": true}}),
                ),
                // the prompt's evaluation streamed as it goes (llama-server's `return_progress`)
                (
                    1,
                    serde_json::json!({"prompt": "fn main() {} ".repeat(40), "max_tokens": 2, "stream": true,
                    "return_progress": true}),
                ),
                (
                    0,
                    serde_json::json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 3, "logprobs": true,
                    "top_logprobs": 2, "logit_bias": {"5": -100}, "stop": ["x"], "presence_penalty": 0.5, "seed": 3,
                    "temperature": 0.7, "top_p": 0.9}),
                ),
                (
                    0,
                    serde_json::json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
                    "reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low",
                    "model_identity": "x", "builtin_tools": ["python"], "enable_thinking": false}}),
                ),
                // an XML function call (Qwen3.5, Qwen3-Coder) as the reply's start, typed by the
                // tools' schemas, streamed
                (
                    0,
                    serde_json::json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant",
                    "content": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"}],
                    "tools": tools(), "max_tokens": 2, "stream": true}),
                ),
                (1, serde_json::json!({"prompt": "fn main", "max_tokens": 4, "echo": true})),
                (1, serde_json::json!({"prompt": [1, 2, 3], "max_tokens": 2, "stream": true})),
                (2, serde_json::json!({"content": "hello world"})),
                (3, serde_json::json!({"tokens": [1, 2, 3]})),
                (4, serde_json::json!({"messages": m})),
            ];
            for (i, (route, body)) in bodies.into_iter().enumerate() {
                let mut b = vec![route];
                b.extend(body.to_string().into_bytes());
                out.push((format!("request {i}"), b));
            }
        }
        _ => {}
    }
    // the saved corpus, in name order; a large entry may be kept packed (NAME.xz: its bytes are
    // the unpacked ones, so the tracked tree stays small enough for a device call to carry), and
    // similar ones packed together as a set (see `corpus_set`)
    if let Ok(rd) = std::fs::read_dir(root.join("fuzz/corpus").join(target)) {
        let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect();
        files.sort();
        for p in files {
            let Ok(b) = std::fs::read(&p) else { continue };
            let b = match p.extension().is_some_and(|e| e == "xz") {
                true => match moescope::packed::xz_decompress(&b, 1 << 24) {
                    Ok(u) => u,
                    Err(_) => continue,
                },
                false => b,
            };
            match corpus_set(&b) {
                Some(set) => out.extend(set.into_iter().map(|(n, b)| (format!("{}: {n}", p.display()), b))),
                None => out.push((p.display().to_string(), b)),
            }
        }
    }
    out
}

/// First bytes of a corpus set: inputs that share most of their bytes (mutations of one seed)
/// packed as one file, so xz finds what they share (four 80 KB checkpoint crashes: 206 KB
/// packed one by one, 52 KB together).
pub const CORPUS_SET: &[u8] = b"moescope corpus set\n";

/// The inputs of a corpus set (after [`CORPUS_SET`], each: u32 LE name length, the name, u32 LE
/// length, the bytes): (name, bytes) each; None for any other file (or a damaged set).
pub fn corpus_set(b: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut rest = b.strip_prefix(CORPUS_SET)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(head)
    };
    let mut out = vec![];
    while let Some(len) = take(4) {
        let name = take(u32::from_le_bytes(len.try_into().ok()?) as usize)?;
        let name = String::from_utf8_lossy(name).into_owned();
        let len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        out.push((name, take(len)?.to_vec()));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corpus_set_gives_its_inputs_and_a_damaged_one_none() {
        let mut set = CORPUS_SET.to_vec();
        for (name, bytes) in [("a", &b"xyz"[..]), ("crash-b", &[0u8, 1, 2, 3][..])] {
            set.extend((name.len() as u32).to_le_bytes());
            set.extend(name.as_bytes());
            set.extend((bytes.len() as u32).to_le_bytes());
            set.extend(bytes);
        }
        let got = corpus_set(&set).expect("a set");
        assert_eq!(got, vec![("a".to_string(), b"xyz".to_vec()), ("crash-b".to_string(), vec![0, 1, 2, 3])]);
        assert_eq!(corpus_set(&set[..set.len() - 1]), None, "the last input cut short");
        assert_eq!(corpus_set(b"GGUF..."), None, "not a set");
        // the checkpoint crashes kept as one set: four inputs
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let b = std::fs::read(root.join("fuzz/corpus/checkpoint/crashes-80k.set.xz")).expect("the set");
        let b = moescope::packed::xz_decompress(&b, 1 << 24).expect("xz");
        assert_eq!(corpus_set(&b).map(|s| s.len()), Some(4));
    }
}
