//! Keys and values of every attention layer for the tokens seen so far, in f32.

use super::config::ModelConfig;

/// Per layer, K and V as `[n_kv_heads, capacity, head_dim]`: one head's positions are
/// contiguous, which is what decode attention walks. The memory is allocated zeroed and only
/// touched as positions fill, so a large `--ctx-size` costs address space, not RAM.
pub struct KvCache {
    n_kv: usize,
    hd: usize,
    cap: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, cap: usize) -> KvCache {
        let (n_kv, hd) = (cfg.num_key_value_heads, cfg.head_dim);
        let per = n_kv * cap * hd;
        KvCache {
            n_kv,
            hd,
            cap,
            len: 0,
            k: (0..cfg.num_hidden_layers).map(|_| vec![0f32; per]).collect(),
            v: (0..cfg.num_hidden_layers).map(|_| vec![0f32; per]).collect(),
        }
    }

    /// Bytes when full.
    pub fn bytes_at_capacity(cfg: &ModelConfig, cap: usize) -> u64 {
        (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cap * cfg.head_dim * 4) as u64
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forget everything from position `len` on (prefix reuse between chat turns).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Mark positions up to `len` as filled (after a forward pass wrote them).
    pub fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.cap);
        self.len = len;
    }

    /// Store `k` and `v` (`[n_kv * hd]` each) of position `pos` for `layer`.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        for h in 0..self.n_kv {
            let dst = (h * self.cap + pos) * self.hd;
            self.k[layer][dst..dst + self.hd].copy_from_slice(&k[h * self.hd..(h + 1) * self.hd]);
            self.v[layer][dst..dst + self.hd].copy_from_slice(&v[h * self.hd..(h + 1) * self.hd]);
        }
    }

    /// Keys and values of `head` for positions `0..upto`, each `[upto, hd]`.
    pub fn head(&self, layer: usize, head: usize, upto: usize) -> (&[f32], &[f32]) {
        let s = head * self.cap * self.hd;
        (&self.k[layer][s..s + upto * self.hd], &self.v[layer][s..s + upto * self.hd])
    }
}
