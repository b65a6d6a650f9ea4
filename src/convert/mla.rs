//! A DeepSeek-V3 checkpoint's latent attention seen in the package's absorbed layout: each
//! head's key and value up-projections as two matrices whose rows the absorbed products read
//! (the same split llama.cpp's newer `deepseek2` files hold as `attn_k_b` / `attn_v_b`).
//!
//! `kv_b_proj` `[nh * (nope + v), r]` holds, per head h, nope key rows then v value rows, each
//! of the compressed kv's r dims. The package keeps
//! - `self_attn.k_b_proj` `[nh * r, nope]`: row `h r + c` is column c of head h's key rows, so
//!   the absorbed query `W_UK_h^T q_nope_h` is one product of head h's r rows;
//! - `self_attn.v_b_proj` `[nh * v, r]`: head h's value rows as they are.
//!
//! A source that already holds the split (a GGUF file) passes it through with its own codes;
//! everything else passes through.

use super::error::ConvertError;
use super::source::TensorSource;
use crate::model_config::{Mla, ModelConfig};
use crate::package::layout::ScaleForm;

pub struct MlaSource<'a> {
    src: &'a dyn TensorSource,
    heads: usize,
    m: Mla,
}

/// Which half of `kv_b_proj` a package tensor is made from.
#[derive(Clone, Copy, PartialEq)]
enum Half {
    Keys,
    Values,
}

impl<'a> MlaSource<'a> {
    /// `None` when `cfg` has no latent attention.
    pub fn new(src: &'a dyn TensorSource, cfg: &ModelConfig) -> Option<MlaSource<'a>> {
        Some(MlaSource { src, heads: cfg.num_attention_heads, m: cfg.features.mla? })
    }

    /// The half of the source's `kv_b_proj` that `name` is made from, when the source does not
    /// hold `name` itself.
    fn derived(&self, name: &str) -> Option<(String, Half)> {
        if self.src.shape(name).is_some() {
            return None;
        }
        let (layer, half) = match name.rsplit_once(".self_attn.")? {
            (l, "k_b_proj.weight") => (l, Half::Keys),
            (l, "v_b_proj.weight") => (l, Half::Values),
            _ => return None,
        };
        Some((format!("{layer}.self_attn.kv_b_proj.weight"), half))
    }

    /// The derived tensor's shape, when the source's `kv_b_proj` has the one the config says.
    fn derived_shape(&self, kv_b: &str, half: Half) -> Option<Vec<usize>> {
        let (nh, m) = (self.heads, self.m);
        let (r, nope, v) = (m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim);
        let s = self.src.shape(kv_b)?;
        if s != [nh * (nope + v), r] {
            // the converter's shape check names the source's shape as wrong
            return Some(s);
        }
        Some(match half {
            Half::Keys => vec![nh * r, nope],
            Half::Values => vec![nh * v, r],
        })
    }

    fn out_of_range(&self, kv_b: &str, name: &str, r0: usize, n: usize) -> ConvertError {
        ConvertError::Tensor {
            file: self.src.origin(kv_b).into(),
            name: name.into(),
            msg: format!("rows {r0}..{} out of range", r0 + n),
        }
    }
}

impl TensorSource for MlaSource<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.derived(name) {
            Some((kv_b, half)) => self.derived_shape(&kv_b, half),
            None => self.src.shape(name),
        }
    }

    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
        let Some((kv_b, half)) = self.derived(name) else {
            return self.src.read_rows(name, r0, n, out);
        };
        let (r, nope, v) = (self.m.kv_lora_rank, self.m.qk_nope_head_dim, self.m.v_head_dim);
        let per = nope + v;
        let rows = self.derived_shape(&kv_b, half).map_or(0, |s| s[0]);
        if r0 + n > rows || r == 0 {
            return Err(self.out_of_range(&kv_b, name, r0, n));
        }
        out.clear();
        if half == Half::Values {
            // head h's value rows are kv_b's rows h (nope + v) + nope ..; runs within a head
            let mut part = Vec::new();
            let mut row = r0;
            while row < r0 + n {
                let (h, j) = (row / v, row % v);
                let take = (v - j).min(r0 + n - row);
                self.src.read_rows(&kv_b, h * per + nope + j, take, &mut part)?;
                out.extend_from_slice(&part);
                row += take;
            }
            return Ok(());
        }
        // keys: row h r + c = column c of head h's nope key rows `[nope, r]`
        out.resize(n * nope, 0.0);
        let mut keys = Vec::new();
        let mut row = r0;
        while row < r0 + n {
            let (h, c0) = (row / r, row % r);
            let take = (r - c0).min(r0 + n - row);
            self.src.read_rows(&kv_b, h * per, nope, &mut keys)?;
            for c in c0..c0 + take {
                let dst = &mut out[(row - r0 + c - c0) * nope..][..nope];
                dst.iter_mut().enumerate().for_each(|(d, o)| *o = keys[d * r + c]);
            }
            row += take;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn encoded_rows(
        &self,
        name: &str,
        f: moescope_kernels::Format,
        r0: usize,
        n: usize,
        vals: &mut Vec<u8>,
        scales: &mut Vec<f32>,
        mins: Option<&mut Vec<f32>>,
    ) -> Result<bool, ConvertError> {
        match self.derived(name) {
            Some(_) => Ok(false),
            None => self.src.encoded_rows(name, f, r0, n, vals, scales, mins),
        }
    }

    fn file_bytes(&self, name: &str, r0: usize, n: usize, out: &mut Vec<u8>) -> Result<bool, ConvertError> {
        match self.derived(name) {
            Some(_) => Ok(false),
            None => self.src.file_bytes(name, r0, n, out),
        }
    }

    fn exact_format(&self, name: &str) -> Option<(moescope_kernels::Format, ScaleForm)> {
        match self.derived(name) {
            // the split's values are kv_b's, in other groups: exact only where kv_b is unquantized
            Some((kv_b, _)) => self.src.exact_format(&kv_b).filter(|(f, _)| f.group().is_none()),
            None => self.src.exact_format(name),
        }
    }

    fn origin(&self, name: &str) -> String {
        self.src.origin(&self.source_name(name))
    }

    fn source_name(&self, name: &str) -> String {
        self.derived(name).map_or_else(|| self.src.source_name(name), |(kv_b, _)| self.src.source_name(&kv_b))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Named tensors of given shapes and values.
    struct Tensors(HashMap<String, (Vec<usize>, Vec<f32>)>);

    impl TensorSource for Tensors {
        fn shape(&self, name: &str) -> Option<Vec<usize>> {
            self.0.get(name).map(|t| t.0.clone())
        }
        fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
            let (s, v) = &self.0[name];
            let cols = s[1];
            out.clear();
            out.extend_from_slice(&v[r0 * cols..(r0 + n) * cols]);
            Ok(())
        }
        fn origin(&self, _: &str) -> String {
            "test".into()
        }
    }

    /// DeepSeek-V3's shape with `nh` heads and the latent dims given.
    fn config(nh: usize, r: usize, nope: usize, v: usize) -> ModelConfig {
        let mut c = crate::synth::shapes::find("deepseek-v3").expect("shape").config();
        c.num_attention_heads = nh;
        let m = c.features.mla.as_mut().expect("latent attention");
        (m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim) = (r, nope, v);
        c
    }

    /// Every element of the split equals kv_b_proj's element it is defined by, whatever rows a
    /// read starts and ends at (the oracle indexes kv_b_proj directly).
    #[test]
    fn split_rows_are_kv_b_rows_and_transposed_columns() {
        let (nh, r, nope, v) = (3, 5, 4, 6);
        let rows = nh * (nope + v);
        let kv_b: Vec<f32> = (0..rows * r).map(|i| i as f32).collect();
        let name = "model.layers.0.self_attn.kv_b_proj.weight";
        let src = Tensors(HashMap::from([(name.to_string(), (vec![rows, r], kv_b.clone()))]));
        let cfg = config(nh, r, nope, v);
        let s = MlaSource::new(&src, &cfg).expect("latent attention");
        let at = |row: usize, col: usize| kv_b[row * r + col];
        let k = "model.layers.0.self_attn.k_b_proj.weight";
        let vb = "model.layers.0.self_attn.v_b_proj.weight";
        assert_eq!(s.shape(k), Some(vec![nh * r, nope]));
        assert_eq!(s.shape(vb), Some(vec![nh * v, r]));
        let mut out = Vec::new();
        for (r0, n) in [(0, nh * r), (3, 9), (7, 1), (14, 1)] {
            s.read_rows(k, r0, n, &mut out).expect("rows");
            for i in 0..n {
                let (h, c) = ((r0 + i) / r, (r0 + i) % r);
                for d in 0..nope {
                    assert_eq!(out[i * nope + d], at(h * (nope + v) + d, c), "k_b row {} dim {d}", r0 + i);
                }
            }
        }
        for (r0, n) in [(0, nh * v), (4, 9), (17, 1)] {
            s.read_rows(vb, r0, n, &mut out).expect("rows");
            for i in 0..n {
                let (h, j) = ((r0 + i) / v, (r0 + i) % v);
                for c in 0..r {
                    assert_eq!(out[i * r + c], at(h * (nope + v) + nope + j, c), "v_b row {} col {c}", r0 + i);
                }
            }
        }
        assert!(s.read_rows(k, nh * r - 1, 2, &mut out).is_err());
    }
}
