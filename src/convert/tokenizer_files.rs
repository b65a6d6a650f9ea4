//! The tokenizer files of a checkpoint -> what the package embeds.

use std::path::Path;

use serde_json::Value;

use super::error::ConvertError;
use super::hf_config::read_json;
use crate::engine::tokenizer::Tok;
use crate::package::TokenizerInfo;

/// Read tokenizer.json, tokenizer_config.json and chat_template.jinja from `dir`. A missing
/// tokenizer.json is not an error (the package then takes token ids only); a broken one is.
pub fn read_tokenizer(dir: &Path) -> Result<Option<TokenizerInfo>, ConvertError> {
    let tj = dir.join("tokenizer.json");
    if !tj.exists() {
        return Ok(None);
    }
    let json = std::fs::read_to_string(&tj).map_err(|source| ConvertError::Io { path: tj.clone(), error: source })?;
    // load it now, so a bad file fails the conversion rather than the first run
    Tok::from_json(&json).map_err(|e| ConvertError::File { path: tj.clone(), msg: format!("cannot load: {e}") })?;
    let mut info = TokenizerInfo { tokenizer_json: Some(json), ..Default::default() };
    let tc = dir.join("tokenizer_config.json");
    if tc.exists() {
        let v = read_json(&tc)?;
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

/// A special token as written in tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}
