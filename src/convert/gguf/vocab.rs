//! The tokenizer of a GGUF file (`tokenizer.ggml.*`) rebuilt as a HuggingFace tokenizer.json,
//! as transformers' `gguf_tokenizer_mapping.py` and candle's `TokenizerFromGguf` do: a
//! byte-level BPE from the tokens (index = id) and merges, the split regex chosen by
//! `tokenizer.ggml.pre`, control tokens (type 3) as special added tokens and user-defined ones
//! (type 4, `<think>`) as plain added tokens. Two things the file does not say but the
//! original tokenizer.json does are set from the pre-tokenizer's name: an NFC normalizer (Qwen's),
//! and `ignore_merges` (Qwen3.5's vocabulary, and tiktoken's rule for gpt-oss's `gpt-4o`).

use serde_json::json;

use super::file::Value;
use super::model::GgufModel;
use crate::convert::byte_level_bpe::{KIMI_SPLIT, O200K_SPLIT, Parts, tokenizer_json};
use crate::convert::error::ConvertError;
use crate::engine::tokenizer::Tok;
use crate::package::TokenizerInfo;

/// Qwen2's split regex (Qwen2, Qwen3, Qwen3-Next: `tokenizer.ggml.pre = "qwen2"`).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's: letters take combining marks (`\p{M}`) along.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

fn strings<'a>(m: &'a GgufModel, key: &str) -> Result<Option<Vec<&'a str>>, ConvertError> {
    match m.get(key) {
        None => Ok(None),
        Some(Value::Array(_, v)) => v
            .iter()
            .enumerate()
            .map(|(i, x)| x.as_str().ok_or_else(|| m.config_err(key, format!("element {i} is not a string"))))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(v) => Err(m.config_err(key, format!("expected an array of strings, found {}", v.type_name()))),
    }
}

/// The package's tokenizer from `m`'s metadata; `None` when the file has no tokenizer.
pub fn tokenizer(m: &GgufModel) -> Result<Option<TokenizerInfo>, ConvertError> {
    let Some(model) = m.str_key("tokenizer.ggml.model")? else { return Ok(None) };
    if model != "gpt2" {
        return Err(m.config_err("tokenizer.ggml.model", format!("'{model}' is not supported (gpt2, byte-level BPE)")));
    }
    let pre = m.str_key("tokenizer.ggml.pre")?.unwrap_or("default");
    // (split regex, NFC first, ignore_merges)
    let (split, nfc, ignore_merges) = match pre {
        "qwen2" => (QWEN2_SPLIT, true, false),
        "qwen35" => (QWEN35_SPLIT, true, true),
        // gpt-oss's o200k_harmony (tiktoken's rules: no normalizer, a token piece taken whole)
        "gpt-4o" => (O200K_SPLIT, false, true),
        // Kimi-K2's tiktoken ranks (the same rules, its own regex)
        "kimi-k2" => (KIMI_SPLIT, false, true),
        other => {
            return Err(m.config_err(
                "tokenizer.ggml.pre",
                format!("pre-tokenizer '{other}' is not supported (qwen2, qwen35, gpt-4o, kimi-k2)"),
            ));
        }
    };
    let tokens =
        strings(m, "tokenizer.ggml.tokens")?.ok_or_else(|| m.config_err("tokenizer.ggml.tokens", "missing"))?;
    // a vocabulary of single bytes has no merges, and llama.cpp's converter then writes no key
    let merges = strings(m, "tokenizer.ggml.merges")?.unwrap_or_default();
    let types: Vec<i64> = match m.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(Value::Array(_, v)) if v.len() == tokens.len() => v
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::I32(t) => Ok(*t as i64),
                _ => Err(m.config_err("tokenizer.ggml.token_type", format!("element {i} is not an int32"))),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(m.config_err(
                "tokenizer.ggml.token_type",
                format!("expected {} int32 values, found {}", tokens.len(), v.type_name()),
            ));
        }
    };
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = vec![];
    for (id, (&t, &ty)) in tokens.iter().zip(&types).enumerate() {
        if ty == CONTROL || ty == USER_DEFINED {
            added.push((id as u32, t.to_string(), ty == CONTROL));
        }
        if vocab.insert(t.to_string(), json!(id)).is_some() {
            return Err(m.config_err("tokenizer.ggml.tokens", format!("token {t:?} appears twice (id {id})")));
        }
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, mg) in merges.iter().enumerate() {
        match mg.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => pairs.push(json!([a, b])),
            _ => return Err(m.config_err("tokenizer.ggml.merges", format!("merge {i} ({mg:?}) is not two tokens"))),
        }
    }
    let parts = Parts { vocab, merges: pairs, added, split, nfc, ignore_merges };
    let json = tokenizer_json(parts);
    Tok::from_json(&json)
        .map_err(|e| m.config_err("tokenizer.ggml.tokens", format!("the rebuilt tokenizer does not load: {e}")))?;
    let token = |key: &str| -> Result<Option<String>, ConvertError> {
        Ok(m.u64_key(key)?.and_then(|id| tokens.get(id as usize)).map(|t| t.to_string()))
    };
    Ok(Some(TokenizerInfo {
        tokenizer_json: Some(json),
        chat_template: m.str_key("tokenizer.chat_template")?.map(String::from),
        bos_token: token("tokenizer.ggml.bos_token_id")?,
        eos_token: token("tokenizer.ggml.eos_token_id")?,
        pad_token: token("tokenizer.ggml.padding_token_id")?,
    }))
}
