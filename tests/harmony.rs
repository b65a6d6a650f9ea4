//! gpt-oss's harmony format against its references (tests/fixtures/harmony_reference.json,
//! tests/reference/make_harmony_fixtures.py): the o200k_harmony tokenizer `synth` builds from
//! o200k_base's ranks against tiktoken (ids) and transformers' TikTokenConverter (vocabulary and
//! merges), and the chat template against transformers' rendering.

mod common;

use moescope::engine::chat_template::{ChatTemplate, TemplateArgs};
use moescope::engine::tokenizer::Tok;
use moescope::packed::crc32;
use moescope::synth::shapes::TokFamily;
use serde_json::Value;

fn reference() -> Value {
    let p = common::fixture("harmony_reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

#[test]
fn o200k_harmony_is_tiktokens_and_transformers_conversion() {
    let r = reference();
    let info = moescope::synth::tokenizers::load(TokFamily::Harmony).expect("tokenizer");
    let json: Value = serde_json::from_str(info.tokenizer_json.as_deref().expect("json")).expect("tokenizer.json");
    // the vocabulary and merges transformers' converter makes from the same ranks
    let vocab = json["model"]["vocab"].as_object().expect("vocab");
    let mut by_id: Vec<(u64, &str)> = vocab.iter().map(|(t, id)| (id.as_u64().expect("id"), t.as_str())).collect();
    by_id.sort_unstable();
    let vocab_text: String = by_id.iter().map(|(i, t)| format!("{i} {t}\n")).collect();
    assert_eq!(by_id.len() as u64, r["vocab_len"].as_u64().unwrap());
    assert_eq!(crc32(vocab_text.as_bytes()) as u64, r["vocab_crc32"].as_u64().unwrap(), "vocabulary");
    let merges = json["model"]["merges"].as_array().expect("merges");
    let merges_text: String =
        merges.iter().map(|m| format!("{} {}\n", m[0].as_str().unwrap(), m[1].as_str().unwrap())).collect();
    assert_eq!(merges.len() as u64, r["merges_len"].as_u64().unwrap());
    assert_eq!(crc32(merges_text.as_bytes()) as u64, r["merges_crc32"].as_u64().unwrap(), "merges");
    // tiktoken's special tokens, each its id
    let tok = Tok::from_json(info.tokenizer_json.as_deref().unwrap()).expect("load");
    for s in r["special_tokens"].as_array().unwrap() {
        assert_eq!(tok.token_id(s[0].as_str().unwrap()), Some(s[1].as_u64().unwrap() as u32), "{s}");
    }
    assert_eq!(tok.vocab_size(), 201_088);
    // tiktoken's ids for text, markup and rendered prompts; decoding gives the text back
    let rows = r["encode"].as_array().unwrap().iter().chain(r["renders"].as_array().unwrap());
    let mut n = 0;
    for row in rows {
        let text = row["text"].as_str().unwrap();
        let want = ids(&row["ids"]);
        assert_eq!(tok.encode(text).unwrap(), want, "ids of {text:?}");
        assert_eq!(tok.decode(&want, false).unwrap(), text, "decode of {text:?}");
        n += 1;
    }
    assert!(n >= 26, "{n} texts");
}

/// The request's kwargs as the template's arguments.
fn args(kwargs: &Value) -> TemplateArgs {
    let mut a = TemplateArgs::default();
    for (k, v) in kwargs.as_object().unwrap() {
        match k.as_str() {
            "reasoning_effort" => a.reasoning_effort = v.as_str().map(String::from),
            _ => {
                a.extra.insert(k.clone(), v.clone());
            }
        }
    }
    a
}

#[test]
fn harmony_template_renders_as_transformers_does() {
    let r = reference();
    let info = moescope::synth::tokenizers::load(TokFamily::Harmony).expect("tokenizer");
    let t = ChatTemplate::new(info.chat_template.as_deref().expect("template"), None, None).expect("template");
    t.pin_clock(r["clock"].as_i64());
    for case in r["renders"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let got = t.render_json(&case["messages"], tools, agp, &args(&case["kwargs"])).expect(name);
        assert_eq!(got, case["text"].as_str().unwrap(), "{name}");
        // OpenAI's clients send a call's arguments as JSON text: the same prompt
        let mut openai = case["messages"].clone();
        let mut had_calls = false;
        for m in openai.as_array_mut().unwrap() {
            for c in m.get_mut("tool_calls").and_then(Value::as_array_mut).into_iter().flatten() {
                c["function"]["arguments"] = Value::String(c["function"]["arguments"].to_string());
                had_calls = true;
            }
        }
        if had_calls {
            let got = t.render_json(&openai, tools, agp, &args(&case["kwargs"])).expect(name);
            assert_eq!(got, case["text"].as_str().unwrap(), "{name}, arguments as JSON text");
        }
    }
    // a system prompt that asks for an effort gets it, unless the caller sets one
    let msgs = serde_json::json!([{"role": "system", "content": "Be exact.\nReasoning: high"}, {"role": "user", "content": "x"}]);
    let text = t.render_json(&msgs, None, true, &TemplateArgs::default()).unwrap();
    assert!(text.contains("\nReasoning: high\n"), "{text}");
    let low = TemplateArgs { reasoning_effort: Some("low".into()), ..TemplateArgs::default() };
    assert!(t.render_json(&msgs, None, true, &low).unwrap().contains("\nReasoning: low\n"));
}
