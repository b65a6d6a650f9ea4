//! The real tokenizers a synthetic package carries (assets/tokenizers/, see its README):
//! embedded in the binary by default; a build without the `embedded-tokenizers` feature (the
//! lean device binary) reads them from `$MOESCOPE_ASSETS` or `./assets`.

use std::path::PathBuf;

use super::shapes::TokFamily;
use crate::package::TokenizerInfo;

/// tokenizer.json packed (`crate::packed`), and the chat template source.
#[cfg(feature = "embedded-tokenizers")]
fn embedded(f: TokFamily) -> Option<(&'static [u8], &'static str)> {
    Some(match f {
        TokFamily::Absent => return None,
        TokFamily::Qwen3 => (
            include_bytes!("../../assets/tokenizers/qwen3/tokenizer.json.xz"),
            include_str!("../../assets/tokenizers/qwen3/tokenizer_config.json"),
        ),
        TokFamily::Qwen35 => (
            include_bytes!("../../assets/tokenizers/qwen3.5/tokenizer.json.xz"),
            include_str!("../../assets/tokenizers/qwen3.5/chat_template.jinja"),
        ),
        TokFamily::Harmony => (
            include_bytes!("../../assets/tokenizers/o200k_harmony/ranks.bin.xz"),
            include_str!("../../assets/tokenizers/o200k_harmony/chat_template.jinja"),
        ),
    })
}

#[cfg(not(feature = "embedded-tokenizers"))]
fn embedded(_: TokFamily) -> Option<(&'static [u8], &'static str)> {
    None
}

fn folder(f: TokFamily) -> &'static str {
    match f {
        TokFamily::Qwen3 => "qwen3",
        TokFamily::Qwen35 => "qwen3.5",
        TokFamily::Harmony => "o200k_harmony",
        TokFamily::Absent => "none",
    }
}

fn template_file(f: TokFamily) -> &'static str {
    match f {
        TokFamily::Qwen3 => "tokenizer_config.json",
        TokFamily::Qwen35 | TokFamily::Harmony | TokFamily::Absent => "chat_template.jinja",
    }
}

fn packed_file(f: TokFamily) -> &'static str {
    match f {
        TokFamily::Qwen3 | TokFamily::Qwen35 | TokFamily::Absent => "tokenizer.json",
        TokFamily::Harmony => "ranks.bin",
    }
}

/// o200k_base's ranks (`ranks.bin`, unpacked), for [`crate::convert::tiktoken`].
pub fn harmony_ranks() -> Result<Vec<u8>, String> {
    let xz: Vec<u8> = match embedded(TokFamily::Harmony) {
        Some((xz, _)) => xz.to_vec(),
        None => {
            let root = std::env::var_os("MOESCOPE_ASSETS").map_or_else(|| PathBuf::from("assets"), PathBuf::from);
            let p = root.join("tokenizers/o200k_harmony/ranks.bin.xz");
            std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?
        }
    };
    crate::packed::unpack("ranks.bin", &xz)
}

/// The family's tokenizer as a package embeds it (none for `Absent`).
pub fn load(f: TokFamily) -> Result<TokenizerInfo, String> {
    if f == TokFamily::Absent {
        return Ok(TokenizerInfo::default());
    }
    let (xz, tmpl): (Vec<u8>, String) = match embedded(f) {
        Some((xz, t)) => (xz.to_vec(), t.to_string()),
        None => {
            let root = std::env::var_os("MOESCOPE_ASSETS").map_or_else(|| PathBuf::from("assets"), PathBuf::from);
            let dir = root.join("tokenizers").join(folder(f));
            let read = |name: &str| {
                let p = dir.join(name);
                std::fs::read(&p).map_err(|e| {
                    format!("{}: {e} (this build has no embedded tokenizers: run from the repository, or set MOESCOPE_ASSETS to its assets folder)", p.display())
                })
            };
            let t = read(template_file(f))?;
            (read(&format!("{}.xz", packed_file(f)))?, String::from_utf8_lossy(&t).into_owned())
        }
    };
    let bytes = crate::packed::unpack(packed_file(f), &xz).map_err(|e| format!("{} tokenizer: {e}", folder(f)))?;
    let json = match f {
        // o200k_base's ranks, made into a tokenizer.json here
        TokFamily::Harmony => {
            use crate::convert::{byte_level_bpe::O200K_SPLIT, tiktoken};
            let ranks = tiktoken::parse_ranks(&bytes)?;
            tiktoken::tokenizer_from_ranks(&ranks, &tiktoken::harmony_specials(), O200K_SPLIT)?
        }
        _ => String::from_utf8(bytes).map_err(|e| format!("{} tokenizer: {e}", folder(f)))?,
    };
    let info = match f {
        TokFamily::Qwen3 => {
            let v: serde_json::Value =
                serde_json::from_str(&tmpl).map_err(|e| format!("qwen3 tokenizer_config.json: {e}"))?;
            let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(String::from);
            TokenizerInfo {
                tokenizer_json: Some(json),
                chat_template: s("chat_template"),
                bos_token: None,
                eos_token: s("eos_token"),
                pad_token: s("pad_token"),
            }
        }
        // no tokenizer_config.json ships with it: the tokens Qwen3.5's config names
        TokFamily::Qwen35 => TokenizerInfo {
            tokenizer_json: Some(json),
            chat_template: Some(tmpl),
            bos_token: None,
            eos_token: Some("<|im_end|>".into()),
            pad_token: Some("<|endoftext|>".into()),
        },
        // gpt-oss's tokenizer_config.json: a reply ends with <|return|> (or <|call|>: the
        // package's eos ids hold both)
        TokFamily::Harmony => TokenizerInfo {
            tokenizer_json: Some(json),
            chat_template: Some(tmpl),
            bos_token: None,
            eos_token: Some("<|return|>".into()),
            pad_token: Some("<|endoftext|>".into()),
        },
        TokFamily::Absent => TokenizerInfo::default(),
    };
    Ok(info)
}
