//! Model architectures, bound to the weights of a package.

pub mod attention;
pub mod config;
pub mod error;
pub mod exec;
pub mod kv_cache;
pub mod pool;
pub mod qwen3_moe;

pub use config::ModelConfig;
pub use error::ModelError;
pub use exec::Exec;
pub use kv_cache::KvCache;
pub use qwen3_moe::{Logits, NoObserver, Observer, Qwen3Moe};
