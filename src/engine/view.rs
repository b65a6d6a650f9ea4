//! What the front ends (run, chat, bench, the workbench, the server) see of an engine: its
//! model, its streamed experts, its settings, through methods rather than its fields.

use std::sync::Arc;

use moescope_kernels::Isa;

use super::call_syntax::CallSyntax;
use super::chat_template::ChatTemplate;
use super::tokenizer::Tok;
use super::{Engine, EngineError, Slot};
use crate::experts::Experts;
use crate::experts::pool::ExpertCache;
use crate::model::{Decoder, ModelConfig, RouteReplay};
use crate::package::Package;

/// What the front ends see of an engine: its model, its streamed experts, its settings.
impl Engine {
    /// A copy of the engine's own sequence, its cache at exactly its length (None where it
    /// cannot be copied); [`Engine::restore_sequence`] makes it the engine's again.
    pub fn save_sequence(&self) -> Option<Slot> {
        self.seq.compact(&self.model.cfg)
    }

    /// Make a sequence [`Engine::save_sequence`] gave the engine's own (false: it does not fit
    /// the engine's cache, or its types differ; the engine's sequence is then unchanged).
    pub fn restore_sequence(&mut self, s: &Slot) -> bool {
        self.seq.copy_prefix(s, s.cached().len())
    }

    /// The model: its configuration, its routing switches' state, its sizes.
    pub fn model(&self) -> &Decoder {
        &self.model
    }

    pub fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }

    pub fn package(&self) -> &Package {
        self.model.package()
    }

    /// The streamed experts (pool, predictor, I/O), None when every expert is read through the
    /// package's mapping.
    pub fn streamed(&self) -> Option<&Arc<Experts>> {
        self.experts.as_ref()
    }

    /// The expert pool, when experts stream.
    pub fn pool(&self) -> Option<&ExpertCache> {
        self.experts.as_deref().map(|e| &*e.cache)
    }

    /// Take every MoE block's route from `replay` from now on (None: the routers' own).
    pub fn set_route_replay(&mut self, replay: Option<Arc<RouteReplay>>) -> Result<(), EngineError> {
        Ok(self.model.set_route_replay(replay)?)
    }

    /// Cache-aware routing with tolerance `tol`, or exact routing (None).
    pub fn set_cache_aware_routing(&mut self, tol: Option<f32>) -> Result<(), EngineError> {
        Ok(self.model.set_cache_aware_routing(tol)?)
    }

    /// What loading had to say once (an O_DIRECT fallback, say).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// How `auto` sized the pool (and the context), in one line; None when it did not.
    pub fn sizing(&self) -> Option<&str> {
        self.sizing.as_deref()
    }

    pub fn threads(&self) -> usize {
        self.exec.threads()
    }

    pub fn isa(&self) -> Isa {
        self.exec.isa
    }

    /// A server's slots and prefix cache as the memory plan fitted them.
    pub fn sequences(&self) -> super::sizing::Sequences {
        self.seqs
    }

    /// The KV cache's element types.
    pub fn kv_types(&self) -> crate::model::KvTypes {
        self.seq.kv.types()
    }

    /// Positions the KV cache holds.
    pub fn ctx_size(&self) -> usize {
        self.seq.kv.capacity()
    }

    /// Positions cached now.
    pub fn cached_len(&self) -> usize {
        self.seq.kv.len()
    }

    pub fn tokenizer(&self) -> Option<&Arc<Tok>> {
        self.tok.as_ref()
    }

    pub fn template(&self) -> Option<&Arc<ChatTemplate>> {
        self.template.as_ref()
    }

    /// Its replies are in gpt-oss's harmony format (its template says so): decoded with the
    /// special tokens kept, and split by `harmony.rs`.
    pub fn harmony(&self) -> bool {
        self.template.as_ref().is_some_and(|t| t.harmony())
    }

    /// How its replies write tool calls (its template says; `<tool_call>` blocks without one).
    pub fn call_syntax(&self) -> CallSyntax {
        self.template.as_ref().map_or(CallSyntax::default(), |t| t.call_syntax())
    }

    /// The special tokens a reply's text keeps: the call syntax's markers and the reasoning
    /// tags that are special tokens in its tokenizer; None: all of them (harmony's channels).
    pub fn kept_specials(&self) -> Option<Vec<u32>> {
        let tok = self.tok.as_ref();
        self.call_syntax().kept_tokens(|t| tok.and_then(|k| k.token_id(t)))
    }

    /// Run without a tokenizer (ids in, ids out) or with another one.
    pub fn set_tokenizer(&mut self, tok: Option<Arc<Tok>>) {
        self.tok = tok;
    }

    /// Chat through another template than the package's (or none).
    pub fn set_template(&mut self, template: Option<Arc<ChatTemplate>>) {
        self.template = template;
    }
}
