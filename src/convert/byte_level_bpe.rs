//! A HuggingFace tokenizer.json for a byte-level BPE (GPT-2's byte-to-character mapping, a
//! split regex, then merges), the one shape both rebuilt tokenizers take: a GGUF file's
//! (`tokenizer.ggml.*`, gguf/vocab.rs) and tiktoken's rank files (tiktoken.rs).

use serde_json::{Map, Value, json};

/// The split regex of OpenAI's o200k vocabularies (tiktoken's `o200k_base` and
/// `o200k_harmony` pattern; llama.cpp's `gpt-4o` pre-tokenizer): words with their leading
/// punctuation and English contractions, numbers in runs of at most three digits.
pub const O200K_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// Kimi-K2's split regex (its `tokenization_kimi.py`; llama.cpp's `kimi-k2` pre-tokenizer):
/// o200k's, except that runs of Han characters are pieces of their own, kept out of the letter
/// classes by class intersection (`&&`, which fancy-regex takes), and no `/` after punctuation.
pub const KIMI_SPLIT: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// The tokenizer.json text.
pub struct Parts {
    /// token (byte-level characters) -> id
    pub vocab: Map<String, Value>,
    /// `[left, right]` pairs in priority order
    pub merges: Vec<Value>,
    /// `(id, content, special)`: tokens matched before the split (control tokens special)
    pub added: Vec<(u32, String, bool)>,
    pub split: &'static str,
    /// Qwen's tokenizers normalize to NFC first; OpenAI's do not.
    pub nfc: bool,
    /// A piece that is itself a token is that token, merges or not (tiktoken's rule, and
    /// Qwen3.5's tokenizer.json).
    pub ignore_merges: bool,
}

pub fn tokenizer_json(p: Parts) -> String {
    let added: Vec<Value> = p
        .added
        .into_iter()
        .map(|(id, content, special)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": special})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": if p.nfc { json!({"type": "NFC"}) } else { Value::Null },
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": p.split}, "behavior": "Isolated", "invert": false},
            byte_level.clone(),
        ]},
        "post_processor": byte_level.clone(),
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": p.ignore_merges, "vocab": p.vocab, "merges": p.merges,
        },
    })
    .to_string()
}

/// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the other 68
/// take the characters from U+0100 on, in byte order.
pub fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for (b, c) in out.iter_mut().enumerate() {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *c = char::from_u32(code).unwrap_or('\u{FFFD}');
    }
    out
}

/// `bytes` in byte-level characters.
pub fn to_chars(table: &[char; 256], bytes: &[u8]) -> String {
    bytes.iter().map(|&b| table[b as usize]).collect()
}
