//! What a sequence leaves behind for the tokens after it: the keys and values of every
//! attention layer (in the element types [`KvTypes`] names: f32, bf16 or f16), and in hybrid
//! models the conv and recurrent state of every linear-attention layer, in f32.
//!
//! Keys and values can be cut back to any shorter prefix; a recurrent state cannot (it has
//! folded every token in). So a hybrid model's cache goes back only to a checkpoint of its
//! recurrent and conv states ([`KvCache::checkpoint`]: taken at prompt chunk boundaries and at
//! the end of each prompt, the latest [`CHECKPOINTS`] kept), or to the start.

use moescope_kernels::attn::{Cached, KEY_BLOCK};

use super::delta_net::LinearState;
use super::kv_buf::{Buf, KvTypes};
use crate::exec::Exec;
use crate::model_config::{LayerKind, ModelConfig};

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
    types: KvTypes,
    /// per layer; empty for linear-attention layers
    k: Vec<Buf>,
    v: Vec<Buf>,
    /// per layer; `Some` for linear-attention layers
    linear: Vec<Option<LinearState>>,
    /// the linear layers' states at positions to go back to, in position order (hybrid
    /// models; empty otherwise)
    checkpoints: Vec<Checkpoint>,
    /// the linear layers' states before a speculative verify pass ([`KvCache::mark`])
    mark: Option<Checkpoint>,
}

/// The linear-attention layers' states at position `at`.
#[derive(Clone)]
struct Checkpoint {
    at: usize,
    states: Vec<Option<LinearState>>,
}

/// Checkpoints a hybrid model's cache keeps: the latest ones, so that a prompt that resends a
/// history and changes its end resumes within a prompt chunk of where it changed, over the
/// last `CHECKPOINTS` chunks (4096 tokens at 512 a chunk). Each costs the linear layers' states
/// once more (2 MiB a layer at Qwen3.5-35B-A3B's shape).
pub const CHECKPOINTS: usize = 8;

impl KvCache {
    /// A cache of `cap` positions in f32 (what the references compute: tests that compare
    /// against transformers keep it).
    pub fn new(cfg: &ModelConfig, cap: usize) -> KvCache {
        KvCache::typed(cfg, cap, KvTypes::F32)
    }

    /// A cache of `cap` positions, its keys and values in `types`.
    pub fn typed(cfg: &ModelConfig, cap: usize, types: KvTypes) -> KvCache {
        let (n_kv, hd, values) = Self::shape(cfg);
        assert!(types.check(hd).is_ok(), "{types} KV cache of {hd}-wide heads");
        let stride = cap.next_multiple_of(KEY_BLOCK);
        let per = n_kv * stride * hd;
        let attends = |l: usize| cfg.layer_kind(l) == LayerKind::FullAttention;
        let kv = |on: bool, t, keys| {
            (0..cfg.num_hidden_layers).map(|l| Buf::new(t, if attends(l) && on { per } else { 0 }, keys)).collect()
        };
        KvCache {
            n_kv,
            hd,
            cap,
            stride,
            len: 0,
            types,
            k: kv(true, types.k, true),
            v: kv(values, types.v, false),
            linear: (0..cfg.num_hidden_layers)
                .map(|l| cfg.hybrid.as_ref().filter(|_| !attends(l)).map(LinearState::new))
                .collect(),
            checkpoints: Vec::new(),
            mark: None,
        }
    }

    /// KV heads, their width, and whether values are kept beside the keys: DeepSeek-V3's
    /// absorbed latent attention keeps one "head" per token, the compressed kv and the rotary
    /// key (`kv_lora_rank + qk_rope_head_dim`: 576 floats at DeepSeek-V3's shape), its values
    /// the keys' first `kv_lora_rank` dims.
    fn shape(cfg: &ModelConfig) -> (usize, usize, bool) {
        match cfg.features.mla {
            Some(m) => (1, m.kv_lora_rank + m.qk_rope_head_dim, false),
            None => (cfg.num_key_value_heads, cfg.head_dim, true),
        }
    }

    /// Bytes when full (a hybrid's recurrent states counted once live and once for each
    /// checkpoint).
    pub fn bytes_at_capacity(cfg: &ModelConfig, cap: usize, types: KvTypes) -> u64 {
        cap.next_multiple_of(KEY_BLOCK) as u64 * Self::bytes_per_token(cfg, types)
            + (1 + CHECKPOINTS as u64) * Self::linear_bytes(cfg)
    }

    /// Bytes of keys and values one position takes over all layers.
    pub fn bytes_per_token(cfg: &ModelConfig, types: KvTypes) -> u64 {
        let (n_kv, hd, values) = Self::shape(cfg);
        let per = cfg.attention_layers() * n_kv * hd;
        (types.k.bytes(per) + if values { types.v.bytes(per) } else { 0 }) as u64
    }

    /// Whether a cache of `cfg`'s shape can keep `types` (q8_0 needs rows of whole 32-value
    /// blocks): the one-line reason where not.
    pub fn check_types(cfg: &ModelConfig, types: KvTypes) -> Result<(), String> {
        types.check(Self::shape(cfg).1)
    }

    /// The element types of its keys and values.
    pub fn types(&self) -> KvTypes {
        self.types
    }

    /// Bytes of one copy of a hybrid's linear-attention states (0 without).
    pub fn linear_bytes(cfg: &ModelConfig) -> u64 {
        let per = cfg.hybrid.as_ref().map_or(0, |h| h.state_len() + h.conv_state_len());
        ((cfg.num_hidden_layers - cfg.attention_layers()) * per * 4) as u64
    }

    /// Bytes its first `len` positions and its checkpoints take.
    pub fn bytes_used(&self) -> u64 {
        let per_pos: usize =
            self.k.iter().chain(&self.v).filter(|b| !b.is_empty()).map(|b| b.kind().bytes(self.n_kv * self.hd)).sum();
        let linear: u64 = self.linear.iter().flatten().map(LinearState::bytes).sum();
        (self.len.next_multiple_of(KEY_BLOCK) * per_pos) as u64
            + linear * (1 + self.checkpoints.len() as u64 + u64::from(self.mark.is_some()))
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

    /// Forget everything from position `len` on, as far as the cache can: returns the
    /// position it now holds. Keys and values go back anywhere; a recurrent state only to the
    /// latest checkpoint at or before `len`, else to the start.
    pub fn rewind(&mut self, len: usize) -> usize {
        let to = self.reachable(len);
        if to == self.len {
            return to;
        }
        if !self.hybrid() {
            self.len = to;
            return to;
        }
        self.checkpoints.retain(|c| c.at <= to);
        match self.checkpoints.last() {
            Some(c) if c.at == to => {
                for (live, saved) in self.linear.iter_mut().zip(&c.states) {
                    if let (Some(live), Some(saved)) = (live, saved) {
                        live.clone_from(saved);
                    }
                }
                self.len = to;
            }
            _ => self.clear(),
        }
        self.len
    }

    /// Whether it holds recurrent states (a hybrid model's), which go back only to a checkpoint.
    pub fn hybrid(&self) -> bool {
        self.linear.iter().any(Option::is_some)
    }

    /// Set the linear layers' states at the current position aside, apart from the checkpoints
    /// (a speculative verify pass: its rows past the accepted drafts are undone, and the prompt's
    /// checkpoints must stay); one mark at a time, its buffers reused. No-op unless hybrid.
    pub fn mark(&mut self) {
        if !self.hybrid() {
            return;
        }
        let m = self.mark.get_or_insert_with(|| Checkpoint { at: 0, states: self.linear.clone() });
        m.at = self.len;
        for (saved, live) in m.states.iter_mut().zip(&self.linear) {
            saved.clone_from(live);
        }
    }

    /// Back to the [`mark`](Self::mark)'s position and linear states (positions after it
    /// forgotten); the position, or None without a mark at or before the current one.
    pub fn back_to_mark(&mut self) -> Option<usize> {
        let m = self.mark.as_ref().filter(|m| m.at <= self.len)?;
        for (live, saved) in self.linear.iter_mut().zip(&m.states) {
            if let (Some(live), Some(saved)) = (live, saved) {
                live.clone_from(saved);
            }
        }
        self.checkpoints.retain(|c| c.at <= m.at);
        self.len = m.at;
        Some(m.at)
    }

    /// The position [`rewind`](Self::rewind)`(len)` would go back to.
    pub fn reachable(&self, len: usize) -> usize {
        if len >= self.len || !self.hybrid() {
            return len.min(self.len);
        }
        self.checkpoints.iter().rev().find(|c| c.at <= len).map_or(0, |c| c.at)
    }

    /// Back to an empty sequence.
    pub fn clear(&mut self) {
        self.checkpoints.clear();
        self.mark = None;
        self.linear.iter_mut().flatten().for_each(LinearState::reset);
        self.len = 0;
    }

    /// Remember the recurrent states at the current position, so that a later sequence that
    /// shares this prefix can start here (a no-op without linear-attention layers). The oldest
    /// checkpoint goes (its buffers reused) when [`CHECKPOINTS`] are kept.
    pub fn checkpoint(&mut self) {
        if !self.hybrid() || self.checkpoints.last().is_some_and(|c| c.at == self.len) {
            return;
        }
        let mut c = if self.checkpoints.len() >= CHECKPOINTS {
            self.checkpoints.remove(0)
        } else {
            Checkpoint { at: 0, states: self.linear.clone() }
        };
        c.at = self.len;
        for (saved, live) in c.states.iter_mut().zip(&self.linear) {
            saved.clone_from(live);
        }
        self.checkpoints.push(c);
    }

    /// Whether a checkpoint sits at `at`.
    pub fn has_checkpoint(&self, at: usize) -> bool {
        self.checkpoints.iter().any(|c| c.at == at)
    }

    /// Become `src`'s first `len` positions (`len` one [`reachable`](Self::reachable) gives in
    /// `src`, or its whole length), its checkpoints up to there included: a sequence started
    /// from a cached prefix. False when `len` is not reachable or does not fit.
    pub fn copy_prefix(&mut self, src: &KvCache, len: usize) -> bool {
        if src.reachable(len) != len
            || len > self.cap
            || (self.n_kv, self.hd, self.k.len(), self.types) != (src.n_kv, src.hd, src.k.len(), src.types)
        {
            return false;
        }
        let blocks = len.next_multiple_of(KEY_BLOCK);
        for (dst, from) in self.k.iter_mut().zip(&src.k).chain(self.v.iter_mut().zip(&src.v)) {
            if dst.is_empty() {
                continue;
            }
            // per head: the blocks that hold positions 0..len (keys transposed in blocks, values
            // in rows: either way the first `blocks` positions' values)
            for h in 0..self.n_kv {
                let (d0, s0, n) = (h * self.stride * self.hd, h * src.stride * src.hd, blocks * self.hd);
                dst.copy_from(d0, from, s0, n);
            }
        }
        self.checkpoints.clear();
        self.checkpoints.extend(src.checkpoints.iter().filter(|c| c.at <= len).cloned());
        let states = match src.checkpoints.iter().find(|c| c.at == len) {
            Some(c) if len < src.len => &c.states,
            _ => &src.linear,
        };
        for (live, saved) in self.linear.iter_mut().zip(states) {
            if let (Some(live), Some(saved)) = (live, saved) {
                live.clone_from(saved);
            }
        }
        self.len = len;
        true
    }

    /// The conv and recurrent state of linear-attention `layer` (None for an attention layer).
    pub fn linear_mut(&mut self, layer: usize) -> Option<&mut LinearState> {
        self.linear.get_mut(layer).and_then(Option::as_mut)
    }

    /// Mark positions up to `len` as filled (after a forward pass wrote them).
    pub fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.cap);
        self.len = len;
    }

    /// Store `k` and `v` (`[n_kv * hd]` each; `v` empty where the cache keeps no values) of
    /// position `pos` for `layer`, rounded to the cache's element types.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (hd, n_kv) = (self.hd, self.n_kv);
        let with_values = !self.v[layer].is_empty();
        let (keys, vals) = (self.k[layer].heads(n_kv), self.v[layer].heads(n_kv));
        for h in 0..n_kv {
            if with_values {
                // SAFETY: one run at a time
                unsafe { vals.head(h) }.store_row(pos * hd, &v[h * hd..(h + 1) * hd]);
            }
            // SAFETY: as above
            unsafe { keys.head(h) }.store_key(pos, &k[h * hd..(h + 1) * hd]);
        }
    }

    /// Tokens `pos0..pos0 + T` of layer `layer` (`k`, `v`: `[T, n_kv, hd]`, as [`write`]
    /// takes each), a task per KV head over the threads: the keys' transposed stores are
    /// scattered, and a prompt chunk's took a millisecond a layer on the calling thread alone.
    ///
    /// [`write`]: Self::write
    pub fn write_rows(&mut self, exec: &Exec, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let (hd, n_kv) = (self.hd, self.n_kv);
        let t_n = k.len() / (n_kv * hd).max(1);
        let with_values = !self.v[layer].is_empty();
        assert!(pos0 + t_n <= self.stride && (!with_values || v.len() == k.len()), "KV rows out of the cache");
        let (keys, vals) = (self.k[layer].heads(n_kv), self.v[layer].heads(n_kv));
        exec.run(n_kv, &|h, _| {
            // SAFETY: task h alone touches head h's runs of the layer's keys and values
            let (mut kh, mut vh) = unsafe { (keys.head(h), vals.head(h)) };
            for t in 0..t_n {
                let (pos, src) = (pos0 + t, (t * n_kv + h) * hd);
                if with_values {
                    vh.store_row(pos * hd, &v[src..src + hd]);
                }
                kh.store_key(pos, &k[src..src + hd]);
            }
        });
    }

    /// Keys and values of `head` for positions `0..upto`: the keys as the whole transposed
    /// blocks that hold them (`[upto / KEY_BLOCK rounded up, hd, KEY_BLOCK]`), the values as
    /// `[upto, hd]` (None where the cache keeps no values).
    pub fn head(&self, layer: usize, head: usize, upto: usize) -> (Cached<'_>, Option<Cached<'_>>) {
        let s = head * self.stride * self.hd;
        let kn = upto.next_multiple_of(KEY_BLOCK) * self.hd;
        let v = &self.v[layer];
        (self.k[layer].part(s, kn), if v.is_empty() { None } else { Some(v.part(s, upto * self.hd)) })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A head's keys and values (none: empty) widened to f32.
    fn wide(kv: &KvCache, layer: usize, h: usize, upto: usize) -> (Vec<f32>, Vec<f32>) {
        let (k, v) = kv.head(layer, h, upto);
        let mut out = (Vec::new(), Vec::new());
        k.widen_into(0..k.len(), &mut out.0);
        if let Some(v) = v {
            v.widen_into(0..v.len(), &mut out.1);
        }
        out
    }

    /// 2 layers, 3 KV heads of 5 dims (what the cache reads of a config).
    fn config() -> ModelConfig {
        config_hd(5)
    }

    /// [`config`] with heads `hd` wide (also the sizing tests' small config).
    pub(crate) fn config_hd(hd: usize) -> ModelConfig {
        ModelConfig {
            arch: crate::model_config::Arch::Qwen3Moe,
            vocab_size: 10,
            hidden_size: 8,
            num_hidden_layers: 2,
            num_attention_heads: 6,
            num_key_value_heads: 3,
            head_dim: hd,
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
            features: Default::default(),
        }
    }

    #[test]
    fn keys_land_transposed_in_their_block_and_values_in_rows() {
        let cfg = config();
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
            let (keys, vals) = wide(&kv, 1, h, 70);
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
            assert!(wide(&kv, 0, h, 70).0.iter().all(|&x| x == 0.0));
        }
    }

    #[test]
    fn a_prompts_rows_land_where_token_by_token_writes_put_them() {
        let cfg = config();
        let (n_kv, hd, t_n, pos0) = (cfg.num_key_value_heads, cfg.head_dim, KEY_BLOCK + 3, 5);
        let k: Vec<f32> = (0..t_n * n_kv * hd).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..t_n * n_kv * hd).map(|i| -(i as f32)).collect();
        let (mut one, mut rows) = (KvCache::new(&cfg, 70), KvCache::new(&cfg, 70));
        for t in 0..t_n {
            let r = t * n_kv * hd..(t + 1) * n_kv * hd;
            one.write(1, pos0 + t, &k[r.clone()], &v[r]);
        }
        let exec = Exec::new(2, moescope_kernels::Isa::detect()).expect("threads");
        rows.write_rows(&exec, 1, pos0, &k, &v);
        for h in 0..n_kv {
            assert!(wide(&one, 1, h, 70) == wide(&rows, 1, h, 70), "head {h}");
            assert!(wide(&one, 1, h, 70).0.iter().any(|&x| x != 0.0), "head {h} written");
        }
    }

    /// A bf16, f16, q8_0 or mixed cache holds each key and value as its type rounds it,
    /// written one position at a time or as a prompt's rows; its bytes are the types' (the
    /// formula written out: 2 attention layers x 3 heads x 32 dims, keys and values; q8_0 34
    /// bytes per 32).
    #[test]
    fn a_typed_cache_holds_each_value_rounded_to_its_type() {
        use super::super::kv_buf::KvType::{self, Bf16, F16, F32, Q8_0};
        use moescope_kernels::attn::{self, KvElem, q8, stored};
        let cfg = config_hd(32);
        let (n_kv, hd, t_n) = (cfg.num_key_value_heads, cfg.head_dim, KEY_BLOCK + 3);
        // values no two-byte type holds exactly
        let k: Vec<f32> = (0..t_n * n_kv * hd).map(|i| 1.0 + i as f32 / 3000.0).collect();
        let v: Vec<f32> = (0..t_n * n_kv * hd).map(|i| -0.1 - i as f32 / 7000.0).collect();
        let exec = Exec::new(2, moescope_kernels::Isa::detect()).expect("threads");
        // what type t holds of the row (one head's hd values) that holds src
        let round = |t: KvType, src: usize, x: &[f32]| match t {
            F32 => x[src],
            Bf16 => stored::<attn::Bf16>(x[src]),
            F16 => stored::<attn::F16>(x[src]),
            Q8_0 => {
                let (g0, mut codes) = (src / q8::Q8_GROUP * q8::Q8_GROUP, [0i8; q8::Q8_GROUP]);
                let d = q8::q8_0(&x[g0..g0 + q8::Q8_GROUP], &mut codes);
                codes[src - g0] as f32 * d.to_f32()
            }
        };
        let bytes = |t: KvType| match t {
            F32 => 4.0,
            Bf16 | F16 => 2.0,
            Q8_0 => 34.0 / 32.0,
        };
        for types in [
            KvTypes { k: Bf16, v: Bf16 },
            KvTypes { k: F16, v: F16 },
            KvTypes { k: Bf16, v: F32 },
            KvTypes { k: Q8_0, v: Q8_0 },
            KvTypes { k: Q8_0, v: F16 },
        ] {
            let (mut one, mut rows) = (KvCache::typed(&cfg, 70, types), KvCache::typed(&cfg, 70, types));
            for t in 0..t_n {
                let r = t * n_kv * hd..(t + 1) * n_kv * hd;
                one.write(1, t, &k[r.clone()], &v[r]);
            }
            rows.write_rows(&exec, 1, 0, &k, &v);
            for h in 0..n_kv {
                let (keys, vals) = wide(&one, 1, h, t_n);
                assert!((keys.clone(), vals.clone()) == wide(&rows, 1, h, t_n), "{types}: rows vs one at a time");
                for t in 0..t_n {
                    for d in 0..hd {
                        let (kb, src) = (t / KEY_BLOCK * hd * KEY_BLOCK, (t * n_kv + h) * hd + d);
                        assert_eq!(keys[kb + d * KEY_BLOCK + t % KEY_BLOCK], round(types.k, src, &k), "{types} key");
                        assert_eq!(vals[t * hd + d], round(types.v, src, &v), "{types} value");
                    }
                }
            }
            let per = (2.0 * 3.0 * 32.0 * (bytes(types.k) + bytes(types.v))) as u64;
            assert_eq!(KvCache::bytes_per_token(&cfg, types), per);
            assert_eq!(KvCache::bytes_at_capacity(&cfg, 70, types), 2 * KEY_BLOCK as u64 * per);
            // a cache of other types cannot take its prefix
            let mut f32s = KvCache::new(&cfg, 70);
            rows.set_len(t_n);
            assert!(!f32s.copy_prefix(&rows, 10), "{types} copied into f32");
            let mut same = KvCache::typed(&cfg, 70, types);
            assert!(same.copy_prefix(&rows, 10));
            assert!(wide(&same, 1, 0, 10) == wide(&rows, 1, 0, 10));
        }
    }

    /// `config()` with layer 0 linear attention (one key and one value head of 2 dims).
    fn hybrid() -> ModelConfig {
        use crate::model_config::{HybridConfig, LayerKind};
        let mut c = config();
        c.hybrid = Some(HybridConfig {
            layer_types: vec![LayerKind::LinearAttention, LayerKind::FullAttention],
            rotary_dim: 4,
            conv_kernel: 2,
            key_heads: 1,
            key_head_dim: 2,
            value_heads: 1,
            value_head_dim: 2,
            shared_expert_intermediate_size: 0,
            value_heads_tiled: false,
            a_stored_negated_exp: false,
        });
        c
    }

    /// Fill positions `kv.len()..len`: layer 1's keys and values are the position, layer 0's
    /// state is the number of positions folded in so far.
    fn advance(kv: &mut KvCache, len: usize) {
        let w = kv.n_kv * kv.hd;
        for pos in kv.len()..len {
            let row = vec![pos as f32; w];
            kv.write(1, pos, &row, &row);
        }
        if let Some(st) = kv.linear_mut(0) {
            st.s.fill(len as f32);
            st.conv.fill(-(len as f32));
        }
        kv.set_len(len);
    }

    #[test]
    fn a_hybrid_goes_back_to_its_latest_checkpoint_and_a_copy_starts_from_any_it_can_reach() {
        let cfg = hybrid();
        let mut kv = KvCache::new(&cfg, 200);
        // checkpoints at 10, 20, ..., past how many are kept: the oldest go
        for n in 1..=CHECKPOINTS + 3 {
            advance(&mut kv, 10 * n);
            kv.checkpoint();
        }
        advance(&mut kv, 10 * (CHECKPOINTS + 3) + 5);
        let oldest = 10 * 4;
        assert_eq!(kv.reachable(oldest - 1), 0, "dropped checkpoints are not reachable");
        assert_eq!(kv.reachable(oldest + 7), oldest);
        assert_eq!(kv.reachable(10 * (CHECKPOINTS + 3) + 2), 10 * (CHECKPOINTS + 3));
        assert_eq!(kv.reachable(1000), kv.len(), "the whole sequence, live state");

        // a copy of a reachable prefix: its keys, values and the checkpoint's state
        let mut copy = KvCache::new(&cfg, 100);
        assert!(!copy.copy_prefix(&kv, oldest + 7), "unreachable: refused");
        assert!(copy.copy_prefix(&kv, oldest + 10));
        assert_eq!(copy.len(), oldest + 10);
        assert_eq!(copy.linear_mut(0).map(|s| s.s[0]), Some((oldest + 10) as f32));
        for h in 0..cfg.num_key_value_heads {
            let (a, b) = (wide(&kv, 1, h, oldest + 10), wide(&copy, 1, h, oldest + 10));
            assert!(a.1 == b.1, "values of head {h}");
            // keys: whole blocks, positions past the prefix are the source's too (never read)
            assert!(a.0 == b.0, "keys of head {h}");
        }
        // the copy goes back to the checkpoints it took along
        assert_eq!(copy.rewind(oldest + 3), oldest);
        assert_eq!(copy.linear_mut(0).map(|s| (s.s[0], s.conv[0])), Some((oldest as f32, -(oldest as f32))));
        // the live state when the whole sequence is copied
        let mut whole = KvCache::new(&cfg, 200);
        assert!(whole.copy_prefix(&kv, kv.len()));
        assert_eq!(whole.linear_mut(0).map(|s| s.s[0]), Some(kv.len() as f32));

        // rewinding the source past every checkpoint starts it over
        assert_eq!(kv.rewind(5), 0);
        assert_eq!(kv.linear_mut(0).map(|s| s.s[0]), Some(0.0));
        assert!(!kv.has_checkpoint(oldest));
    }
}
