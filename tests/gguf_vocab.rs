//! Tokenizers rebuilt from GGUF metadata (`tokenizer.ggml.*`) against the tokenizer.json they
//! came from. The GGUFs are vocabulary-only files llama.cpp's convert_hf_to_gguf.py --vocab-only
//! wrote from the real Qwen3 and Qwen3.5 tokenizers (assets/tokenizers; fixture:
//! tests/reference/make_gguf_fixtures.sh), so neither side of the comparison is moescope's. The
//! Qwen3.5 file is kept without its token strings and merges, which its tokenizer.json gives
//! back; the rebuilt file is checked to be the one llama.cpp wrote, byte for byte.

mod common;

use common::{asset, fixture};
use moescope::convert::gguf::model::GgufModel;
use moescope::convert::gguf::vocab as gguf_vocab;
use moescope::engine::tokenizer::Tok;
use serde_json::Value;

/// The rebuilt tokenizer and what the GGUF says beside it.
fn from_gguf(name: &str) -> (Tok, moescope::package::TokenizerInfo) {
    let path = match name {
        "qwen35-vocab" => qwen35_vocab(),
        _ => fixture("gguf").join(format!("{name}.gguf")),
    };
    let m = GgufModel::open(&path).expect("open");
    let info = gguf_vocab::tokenizer(&m).expect("rebuild").expect("a tokenizer");
    let tok = Tok::from_json(info.tokenizer_json.as_deref().expect("json")).expect("load");
    (tok, info)
}

/// llama.cpp's qwen35-vocab.gguf: the kept file with its `tokenizer.ggml.tokens` and `merges`
/// put back from the Qwen3.5 tokenizer.json (tokens by id, holes as `[PAD{id}]`, merges as
/// "a b"; tests/reference/strip_vocab_gguf.py took them out), checked against the CRC-32 and
/// size of the file llama.cpp wrote.
fn qwen35_vocab() -> std::path::PathBuf {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let b = std::fs::read(fixture("gguf/qwen35-vocab-stripped.gguf")).expect("fixture");
        let t: Value = serde_json::from_slice(&std::fs::read(asset("qwen3.5/tokenizer.json")).expect("asset")).unwrap();
        let mut by_id: std::collections::HashMap<u64, &str> =
            t["model"]["vocab"].as_object().unwrap().iter().map(|(k, v)| (v.as_u64().unwrap(), k.as_str())).collect();
        by_id.extend(
            t["added_tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| (a["id"].as_u64().unwrap(), a["content"].as_str().unwrap())),
        );
        let merges = t["model"]["merges"].as_array().unwrap();
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        };
        let (mut out, mut o) = (b[..24].to_vec(), 24);
        let fixed = |t: u32| [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8][t as usize];
        for _ in 0..u64_at(16) {
            let key_end = o + 8 + u64_at(o) as usize;
            let key = std::str::from_utf8(&b[o + 8..key_end]).unwrap().to_string();
            let kind = u32::from_le_bytes(b[key_end..key_end + 4].try_into().unwrap());
            let mut end = key_end + 4;
            match kind {
                8 => end += 8 + u64_at(end) as usize,
                9 => {
                    let et = u32::from_le_bytes(b[end..end + 4].try_into().unwrap());
                    let n = u64_at(end + 4);
                    end += 12;
                    out.extend(&b[o..end]);
                    o = end;
                    match key.as_str() {
                        "tokenizer.ggml.tokens" => (0..n).for_each(|i| match by_id.get(&i) {
                            Some(t) => string(&mut out, t),
                            None => string(&mut out, &format!("[PAD{i}]")),
                        }),
                        "tokenizer.ggml.merges" => merges[..n as usize].iter().for_each(|m| match m {
                            Value::String(m) => string(&mut out, m),
                            m => string(&mut out, &format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap())),
                        }),
                        _ if et == 8 => (0..n).for_each(|_| end += 8 + u64_at(end) as usize),
                        _ => end += fixed(et) * n as usize,
                    }
                }
                k => end += fixed(k),
            }
            out.extend(&b[o..end]);
            o = end;
        }
        out.extend(&b[o..]);
        assert_eq!((out.len(), moescope::packed::crc32(&out)), (16102517, 0xb5c7867a), "llama.cpp's file, rebuilt");
        // beside the build, once per run (renamed into place: other test processes may read it)
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let (tmp, path) = (dir.join(format!("qwen35-vocab.{}", std::process::id())), dir.join("qwen35-vocab.gguf"));
        std::fs::write(&tmp, out).expect("writing the rebuilt GGUF");
        std::fs::rename(&tmp, &path).expect("renaming the rebuilt GGUF");
        path
    })
    .clone()
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
