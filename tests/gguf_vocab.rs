//! Tokenizers rebuilt from GGUF metadata (`tokenizer.ggml.*`) against the tokenizer.json they
//! came from. The GGUFs are vocabulary-only files llama.cpp's convert_hf_to_gguf.py --vocab-only
//! wrote from the real Qwen3 and Qwen3.5 tokenizers (assets/tokenizers; fixture:
//! tests/reference/make_gguf_fixtures.sh), so neither side of the comparison is moescope's.

mod common;

use common::{asset, fixture};
use moescope::convert::gguf::model::GgufModel;
use moescope::convert::gguf::vocab as gguf_vocab;
use moescope::engine::tokenizer::Tok;
use serde_json::Value;

/// The rebuilt tokenizer and what the GGUF says beside it.
fn from_gguf(name: &str) -> (Tok, moescope::package::TokenizerInfo) {
    let m = GgufModel::open(&fixture("gguf").join(format!("{name}.gguf"))).expect("open");
    let info = gguf_vocab::tokenizer(&m).expect("rebuild").expect("a tokenizer");
    let tok = Tok::from_json(info.tokenizer_json.as_deref().expect("json")).expect("load");
    (tok, info)
}

fn original(name: &str) -> Tok {
    Tok::from_json(&std::fs::read_to_string(asset(&format!("{name}/tokenizer.json"))).expect("tokenizer.json"))
        .expect("load")
}

/// The tokenizer tests' strings, and a few more: combining marks (where Qwen3.5's regex
/// differs from Qwen2's), special and added tokens inline, runs of spaces and newlines.
fn texts() -> Vec<String> {
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer_reference.json")).expect("fixture"))
            .expect("json");
    let mut v: Vec<String> =
        r["qwen3"].as_array().expect("rows").iter().map(|x| x["text"].as_str().unwrap().into()).collect();
    v.extend(
        [
            "e\u{301}te\u{301} cafe\u{301} Ñandú नमस्ते क्षत्रिय",
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
            "   leading spaces\n\n\n\ttabs\t\t and trailing   ",
            "emoji 🦀🦀 and CJK 混合专家模型, numbers 1234567 3.14159",
        ]
        .map(String::from),
    );
    v
}

fn same_as_tokenizer_json(name: &str) {
    let (ours, _) = from_gguf(&format!("{}-vocab", name.replace('.', "")));
    let theirs = original(name);
    let asset_name = name;
    for t in texts() {
        let want = theirs.encode(&t).unwrap();
        assert_eq!(ours.encode(&t).unwrap(), want, "{asset_name}: ids of {t:?}");
        for skip_special in [false, true] {
            let (a, b) = (ours.decode(&want, skip_special).unwrap(), theirs.decode(&want, skip_special).unwrap());
            assert_eq!(a, b, "{asset_name}: decode of {t:?} (skip_special {skip_special})");
        }
    }
}

#[test]
fn qwen3_vocabulary_tokenizes_as_its_tokenizer_json() {
    same_as_tokenizer_json("qwen3");
    // and as transformers did (tests/fixtures/tokenizer_reference.json)
    let (ours, info) = from_gguf("qwen3-vocab");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer_reference.json")).expect("fixture"))
            .expect("json");
    for row in r["qwen3"].as_array().expect("rows") {
        let want: Vec<u32> = row["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(ours.encode(row["text"].as_str().unwrap()).unwrap(), want);
    }
    assert_eq!(ours.token_id("<|im_end|>"), Some(151645));
    assert_eq!(ours.token_id("<think>"), Some(151667));
    assert_eq!(info.eos_token.as_deref(), Some("<|im_end|>"));
    assert!(info.chat_template.as_deref().is_some_and(|t| t.contains("<|im_start|>")), "the chat template comes along");
}

#[test]
fn qwen35_vocabulary_tokenizes_as_its_tokenizer_json() {
    same_as_tokenizer_json("qwen3.5");
}

/// gpt-oss's vocabulary (o200k_harmony cut to 1,024 ids) with llama.cpp's `gpt-4o`
/// pre-tokenizer, against tiktoken on the same ranks (tests/reference/make_harmony_vocab_gguf.py).
#[test]
fn gpt_4o_vocabulary_tokenizes_as_tiktoken() {
    let (tok, info) = from_gguf("harmony-vocab");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(fixture("gguf/harmony-vocab.json")).expect("fixture"))
        .expect("json");
    for row in r["rows"].as_array().expect("rows") {
        let text = row["text"].as_str().unwrap();
        let want: Vec<u32> = row["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.encode(text).unwrap(), want, "ids of {text:?}");
        assert_eq!(tok.decode(&want, false).unwrap(), text, "decode of {text:?}");
    }
    assert_eq!(tok.token_id("<|channel|>"), Some(1019));
    assert_eq!(info.eos_token.as_deref(), Some("<|return|>"));
}
