//! The chat templates of GLM-4.5/4.6, DeepSeek-V3.1 and Kimi-K2 (llama.cpp's copies in
//! tests/fixtures/templates) render byte-identical to transformers' (its renders in
//! tests/fixtures/family_chat_reference.json, by tests/reference/make_family_chat_fixtures.py):
//! system, user, assistant and tool turns, tool declarations and calls, reasoning kept in past
//! turns or not, thinking on and off.

mod common;

use moescope::engine::chat_template::{ChatTemplate, TemplateArgs};
use serde_json::Value;

fn reference() -> Value {
    let path = common::fixture("family_chat_reference.json");
    serde_json::from_slice(&std::fs::read(&path).expect("reference")).expect("json")
}

fn args(kwargs: &Value) -> TemplateArgs {
    let mut a = TemplateArgs::default();
    for (k, v) in kwargs.as_object().expect("kwargs") {
        match k.as_str() {
            "enable_thinking" => a.enable_thinking = v.as_bool(),
            _ => {
                a.extra.insert(k.clone(), v.clone());
            }
        }
    }
    a
}

#[test]
fn glm_deepseek_and_kimi_templates_render_as_transformers_does() {
    let r = reference();
    let mut n = 0;
    for case in r["renders"].as_array().expect("renders") {
        let file = case["template"].as_str().expect("template");
        let source = std::fs::read_to_string(common::fixture("templates").join(file)).expect("template file");
        let special = |k: &str| case["special"][k].as_str().map(String::from);
        let t = ChatTemplate::new(&source, special("bos_token"), special("eos_token")).expect(file);
        t.pin_clock(r["clock"].as_i64());
        let name = format!("{file} {}", case["name"].as_str().expect("name"));
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        let agp = case["add_generation_prompt"].as_bool().expect("agp");
        let got = t.render_json(&case["messages"], tools, agp, &args(&case["kwargs"])).expect(&name);
        assert_eq!(got, case["text"].as_str().expect("text"), "{name}");
        n += 1;
    }
    assert_eq!(n, 21, "cases");
}

/// GLM's template raises on a call whose arguments are not a mapping, while OpenAI's clients send
/// them as JSON text: given as text, they render as transformers renders the mapping.
#[test]
fn glms_calls_with_json_text_arguments_render_as_with_a_mapping() {
    let r = reference();
    let case = r["renders"]
        .as_array()
        .expect("renders")
        .iter()
        .find(|c| c["template"] == "GLM-4.6.jinja" && c["name"] == "tools-call-result")
        .expect("GLM's tool call case");
    let source = std::fs::read_to_string(common::fixture("templates").join("GLM-4.6.jinja")).expect("template");
    let t = ChatTemplate::new(&source, None, None).expect("GLM");
    t.pin_clock(r["clock"].as_i64());
    let mut messages = case["messages"].clone();
    let mut n = 0;
    for m in messages.as_array_mut().expect("messages") {
        for c in m["tool_calls"].as_array_mut().into_iter().flatten() {
            let a = &mut c["function"]["arguments"];
            assert!(a.is_object(), "the reference passes a mapping");
            *a = a.to_string().into();
            n += 1;
        }
    }
    assert_eq!(n, 1);
    let got = t.render_json(&messages, Some(&case["tools"]), true, &args(&case["kwargs"])).expect("renders");
    assert_eq!(got, case["text"].as_str().expect("text"));
}
