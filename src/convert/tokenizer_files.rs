//! The tokenizer files of a checkpoint -> what the package embeds.

use std::path::Path;

use serde_json::Value;

use super::error::ConvertError;
use super::hf_config::read_json;
use crate::engine::tokenizer::Tok;
use crate::package::TokenizerInfo;

/// Read tokenizer.json, tokenizer_config.json and chat_template.jinja from `dir`. A missing
/// tokenizer.json is not an error (the package then takes token ids only); a broken one is.
/// Kimi-K2 has no tokenizer.json: its tiktoken.model is read instead.
pub fn read_tokenizer(dir: &Path) -> Result<Option<TokenizerInfo>, ConvertError> {
    let (tj, tm, tc) = (dir.join("tokenizer.json"), dir.join("tiktoken.model"), dir.join("tokenizer_config.json"));
    if !tj.exists() && !tm.exists() {
        return Ok(None);
    }
    let config = if tc.exists() { Some(read_json(&tc)?) } else { None };
    let (json, from) = if tj.exists() {
        (std::fs::read_to_string(&tj).map_err(|source| ConvertError::Io { path: tj.clone(), error: source })?, &tj)
    } else {
        (kimi_tokenizer(&tm, config.as_ref(), &tc)?, &tm)
    };
    // load it now, so a bad file fails the conversion rather than the first run
    Tok::from_json(&json).map_err(|e| ConvertError::File { path: from.clone(), msg: format!("cannot load: {e}") })?;
    let mut info = TokenizerInfo { tokenizer_json: Some(json), ..Default::default() };
    if let Some(v) = config {
        info.chat_template = template_of(&v, &tc)?;
        info.bos_token = token_text(v.get("bos_token"));
        info.eos_token = token_text(v.get("eos_token"));
        info.pad_token = token_text(v.get("pad_token"));
    }
    // transformers 5 saves the template beside the config; it wins, as in transformers
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        info.chat_template = Some(
            std::fs::read_to_string(&jinja)
                .map_err(|source| ConvertError::Io { path: jinja.clone(), error: source })?,
        );
    }
    Ok(Some(info))
}

fn template_of(v: &Value, path: &Path) -> Result<Option<String>, ConvertError> {
    match v.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // a list of named templates: take "default"
        Some(Value::Array(a)) => Ok(a
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(String::from)),
        Some(_) => Err(ConvertError::Config {
            path: path.to_path_buf(),
            key: "chat_template".into(),
            msg: "expected a string or a list of named templates".into(),
        }),
    }
}

/// The tokenizer.json of Kimi's tiktoken.model: its ranks, the special tokens its
/// tokenization_kimi.py makes from tokenizer_config.json's `added_tokens_decoder`, and the split
/// regex that Python file holds (so the config must name that tokenizer class).
fn kimi_tokenizer(tm: &Path, config: Option<&Value>, tc: &Path) -> Result<String, ConvertError> {
    let class = config.and_then(|v| v.get("auto_map")?.get("AutoTokenizer")?.get(0)?.as_str());
    if class != Some("tokenization_kimi.TikTokenTokenizer") {
        return Err(ConvertError::Config {
            path: tc.to_path_buf(),
            key: "auto_map.AutoTokenizer".into(),
            msg: format!(
                "a tiktoken.model is read for Kimi's tokenizer (tokenization_kimi.TikTokenTokenizer) only, found {class:?}"
            ),
        });
    }
    let text =
        std::fs::read_to_string(tm).map_err(|source| ConvertError::Io { path: tm.to_path_buf(), error: source })?;
    let file_err = |msg: String| ConvertError::File { path: tm.to_path_buf(), msg };
    let ranks = super::tiktoken::parse_tiktoken_model(&text).map_err(file_err)?;
    let n = u32::try_from(ranks.len()).map_err(|_| file_err("too many ranks".into()))?;
    let mut named = std::collections::BTreeMap::new();
    let decoder = config.and_then(|v| v.get("added_tokens_decoder")).and_then(|d| d.as_object());
    for (id, tok) in decoder.into_iter().flatten() {
        let bad = |msg: String| ConvertError::Config {
            path: tc.to_path_buf(),
            key: format!("added_tokens_decoder.{id}"),
            msg,
        };
        let at: u32 = id.parse().map_err(|_| bad("the key is not a token id".into()))?;
        if at < n || at >= n + (1 << 16) {
            return Err(bad(format!("a special token's id must follow the {n} ranks")));
        }
        named.insert(at, token_text(Some(tok)).ok_or_else(|| bad("no content".into()))?);
    }
    let specials = super::tiktoken::kimi_specials(n, &named);
    let refs: Vec<&[u8]> = ranks.iter().map(Vec::as_slice).collect();
    super::tiktoken::tokenizer_from_ranks(&refs, &specials, super::byte_level_bpe::KIMI_SPLIT).map_err(file_err)
}

/// A special token as written in tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}
