//! Model architectures, bound to the weights of a package.

pub mod attention;
pub mod delta_net;
pub mod error;
pub mod kv_cache;
pub mod moe;
pub mod observer;
pub mod qwen3_moe;
pub mod route_replay;
mod rows;
pub mod run_state;

pub use crate::model_config::{Arch, HybridConfig, LayerKind, ModelConfig};
pub use error::ModelError;
pub use kv_cache::KvCache;
pub use moe::{ExpertQuery, ExpertSource, ReadyFn, Resident};
pub use observer::{NoObserver, Observer, Tee};
pub use qwen3_moe::{Logits, Qwen3Moe};
pub use route_replay::RouteReplay;
pub use run_state::RunState;
