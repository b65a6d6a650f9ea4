//! The models: one layer stack for every family (`decoder.rs`), its blocks, each with its own
//! `forward` over a shared [`Pass`] (`attention.rs`, `delta_net.rs`, `mlp.rs`, `moe.rs` with
//! `router.rs`), the seam to where routed experts come from (`expert_source.rs`), the
//! sequence's state (`kv_cache.rs`) and the buffers of a pass (`run_state.rs`).

pub mod attention;
pub mod decoder;
pub mod delta_net;
pub mod error;
pub mod expert_source;
pub mod kv_buf;
pub mod kv_cache;
pub mod mla;
mod mla_expanded;
pub mod mlp;
pub mod moe;
pub mod observer;
pub mod pass;
pub mod route_replay;
pub mod router;
mod rows;
pub mod run_state;
pub mod steering;

pub use crate::model_config::{Arch, HybridConfig, LayerKind, ModelConfig};
pub use decoder::{Decoder, Logits, Seq};
pub use error::ModelError;
pub use expert_source::{Ahead, ExpertQuery, ExpertSource, ReadyFn, Resident, RouterInput};
pub use kv_buf::{KvType, KvTypes};
pub use kv_cache::KvCache;
pub use observer::{NoObserver, Observer, Tee};
pub use pass::{Pass, Runtime, SeqRows};
pub use route_replay::RouteReplay;
pub use router::{Pick, Router, RouterRule};
pub use run_state::RunState;
