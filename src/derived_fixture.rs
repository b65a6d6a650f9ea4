//! Checkpoints the tests and the fuzz seeds derive from a committed fixture instead of
//! committing them too (the tracked tree stays under 60 MiB, issue 41).
//!
//! [gpt_oss_bf16_release]: gpt-oss's bf16 release layout (experts `[E, in, out]`, gate and up
//! interleaved by column) from the MXFP4 release fixture. MXFP4 values times a power of two are
//! bf16 values, so the widened checkpoint holds the same weights and transformers' reference
//! logits of the MXFP4 fixture are its references too. The decoding here is deliberately
//! separate from the engine's (`moescope_kernels::mxfp4`): a plain table lookup, so a test that
//! converts the widened checkpoint checks the converter's bf16 path against the MXFP4 one, and
//! the tests compare layer 0 with transformers' own dequantized tensors.
//!
//! [with_mtp_layer]: the DeepSeek-V3 or GLM-4.5 fixture with the multi-token-prediction layer
//! its config states, as those checkpoints hold it (the main model's weights the same).
//!
//! [sharded]: a one-file checkpoint split into shards with the hub's index
//! (`model.safetensors.index.json`: `metadata.total_size` and `weight_map`), the same weights, so
//! the one-file fixture's references are its own.

use std::path::Path;

use serde_json::{Map, Value};

/// The ids of the harmony tokenizer [gpt_oss_harmony_chat] gives the 1,024-row fixture: the
/// first 1,015 o200k ranks, then these nine (by name, in o200k_harmony's order).
pub const HARMONY_SPECIALS: [&str; 9] = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
];

/// The MXFP4 fixture `src` (vocabulary 1,024) made a harmony chat model in `out`: its
/// checkpoint with a tokenizer cut from o200k_harmony to fit (o200k_base's first 1,015 ranks, the
/// nine named harmony tokens after them: [HARMONY_SPECIALS]), gpt-oss's chat template, and
/// `<|return|>` and `<|call|>` as end of sequence. Its weights are random, so what it writes is
/// noise, but in the format's frame: tests steer it with an assistant prefill.
pub fn gpt_oss_harmony_chat(src: &Path, out: &Path) -> Result<(), String> {
    use crate::convert::{byte_level_bpe::O200K_SPLIT, tiktoken};
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), out.join(f)).map_err(|e| format!("{}: {e}", src.join(f).display()))?;
    }
    let bin = crate::synth::tokenizers::harmony_ranks()?;
    let ranks = tiktoken::parse_ranks(&bin)?;
    let n = 1024 - HARMONY_SPECIALS.len();
    let specials: Vec<(String, u32)> =
        HARMONY_SPECIALS.iter().enumerate().map(|(i, s)| (s.to_string(), (n + i) as u32)).collect();
    let json = tiktoken::tokenizer_from_ranks(&ranks[..n], &specials, O200K_SPLIT)?;
    let info = crate::synth::tokenizers::load(crate::synth::shapes::TokFamily::Harmony)?;
    let template = info.chat_template.ok_or("no harmony template")?;
    let id = |name: &str| specials.iter().find(|(s, _)| s == name).map_or(0, |(_, i)| *i);
    let write =
        |f: &str, b: &[u8]| std::fs::write(out.join(f), b).map_err(|e| format!("{}: {e}", out.join(f).display()));
    write("tokenizer.json", json.as_bytes())?;
    write("chat_template.jinja", template.as_bytes())?;
    let tc = serde_json::json!({"eos_token": "<|return|>", "pad_token": "<|endoftext|>"});
    write("tokenizer_config.json", tc.to_string().as_bytes())?;
    let gc = serde_json::json!({"eos_token_id": [id("<|return|>"), id("<|call|>")]});
    write("generation_config.json", gc.to_string().as_bytes())
}

/// FP4 e2m1 codes (sign, 2 exponent bits, 1 mantissa bit) as values: OCP MX spec table.
const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Write into `out` (a folder that exists) the bf16 form of the hub MXFP4 gpt-oss checkpoint in
/// `src` (one `model.safetensors`): `NAME_blocks` `[E, R, C/32, 16]` with `NAME_scales`
/// `[E, R, C/32]` (row r's 32-value groups; low nibble first; scale = 2^(e8m0 - 127)) becomes
/// `NAME` `[E, C, R]` in bf16, as transformers' dequantizer transposes it; every other tensor
/// and config.json (without its `quantization_config`) are copied.
pub fn gpt_oss_bf16_release(src: &Path, out: &Path) -> Result<(), String> {
    let read = |f: &str| std::fs::read(src.join(f)).map_err(|e| format!("{}: {e}", src.join(f).display()));
    let mut config: Value = serde_json::from_slice(&read("config.json")?).map_err(|e| format!("config.json: {e}"))?;
    if let Some(c) = config.as_object_mut() {
        c.remove("quantization_config");
    }
    let bytes = read("model.safetensors")?;
    let (header, data) = split(&bytes)?;
    let mut tensors: Vec<(String, Value, Vec<u8>)> = Vec::new();
    for (name, t) in &header {
        if name == "__metadata__" || name.ends_with("_scales") {
            continue;
        }
        let body = slice(data, t, name)?;
        let Some(stem) = name.strip_suffix("_blocks") else {
            tensors.push((name.clone(), t.clone(), body.to_vec()));
            continue;
        };
        let scales_name = format!("{stem}_scales");
        let st = header.get(&scales_name).ok_or(format!("{name}: no {scales_name}"))?;
        let [e_n, rows, groups, 16] = dims(t, name)?[..] else { return Err(format!("{name}: not [E, R, G, 16]")) };
        let scales = slice(data, st, &scales_name)?;
        if body.len() != e_n * rows * groups * 16 || scales.len() != e_n * rows * groups {
            return Err(format!("{name}: sizes do not match its shape"));
        }
        let cols = groups * 32;
        let mut wide = vec![0u8; e_n * cols * rows * 2];
        for e in 0..e_n {
            for r in 0..rows {
                for c in 0..cols {
                    let g = (e * rows + r) * groups + c / 32;
                    let byte = body[g * 16 + (c % 32) / 2];
                    let code = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
                    let v = E2M1[code as usize] * 2f32.powi(scales[g] as i32 - 127);
                    let at = ((e * cols + c) * rows + r) * 2;
                    wide[at..at + 2].copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
                }
            }
        }
        let t = serde_json::json!({"dtype": "BF16", "shape": [e_n, cols, rows]});
        tensors.push((stem.to_string(), t, wide));
    }
    let config = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
    let write =
        |f: &str, b: &[u8]| std::fs::write(out.join(f), b).map_err(|e| format!("{}: {e}", out.join(f).display()));
    write("config.json", &config)?;
    write("model.safetensors", &join(tensors))
}

/// Write into `out` (a folder that exists) the checkpoint in `src` (config.json and one
/// `model.safetensors`) as `shards` files `model-0000i-of-0000n.safetensors`, the tensors in the
/// file's order cut where the bytes so far pass each shard's share, and the index naming each
/// tensor's file.
pub fn sharded(src: &Path, out: &Path, shards: usize) -> Result<(), String> {
    let read = |f: &str| std::fs::read(src.join(f)).map_err(|e| format!("{}: {e}", src.join(f).display()));
    let write =
        |f: &str, b: &[u8]| std::fs::write(out.join(f), b).map_err(|e| format!("{}: {e}", out.join(f).display()));
    write("config.json", &read("config.json")?)?;
    let bytes = read("model.safetensors")?;
    let (header, data) = split(&bytes)?;
    let share = data.len().div_ceil(shards.max(1));
    let (mut parts, mut map, mut done) = (vec![Vec::new(); shards.max(1)], Map::new(), 0usize);
    for (name, t) in header.iter().filter(|(n, _)| *n != "__metadata__") {
        let body = slice(data, t, name)?;
        let i = (done / share).min(parts.len() - 1);
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, parts.len());
        map.insert(name.clone(), Value::String(file));
        parts[i].push((name.clone(), t.clone(), body.to_vec()));
        done += body.len();
    }
    let n = parts.len();
    for (i, tensors) in parts.into_iter().enumerate() {
        write(&format!("model-{:05}-of-{n:05}.safetensors", i + 1), &join(tensors))?;
    }
    let index = serde_json::json!({"metadata": {"total_size": done}, "weight_map": map});
    write("model.safetensors.index.json", index.to_string().as_bytes())
}

/// A DeepSeek-V3 or GLM-4.5 fixture `src` (a one-file checkpoint whose config states one
/// multi-token-prediction layer, L = `num_hidden_layers`, but holds none) with that layer added as
/// those models' checkpoints hold it: layer L-1's tensors renamed to layer L with each one's
/// values reversed (so none equals the tensor it came from), `enorm`, `hnorm` and
/// `shared_head.norm` as 1 + small values and `eh_proj` `[h, 2h]` from a fixed sequence, and
/// copies of the embedding and output layer (`embed_tokens`, `shared_head.head`). The main
/// model's weights are untouched, so `src`'s references are its own.
pub fn with_mtp_layer(src: &Path, out: &Path) -> Result<(), String> {
    let read = |f: &str| std::fs::read(src.join(f)).map_err(|e| format!("{}: {e}", src.join(f).display()));
    let config: Value = serde_json::from_slice(&read("config.json")?).map_err(|e| format!("config.json: {e}"))?;
    let layers = config["num_hidden_layers"].as_u64().ok_or("config.json: no num_hidden_layers")? as usize;
    let h = config["hidden_size"].as_u64().ok_or("config.json: no hidden_size")? as usize;
    let bytes = read("model.safetensors")?;
    let (header, data) = split(&bytes)?;
    let mut tensors = vec![];
    let (from, to) = (format!("model.layers.{}.", layers - 1), format!("model.layers.{layers}."));
    let mut added = vec![];
    for (name, t) in header.iter().filter(|(n, _)| *n != "__metadata__") {
        let body = slice(data, t, name)?;
        tensors.push((name.clone(), t.clone(), body.to_vec()));
        if t["dtype"] != "BF16" {
            return Err(format!("{name}: {} (the fixture's tensors are BF16)", t["dtype"]));
        }
        let copy = |n: &str| (format!("{to}{n}"), t.clone(), body.to_vec());
        if let Some(rest) = name.strip_prefix(&from) {
            let rev: Vec<u8> = body.chunks(2).rev().flatten().copied().collect();
            added.push((format!("{to}{rest}"), t.clone(), rev));
        } else if name == "model.embed_tokens.weight" {
            added.push(copy("embed_tokens.weight"));
        } else if name == "lm_head.weight" {
            added.push(copy("shared_head.head.weight"));
        }
    }
    // bf16 of 1 + k/256 and of (k mod 61 - 30)/512: exact, varied, finite
    let bf16 = |x: f32| ((x.to_bits() + 0x8000) >> 16) as u16;
    let vector =
        |n: usize, f: &dyn Fn(usize) -> f32| -> Vec<u8> { (0..n).flat_map(|k| bf16(f(k)).to_le_bytes()).collect() };
    for (i, n) in ["enorm.weight", "hnorm.weight", "shared_head.norm.weight"].iter().enumerate() {
        let body = vector(h, &|k| 1.0 + ((k * 7 + i * 13) % 32) as f32 / 256.0);
        added.push((format!("{to}{n}"), serde_json::json!({"dtype": "BF16", "shape": [h]}), body));
    }
    let body = vector(2 * h * h, &|k| ((k * 37) % 61) as f32 / 512.0 - 30.0 / 512.0);
    added.push((format!("{to}eh_proj.weight"), serde_json::json!({"dtype": "BF16", "shape": [h, 2 * h]}), body));
    tensors.extend(added);
    let write =
        |f: &str, b: &[u8]| std::fs::write(out.join(f), b).map_err(|e| format!("{}: {e}", out.join(f).display()));
    write("config.json", &read("config.json")?)?;
    write("model.safetensors", &join(tensors))
}

fn split(b: &[u8]) -> Result<(Map<String, Value>, &[u8]), String> {
    let n = b.get(..8).map(|h| u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]) as usize);
    let h = n.and_then(|n| b.get(8..8usize.checked_add(n)?)).ok_or("model.safetensors: short header")?;
    let header: Map<String, Value> = serde_json::from_slice(h).map_err(|e| format!("model.safetensors: {e}"))?;
    Ok((header, &b[8 + h.len()..]))
}

fn dims(t: &Value, name: &str) -> Result<Vec<usize>, String> {
    let s = t["shape"].as_array().ok_or(format!("{name}: no shape"))?;
    s.iter().map(|d| d.as_u64().map(|d| d as usize).ok_or(format!("{name}: bad shape"))).collect()
}

fn slice<'a>(data: &'a [u8], t: &Value, name: &str) -> Result<&'a [u8], String> {
    let o = |i: usize| t["data_offsets"][i].as_u64().map(|v| v as usize);
    let (Some(s), Some(e)) = (o(0), o(1)) else { return Err(format!("{name}: no data_offsets")) };
    data.get(s..e).ok_or(format!("{name}: data_offsets past the file"))
}

/// A safetensors file of `tensors` (header entries without offsets, and their bytes), in order.
fn join(tensors: Vec<(String, Value, Vec<u8>)>) -> Vec<u8> {
    let (mut header, mut data) = (Map::new(), Vec::new());
    for (name, mut t, body) in tensors {
        t["data_offsets"] = serde_json::json!([data.len(), data.len() + body.len()]);
        header.insert(name, t);
        data.extend(body);
    }
    let mut h = Value::Object(header).to_string().into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}
