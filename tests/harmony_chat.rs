//! gpt-oss's harmony replies split in the server, the REPL and the workbench, on the MXFP4
//! fixture made a harmony chat model (`moescope::derived_fixture::gpt_oss_harmony_chat`: a
//! 1,024-id tokenizer cut from o200k_harmony, gpt-oss's template). Its weights are random, so
//! an assistant prefill puts the reply in a channel and a logit bias keeps the markup tokens out
//! of what it writes; the split is checked against the raw reply split by hand.

mod common;

use std::path::{Path, PathBuf};

use common::server::Server;
use moescope::convert::{ConvertOptions, QuantMode, convert_hf};
use moescope::derived_fixture::{HARMONY_SPECIALS, gpt_oss_harmony_chat};
use serde_json::{Value, json};

fn package(dir: &Path) -> PathBuf {
    let ck = dir.join("ck");
    std::fs::create_dir_all(&ck).unwrap();
    gpt_oss_harmony_chat(&common::fixture("gpt-oss-mxfp4"), &ck).expect("harmony checkpoint");
    let pkg = dir.join("harmony.moe");
    convert_hf(&ck, &pkg, ConvertOptions::new(QuantMode::Mxfp4)).expect("convert");
    pkg
}

/// Every markup token forbidden: the model writes plain text inside the channel it was put in.
fn no_markup() -> Value {
    let first = 1024 - HARMONY_SPECIALS.len();
    Value::Object((first..1024).map(|id| (id.to_string(), json!(-100))).collect())
}

fn parse(events: &[String]) -> Vec<Value> {
    events.iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).expect("a JSON chunk")).collect()
}

#[test]
fn the_server_splits_channels_and_calls_streamed_or_not() {
    let d = tempfile::tempdir().unwrap();
    let pkg = package(d.path());
    let s = Server::start(&["-t", "1", "-m", pkg.to_str().unwrap()], d.path());
    // the prompt is harmony's, with the effort the request asks for
    let p = s
        .post("/apply-template", &json!({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "high"}));
    let prompt = p.json()["prompt"].as_str().unwrap().to_string();
    assert!(prompt.starts_with("<|start|>system<|message|>") && prompt.contains("\nReasoning: high\n"), "{prompt}");
    assert!(prompt.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"), "{prompt}");
    // null is no effort given: the template's default, medium (as OpenAI's API reads a null)
    for extra in [json!({"reasoning_effort": null}), json!({"chat_template_kwargs": {"reasoning_effort": null}})] {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}]});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let p = s.post("/apply-template", &b);
        assert_eq!(p.status, 200, "{extra}: {}", p.text());
        let prompt = p.json()["prompt"].as_str().unwrap().to_string();
        assert!(prompt.contains("\nReasoning: medium\n"), "{extra}: {prompt}");
    }

    let analysis = "<|channel|>analysis<|message|>";
    let final_ = "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>final<|message|>";
    for (prefill, in_reasoning) in [(analysis, true), (final_, false)] {
        let body = json!({
            "messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": prefill}],
            "max_tokens": 12, "temperature": 0, "logit_bias": no_markup(),
        });
        let mut raw_body = body.clone();
        raw_body["reasoning_format"] = json!("none");
        let raw = s.post("/v1/chat/completions", &raw_body).json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(!raw.is_empty() && !raw.contains("<|"), "{raw:?}");
        let (want_r, want_c) = if in_reasoning { (raw.clone(), String::new()) } else { (String::new(), raw.clone()) };
        let m = s.post("/v1/chat/completions", &body).json()["choices"][0]["message"].clone();
        assert_eq!(m["reasoning_content"].as_str().unwrap_or(""), want_r, "{prefill}");
        assert_eq!(m["content"].as_str().unwrap(), want_c, "{prefill}");
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let chunks = parse(&s.stream("/v1/chat/completions", &sb).all());
        let delta =
            |k: &str| -> String { chunks.iter().filter_map(|c| c["choices"][0]["delta"][k].as_str()).collect() };
        assert_eq!((delta("reasoning_content"), delta("content")), (want_r, want_c), "{prefill}, streamed");
    }

    // a harmony call (in the prefill here: the model never learnt to call) is a tool call
    let call = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let weather = json!({"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let body = json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": call}],
        "tools": [weather], "max_tokens": 4, "temperature": 0,
    });
    let r = s.post("/v1/chat/completions", &body).json();
    let calls = &r["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["function"]["name"], "get_weather", "{r}");
    assert_eq!(
        serde_json::from_str::<Value>(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Paris"})
    );
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = parse(&s.stream("/v1/chat/completions", &sb).all());
    let streamed: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert_eq!(streamed.len(), 1, "{chunks:?}");
    assert_eq!(streamed[0]["function"]["name"], "get_weather");
}

#[test]
fn the_repl_prints_the_answer_and_sends_the_reasoning_aside() {
    // stdout not a terminal: the answer there, the reasoning on stderr; with --system asking
    // for an effort. The model's reply is noise, so what is checked is where each part went:
    // the two streams hold no markup and together hold what the server's raw reply holds.
    let d = tempfile::tempdir().unwrap();
    let pkg = package(d.path());
    let out = common::moescope_stdin(
        &[
            "run",
            "-m",
            pkg.to_str().unwrap(),
            "-n",
            "24",
            "--temperature",
            "0",
            "-t",
            "1",
            "--system",
            "Reasoning: low",
        ],
        d.path(),
        b"What is 2 + 2?\n",
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let (so, se) = (common::stdout(&out), common::stderr(&out));
    assert!(!so.contains("<|") && !se.contains("<|channel|>"), "markup leaked: {so:?} / {se:?}");
    // the same reply, raw, from the server (same package, greedy, same prompt)
    let s = Server::start(&["-t", "1", "-m", pkg.to_str().unwrap()], d.path());
    let body = json!({"messages": [{"role": "system", "content": "Reasoning: low"}, {"role": "user", "content": "What is 2 + 2?"}],
        "max_tokens": 24, "temperature": 0, "reasoning_format": "none"});
    let raw =
        s.post("/v1/chat/completions", &body).json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let (reasoning, content, _) = moescope::engine::harmony::split(&raw);
    assert!(so.contains(content.trim()), "stdout {so:?} lacks the content {content:?} of {raw:?}");
    if let Some(r) = reasoning {
        assert!(
            se.contains(r.trim()) && !so.contains(r.trim()),
            "the reasoning {r:?} belongs on stderr: {so:?} / {se:?}"
        );
    }
}
