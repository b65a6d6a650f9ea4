//! Tokenizer and chat template against Python: token ids from the `tokenizers` library and
//! prompts from transformers' `apply_chat_template` (tests/reference/make_tokenizer_fixtures.py),
//! for the real Qwen3 tokenizer and the demo tokenizer.

mod common;

use common::fixture;
use moescope::engine::chat_template::{ChatTemplate, Message};
use moescope::engine::tokenizer::{StreamDecoder, Tok};
use serde_json::Value;

/// The tokenizers `moescope synth` embeds (assets/tokenizers/).
fn asset(name: &str) -> std::path::PathBuf {
    common::asset(name)
}

fn qwen3_json() -> String {
    std::fs::read_to_string(asset("qwen3/tokenizer.json")).expect("qwen3 tokenizer")
}

/// The demo's checkpoint (its tokenizer files among them).
fn demo_dir() -> std::path::PathBuf {
    fixture("demo")
}

fn tokenizer(name: &str) -> Tok {
    let json = match name {
        "qwen3" => qwen3_json(),
        "demo" => std::fs::read_to_string(demo_dir().join("tokenizer.json")).expect("demo tokenizer"),
        other => panic!("unknown tokenizer {other}"),
    };
    Tok::from_json(&json).expect("load tokenizer")
}

fn tokenizer_config(name: &str) -> Value {
    let p = match name {
        "qwen3" => asset("qwen3/tokenizer_config.json"),
        _ => demo_dir().join("tokenizer_config.json"),
    };
    serde_json::from_str(&std::fs::read_to_string(p).expect("tokenizer_config")).expect("json")
}

fn reference(file: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(file)).expect(file)).expect("json")
}

#[test]
fn ids_and_decoding_match_python() {
    let r = reference("tokenizer_reference.json");
    for name in ["qwen3", "demo"] {
        let tok = tokenizer(name);
        let rows = r[name].as_array().expect("rows");
        assert!(rows.len() >= 20);
        for row in rows {
            let text = row["text"].as_str().unwrap();
            let want: Vec<u32> = row["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let got = tok.encode(text).unwrap();
            assert_eq!(got, want, "{name}: ids of {text:?}");
            let dec = tok.decode(&got, false).unwrap();
            assert_eq!(dec, row["decoded"].as_str().unwrap(), "{name}: decode of {text:?}");
        }
    }
}

#[test]
fn qwen3_special_tokens_have_their_ids() {
    let tok = tokenizer("qwen3");
    assert_eq!(tok.encode("Hello, 世界").unwrap(), vec![9707, 11, 220, 99489]);
    for (t, id) in [
        ("<|endoftext|>", 151643),
        ("<|im_start|>", 151644),
        ("<|im_end|>", 151645),
        ("<think>", 151667),
        ("</think>", 151668),
    ] {
        assert_eq!(tok.token_id(t), Some(id), "{t}");
    }
}

#[test]
fn chat_templates_render_byte_identical_to_transformers() {
    let rows = reference("chat_reference.json");
    let rows = rows.as_array().expect("rows");
    assert!(rows.len() >= 60);
    for name in ["qwen3", "demo", "qwen3.5"] {
        let tmpl = if name == "qwen3.5" {
            // the Qwen3.5 family's template, as its checkpoints ship it (chat_template.jinja)
            let src = std::fs::read_to_string(asset("qwen3.5/chat_template.jinja")).expect("template");
            ChatTemplate::new(&src, None, Some("<|im_end|>".into())).unwrap()
        } else {
            let cfg = tokenizer_config(name);
            let s = |k: &str| cfg.get(k).and_then(|v| v.as_str()).map(String::from);
            ChatTemplate::new(cfg["chat_template"].as_str().unwrap(), s("bos_token"), s("eos_token")).unwrap()
        };
        let mut checked = 0;
        for row in rows.iter().filter(|r| r["tokenizer"] == name) {
            checked += 1;
            let msgs: Vec<Message> = row["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                .collect();
            let agp = row["add_generation_prompt"].as_bool().unwrap();
            let think = row.get("enable_thinking").and_then(|v| v.as_bool());
            let got = tmpl.render(&msgs, agp, &moescope::engine::chat_template::TemplateArgs::thinking(think)).unwrap();
            assert_eq!(got, row["text"].as_str().unwrap(), "{name}: {msgs:?} agp={agp} thinking={think:?}");
        }
        assert!(checked >= 30, "{name}: {checked} renders compared");
    }
}

#[test]
fn streaming_decode_never_splits_a_character() {
    let r = reference("tokenizer_reference.json");
    for name in ["qwen3", "demo"] {
        let tok = tokenizer(name);
        for row in r[name].as_array().unwrap() {
            let ids = tok.encode(row["text"].as_str().unwrap()).unwrap();
            let full = tok.decode(&ids, true).unwrap();
            let mut dec = StreamDecoder::new(&tok, true);
            let mut pieces = vec![];
            for &id in &ids {
                if let Some(p) = dec.push(id).unwrap() {
                    pieces.push(p);
                }
            }
            if let Some(p) = dec.flush().unwrap() {
                pieces.push(p);
            }
            assert_eq!(pieces.concat(), full, "{name}: stream of {:?}", row["text"]);
            if !full.contains('\u{FFFD}') {
                assert!(
                    pieces.iter().all(|p| !p.contains('\u{FFFD}')),
                    "{name}: a piece split a character: {pieces:?}"
                );
            }
        }
    }
    // emoji and CJK are several byte-level tokens each: pieces still arrive whole
    let tok = tokenizer("demo");
    let ids = tok.encode("🦀👩‍👩‍👧‍👦世界").unwrap();
    assert!(ids.len() > 4, "expected multi-token characters, got {ids:?}");
    let mut dec = StreamDecoder::new(&tok, true);
    let mut n_pieces = 0;
    for &id in &ids {
        if let Some(p) = dec.push(id).unwrap() {
            assert!(!p.contains('\u{FFFD}'), "{p:?}");
            n_pieces += 1;
        }
    }
    assert!(n_pieces < ids.len(), "some tokens must have been held back");
}
