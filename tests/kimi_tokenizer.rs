//! Kimi-K2's tokenizer (a tiktoken.model and tokenization_kimi.py's rules, no tokenizer.json)
//! against tiktoken (tests/fixtures/kimi_reference.json, tests/reference/make_kimi_tokenizer_fixtures.py):
//! its split pattern, special tokens from tokenizer_config.json, encoding with specials inline.
//! Kimi's own rank file is not on this machine; the ranks are o200k_base's first 163,584 (Kimi's
//! count), written here as a tiktoken.model from assets/tokenizers/o200k_harmony/ranks.bin.

mod common;

use std::path::Path;

use moescope::convert::tokenizer_files::read_tokenizer;
use moescope::engine::tokenizer::Tok;
use serde_json::Value;

/// A checkpoint folder's tokenizer files: tiktoken.model of `n` ranks and `config`.
fn kimi_dir(dir: &Path, n: usize, config: &Value) {
    let bin = moescope::synth::tokenizers::harmony_ranks().expect("o200k ranks");
    let ranks = moescope::convert::tiktoken::parse_ranks(&bin).expect("ranks");
    std::fs::write(dir.join("tiktoken.model"), moescope::convert::tiktoken::tiktoken_model_text(&ranks[..n])).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

fn reference() -> (Value, Value) {
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(common::fixture(name)).expect("fixture")).expect("json")
    };
    (read("kimi_reference.json"), read("kimi/tokenizer_config.json"))
}

/// The reference's Kimi tokenizer, read from a checkpoint folder as `convert` reads it.
fn kimi_tok() -> (Tok, moescope::package::TokenizerInfo) {
    let (r, config) = reference();
    let dir = tempfile::tempdir().unwrap();
    kimi_dir(dir.path(), r["n_ranks"].as_u64().unwrap() as usize, &config);
    let info = read_tokenizer(dir.path()).expect("read").expect("a tokenizer");
    let tok = Tok::from_json(info.tokenizer_json.as_deref().unwrap()).expect("load");
    (tok, info)
}

#[test]
fn kimi_tiktoken_model_encodes_as_tiktoken() {
    let (r, _) = reference();
    let (tok, info) = kimi_tok();
    assert_eq!(tok.vocab_size(), 163_840);
    assert_eq!((info.bos_token.as_deref(), info.eos_token.as_deref()), (Some("[BOS]"), Some("[EOS]")));
    assert!(info.chat_template.as_deref().is_some_and(|t| t.contains("<|im_middle|>")));
    for (name, id) in [("[BOS]", 163_584), ("<|im_end|>", 163_586), ("<|im_middle|>", 163_601), ("[PAD]", 163_839)] {
        assert_eq!(tok.token_id(name), Some(id), "{name}");
    }
    assert_eq!(tok.token_id("<|reserved_token_163600|>"), Some(163_600));
    let rows = r["encode"].as_array().unwrap();
    for row in rows {
        let text = row["text"].as_str().unwrap();
        let want: Vec<u32> = row["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.encode(text).unwrap(), want, "ids of {text:?}");
        assert_eq!(tok.decode(&want, false).unwrap(), text, "decode of {text:?}");
    }
    assert!(rows.len() >= 20);
}

#[test]
fn a_tiktoken_model_of_another_tokenizer_class_is_refused() {
    let (_, mut config) = reference();
    let dir = tempfile::tempdir().unwrap();
    config["auto_map"]["AutoTokenizer"][0] = "tokenization_other.Tok".into();
    kimi_dir(dir.path(), 300, &config);
    let e = read_tokenizer(dir.path()).unwrap_err().to_string();
    assert!(e.contains("auto_map.AutoTokenizer") && e.contains("tokenization_other.Tok"), "{e}");
    // a special token's id inside the ranks
    let (_, mut config) = reference();
    config["added_tokens_decoder"] = serde_json::json!({"12": {"content": "[X]"}});
    kimi_dir(dir.path(), 300, &config);
    let e = read_tokenizer(dir.path()).unwrap_err().to_string();
    assert!(e.contains("added_tokens_decoder.12"), "{e}");
    // a broken rank line
    std::fs::write(dir.path().join("tiktoken.model"), "IQ== 0\nnot-base64! 1\n").unwrap();
    let e = read_tokenizer(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tiktoken.model") && e.contains("line 2"), "{e}");
}

/// A Kimi-K2 reply's tool-call markers are special tokens: the reply's decoder keeps them (and
/// skips the other special tokens), token by token, so the server's splitter finds the calls.
#[test]
fn a_replys_call_markers_survive_streamed_decoding_and_split_into_calls() {
    use moescope::engine::call_syntax::CallSyntax;
    use moescope::engine::tokenizer::StreamDecoder;
    use moescope::serve::tools::split_reply;
    let (tok, _) = kimi_tok();
    let reply = "Checking é.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Zürich\"}<|tool_call_end|><|tool_calls_section_end|>";
    let mut ids = tok.encode(reply).unwrap();
    let marker = tok.token_id("<|tool_call_begin|>").expect("a marker token");
    assert!(ids.contains(&marker), "the markers are single tokens");
    let plain_decode = tok.decode(&ids, true).unwrap();
    assert!(!plain_decode.contains("<|tool_call_begin|>"), "they are special: skipped by a plain decode");
    ids.push(tok.token_id("<|im_end|>").unwrap());
    let kept = CallSyntax::Kimi.kept_tokens(|t| tok.token_id(t)).expect("kept");
    let mut dec = StreamDecoder::keeping(&tok, kept);
    let mut text = String::new();
    for &id in &ids {
        text.extend(dec.push(id).unwrap());
    }
    text.extend(dec.flush().unwrap());
    assert_eq!(text, reply, "kept markers, the other special tokens skipped");
    let (content, calls) = split_reply(CallSyntax::Kimi, None, &text, None);
    assert_eq!(content.as_deref(), Some("Checking é."));
    assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", "{\"city\": \"Zürich\"}"));
}
