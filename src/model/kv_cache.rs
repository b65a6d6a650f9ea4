//! Keys and values of every attention layer for the tokens seen so far, in f32.

use moescope_kernels::attn::KEY_BLOCK;

use crate::model_config::ModelConfig;

/// Per layer, V as `[n_kv_heads, capacity, head_dim]` and K as
/// `[n_kv_heads, capacity / KEY_BLOCK, head_dim, KEY_BLOCK]`: one head's positions are
/// contiguous, which is what attention walks, and each block of [`KEY_BLOCK`] keys is stored
/// transposed, the layout `kernels::attn` takes (a block's scores are then vector
/// multiply-adds over the head dimension, with no horizontal sums). The storage is rounded up
/// to whole blocks; the capacity stays what was asked. The memory is allocated zeroed and only touched as positions fill, so a
/// large `--ctx-size` costs address space, not RAM.
pub struct KvCache {
    n_kv: usize,
    hd: usize,
    cap: usize,
    /// positions stored per head: `cap` rounded up to whole key blocks
    stride: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, cap: usize) -> KvCache {
        let (n_kv, hd) = (cfg.num_key_value_heads, cfg.head_dim);
        let stride = cap.next_multiple_of(KEY_BLOCK);
        let per = n_kv * stride * hd;
        KvCache {
            n_kv,
            hd,
            cap,
            stride,
            len: 0,
            k: (0..cfg.num_hidden_layers).map(|_| vec![0f32; per]).collect(),
            v: (0..cfg.num_hidden_layers).map(|_| vec![0f32; per]).collect(),
        }
    }

    /// Bytes when full.
    pub fn bytes_at_capacity(cfg: &ModelConfig, cap: usize) -> u64 {
        (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cap.next_multiple_of(KEY_BLOCK) * cfg.head_dim * 4)
            as u64
    }

    /// Positions it holds.
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
        let hd = self.hd;
        for h in 0..self.n_kv {
            let dst = (h * self.stride + pos) * hd;
            self.v[layer][dst..dst + hd].copy_from_slice(&v[h * hd..(h + 1) * hd]);
            // column pos % KEY_BLOCK of its block's [hd, KEY_BLOCK]
            let block = (h * self.stride + pos / KEY_BLOCK * KEY_BLOCK) * hd;
            let kb = &mut self.k[layer][block..block + hd * KEY_BLOCK];
            for (d, &x) in k[h * hd..(h + 1) * hd].iter().enumerate() {
                kb[d * KEY_BLOCK + pos % KEY_BLOCK] = x;
            }
        }
    }

    /// Keys and values of `head` for positions `0..upto`: the keys as the whole transposed
    /// blocks that hold them (`[upto / KEY_BLOCK rounded up, hd, KEY_BLOCK]`), the values as
    /// `[upto, hd]`.
    pub fn head(&self, layer: usize, head: usize, upto: usize) -> (&[f32], &[f32]) {
        let s = head * self.stride * self.hd;
        let kn = upto.next_multiple_of(KEY_BLOCK) * self.hd;
        (&self.k[layer][s..s + kn], &self.v[layer][s..s + upto * self.hd])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_land_transposed_in_their_block_and_values_in_rows() {
        // 2 layers, 3 KV heads of 5 dims (what the cache reads of a config)
        let cfg = ModelConfig {
            arch: crate::model_config::Arch::Qwen3Moe,
            vocab_size: 10,
            hidden_size: 8,
            num_hidden_layers: 2,
            num_attention_heads: 6,
            num_key_value_heads: 3,
            head_dim: 5,
            intermediate_size: 8,
            moe_intermediate_size: 8,
            num_experts: 2,
            num_experts_per_tok: 1,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            rms_norm_eps: 1e-6,
            rope_theta: 1e4,
            max_position_embeddings: 128,
            tie_word_embeddings: false,
            bos_token_id: None,
            eos_token_ids: vec![],
            hybrid: None,
        };
        let (n_kv, hd) = (cfg.num_key_value_heads, cfg.head_dim);
        let mut kv = KvCache::new(&cfg, 70);
        assert_eq!(kv.capacity(), 70);
        let row =
            |pos: usize, h: usize, d: usize, v: bool| (pos * 1000 + h * 100 + d) as f32 + if v { 0.5 } else { 0.0 };
        for pos in [0, 5, KEY_BLOCK - 1, KEY_BLOCK, 69] {
            let k: Vec<f32> = (0..n_kv * hd).map(|i| row(pos, i / hd, i % hd, false)).collect();
            let v: Vec<f32> = (0..n_kv * hd).map(|i| row(pos, i / hd, i % hd, true)).collect();
            kv.write(1, pos, &k, &v);
        }
        for h in 0..n_kv {
            let (keys, vals) = kv.head(1, h, 70);
            assert_eq!(keys.len(), 2 * KEY_BLOCK * hd);
            assert_eq!(vals.len(), 70 * hd);
            for pos in [0, 5, KEY_BLOCK - 1, KEY_BLOCK, 69] {
                for d in 0..hd {
                    let kb = pos / KEY_BLOCK * hd * KEY_BLOCK;
                    assert_eq!(keys[kb + d * KEY_BLOCK + pos % KEY_BLOCK], row(pos, h, d, false), "key {pos} {h} {d}");
                    assert_eq!(vals[pos * hd + d], row(pos, h, d, true), "value {pos} {h} {d}");
                }
            }
            // untouched positions stay zero, and layer 0 is untouched
            assert_eq!(keys[KEY_BLOCK - 2], 0.0);
            assert!(kv.head(0, h, 70).0.iter().all(|&x| x == 0.0));
        }
    }
}
