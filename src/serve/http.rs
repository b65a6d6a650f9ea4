//! The HTTP side: axum routes, the API key, request bodies into jobs for the engine thread, and
//! the engine's events back out as JSON or Server-Sent Events. Every handler answers errors as
//! OpenAI does (`{"error": {...}}` and a status); a stream that has begun ends with an error
//! chunk and `[DONE]` instead.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_stream::Stream;

use super::api::{self, ApiError, Prompt};
use super::reply::{Chunks, Kind, Shape, Whole};
use super::worker::{Event, Job};
use super::{Loaded, Server};
use crate::engine::call_syntax::CallSyntax;

pub fn router(server: Arc<Server>, body_limit: usize) -> Router {
    let open = Router::new().route("/health", get(health)).route("/v1/health", get(health));
    let keyed = Router::new()
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route_layer(middleware::from_fn_with_state(server.clone(), auth));
    open.merge(keyed).fallback(not_found).layer(DefaultBodyLimit::max(body_limit)).with_state(server)
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, axum::Json(e.body())).into_response();
    if e.status == 503 {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

async fn not_found() -> Response {
    error(ApiError::new(404, "not_found_error", "no such endpoint"))
}

/// `Authorization: Bearer KEY`, compared in constant time, on every route but `/health`.
async fn auth(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let given = given.and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
        if !same_bytes(given.as_bytes(), key.as_bytes()) {
            let e = ApiError::new(401, "authentication_error", "invalid API key").with_code("invalid_api_key");
            return error(e);
        }
    }
    next.run(req).await
}

/// Equal, in a time that depends on the lengths only.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let diff = (0..n).fold(a.len() ^ b.len(), |d, i| d | (*a.get(i).unwrap_or(&0) ^ *b.get(i).unwrap_or(&0)) as usize);
    std::hint::black_box(diff) == 0
}

fn loaded(s: &Server) -> Result<&Loaded, ApiError> {
    s.loaded.get().ok_or_else(|| ApiError::new(503, "unavailable_error", "Loading model"))
}

async fn health(State(s): State<Arc<Server>>) -> Response {
    match loaded(&s) {
        Ok(_) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(e) => error(e),
    }
}

async fn models(State(s): State<Arc<Server>>) -> Response {
    match loaded(&s) {
        Ok(m) => axum::Json(json!({"object": "list", "data": [m.card]})).into_response(),
        Err(e) => error(e),
    }
}

async fn metrics(State(s): State<Arc<Server>>) -> Response {
    if !s.metrics_on {
        return error(ApiError::new(501, "not_supported_error", "metrics are off (start with --metrics)"));
    }
    let experts = s.loaded.get().and_then(|m| m.experts.as_deref());
    s.metrics.queued.store(s.jobs.len() as u64, Ordering::Relaxed);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render(experts)).into_response()
}

/// The body as JSON, or OpenAI's error (413 over the limit, 400 for bad JSON).
fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|r| {
        let status = r.status().as_u16();
        let kind = if status == 413 { "request_too_large" } else { "invalid_request_error" };
        ApiError::new(status, kind, r.body_text())
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", format!("the body is not valid JSON: {e}")))
}

async fn chat(State(s): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(&s, body, Kind::Chat).await.unwrap_or_else(error)
}

async fn completions(State(s): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(&s, body, Kind::Completion).await.unwrap_or_else(error)
}

/// Sets the request's cancel flag when dropped: when the client goes away, axum drops the
/// handler's future (a whole reply) or the response body (a stream), and the engine stops.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

async fn generate(s: &Arc<Server>, body: Result<Bytes, BytesRejection>, kind: Kind) -> Result<Response, ApiError> {
    let m = loaded(s)?;
    let body = json_body(body)?;
    let req = match kind {
        Kind::Chat => api::parse_chat(&body, &s.defaults)?,
        Kind::Completion => api::parse_completion(&body, &s.defaults)?,
    };
    if let Some(&(id, _)) = req.params.adjust.logit_bias.iter().find(|(id, _)| *id as usize >= m.vocab) {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("logit_bias: token {id} is past the vocabulary ({})", m.vocab),
        ));
    }
    let (ids, prefill, tools) = prompt_ids(m, &req.prompt)?;
    if ids.len() >= m.ctx {
        let msg = format!(
            "This model's maximum context length is {} tokens. However, your request has {} prompt tokens (one must be left for the reply).",
            m.ctx,
            ids.len()
        );
        return Err(ApiError::invalid("messages", msg).with_code("context_length_exceeded"));
    }
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    let id = match kind {
        Kind::Chat => format!("chatcmpl-{}-{n}", s.started),
        Kind::Completion => format!("cmpl-{}-{n}", s.started),
    };
    let shape = Shape {
        kind,
        id: id.clone(),
        created: unix_now(),
        model: m.id.clone(),
        tools,
        think: req.reasoning,
        calls: m.template.as_ref().map_or(CallSyntax::default(), |t| t.call_syntax()),
        include_usage: req.include_usage,
        progress: req.params.return_progress,
        prefill,
    };
    let want_logprobs = req.params.logprobs.is_some();
    let (tx, rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job =
        Job { id, prompt: ids, params: req.params, events: tx, cancel: cancel.clone(), queued_at: Instant::now() };
    s.submit(job)?;
    let guard = CancelOnDrop(cancel);
    if req.stream {
        let stream = ChunkStream { rx, chunks: Chunks::new(shape), pending: VecDeque::new(), _guard: guard };
        let keep = KeepAlive::new().interval(Duration::from_secs(5)).text("ping");
        return Ok(Sse::new(stream).keep_alive(keep).into_response());
    }
    let mut rx = rx;
    let mut whole = Whole::default();
    while let Some(ev) = rx.recv().await {
        if let Err(msg) = whole.add(ev) {
            return Err(ApiError::new(500, "server_error", msg));
        }
    }
    drop(guard);
    if whole.end.is_none() {
        return Err(ApiError::new(
            503,
            "unavailable_error",
            "the request ended before its reply: the server is stopping",
        ));
    }
    Ok(axum::Json(whole.response(&shape, want_logprobs)).into_response())
}

/// A prompt's ids; for chat also the prefill and the tools given.
type PromptIds = (Vec<u32>, Option<String>, Option<Arc<Value>>);

fn prompt_ids(m: &Loaded, p: &Prompt) -> Result<PromptIds, ApiError> {
    match p {
        Prompt::Ids(ids) => {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= m.vocab) {
                return Err(ApiError::invalid("prompt", format!("token {id} is past the vocabulary ({})", m.vocab)));
            }
            Ok((ids.clone(), None, None))
        }
        Prompt::Text(t) => Ok((encode(m, t)?, None, None)),
        Prompt::Chat { prefill, tools, .. } => {
            let text = render(m, p)?;
            // a generation prompt that opens the reasoning block itself (DeepSeek-V3.1 thinking,
            // Qwen3's thinking-only models): the reply starts inside it
            let state = prefill.clone().or_else(|| super::think::opened_by(&text).map(String::from));
            Ok((encode(m, &text)?, state, tools.clone().map(Arc::new)))
        }
    }
}

fn encode(m: &Loaded, text: &str) -> Result<Vec<u32>, ApiError> {
    let ids = m.tok.encode(text).map_err(|e| ApiError::new(500, "server_error", format!("tokenizer: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    Ok(ids)
}

/// A chat prompt's text: the messages through the template, the generation prompt, and the
/// prefill after it.
fn render(m: &Loaded, p: &Prompt) -> Result<String, ApiError> {
    let Prompt::Chat { messages, tools, args, prefill } = p else {
        return Err(ApiError::invalid("messages", "not a chat prompt"));
    };
    let t = m
        .template
        .as_ref()
        .ok_or_else(|| ApiError::invalid("messages", "this model has no chat template: use /v1/completions"))?;
    let mut text = t.render_json(messages, tools.as_ref(), true, args).map_err(|e| ApiError::invalid("messages", e))?;
    text.push_str(prefill.as_deref().unwrap_or(""));
    Ok(text)
}

async fn tokenize(State(s): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let m = loaded(&s)?;
        let b = json_body(body)?;
        let text = b
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid("content", "'content' must be a string"))?;
        let ids = m.tok.encode(text).map_err(|e| ApiError::new(500, "server_error", e))?;
        Ok(json!({"tokens": ids}))
    };
    run().map_or_else(error, |v| axum::Json(v).into_response())
}

async fn detokenize(State(s): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let m = loaded(&s)?;
        let b = json_body(body)?;
        let bad = || ApiError::invalid("tokens", "'tokens' must be a list of token ids");
        let ids: Vec<u32> = b
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(bad)?
            .iter()
            .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        if ids.iter().any(|&i| i as usize >= m.vocab) {
            return Err(bad());
        }
        let text = m.tok.decode(&ids, false).map_err(|e| ApiError::new(500, "server_error", e))?;
        Ok(json!({"content": text}))
    };
    run().map_or_else(error, |v| axum::Json(v).into_response())
}

async fn apply_template(State(s): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let m = loaded(&s)?;
        let req = api::parse_chat(&json_body(body)?, &s.defaults)?;
        Ok(json!({"prompt": render(m, &req.prompt)?}))
    };
    run().map_or_else(error, |v| axum::Json(v).into_response())
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A request's SSE body: the engine's events as chunks, `[DONE]` last whatever happens. Owning
/// the receiver and the cancel guard, its drop (the client went away) stops the engine.
struct ChunkStream {
    rx: UnboundedReceiver<Event>,
    chunks: Chunks,
    pending: VecDeque<String>,
    _guard: CancelOnDrop,
}

impl Stream for ChunkStream {
    type Item = Result<SseEvent, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(data) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(SseEvent::default().data(data))));
            }
            if self.chunks.ended() {
                return Poll::Ready(None);
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(ev)) => {
                    let out = self.chunks.on(ev);
                    self.pending.extend(out);
                }
                Poll::Ready(None) => {
                    let out = self.chunks.error("the request ended before its reply: the server is stopping");
                    self.pending.extend(out);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn same_bytes_is_equality() {
        use super::same_bytes;
        assert!(same_bytes(b"key", b"key") && same_bytes(b"", b""));
        assert!(!same_bytes(b"key", b"kez") && !same_bytes(b"key", b"ke") && !same_bytes(b"", b"k"));
    }
}
