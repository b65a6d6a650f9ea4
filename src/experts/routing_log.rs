//! Routing traces (`--routing-out FILE`): which experts every token picked in every MoE layer,
//! with what a replay needs. JSON lines:
//!
//! ```text
//! {"moescope_routing":1,"model":"...","moe_layers":[0,1,...],"num_experts":128,"top_k":8,"bytes_per_expert":2576384}
//! {"p":0,"t":0,"l":0,"e":[5,17,...],"w":[0.21,0.18,...]}
//! ```
//! `p` is the forward pass (a prompt chunk is one pass of many tokens, a decode step one pass
//! of one token), `t` the token's position, `l` the MoE layer index (0-based, forward order),
//! `e` the experts in rank order and `w` their routing weights.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::Observer;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub moescope_routing: u32,
    pub model: String,
    pub moe_layers: Vec<usize>,
    pub num_experts: usize,
    pub top_k: usize,
    pub bytes_per_expert: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub p: u64,
    pub t: usize,
    pub l: usize,
    pub e: Vec<usize>,
    pub w: Vec<f32>,
}

/// Writes a routing trace as the engine runs (an [`Observer`]); `finish` renames it into place.
pub struct RoutingLog {
    path: PathBuf,
    tmp: PathBuf,
    w: Option<BufWriter<File>>,
    moe_layers: Vec<usize>,
    pass: u64,
    started: bool,
    error: Option<std::io::Error>,
}

impl RoutingLog {
    pub fn create(path: &Path, header: &Header) -> std::io::Result<RoutingLog> {
        let tmp = path.with_extension("partial");
        let mut w = BufWriter::new(File::create(&tmp)?);
        serde_json::to_writer(&mut w, header)?;
        w.write_all(b"\n")?;
        Ok(RoutingLog {
            path: path.to_path_buf(),
            tmp,
            w: Some(w),
            moe_layers: header.moe_layers.clone(),
            pass: 0,
            started: false,
            error: None,
        })
    }

    /// Flush and rename into place; the first write error, if any, is returned here.
    pub fn finish(mut self) -> std::io::Result<PathBuf> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if let Some(mut w) = self.w.take() {
            w.flush()?;
        }
        std::fs::rename(&self.tmp, &self.path)?;
        Ok(self.path.clone())
    }
}

impl Observer for RoutingLog {
    fn begin_pass(&mut self) {
        if self.started {
            self.pass += 1;
        }
        self.started = true;
    }

    fn routing(&mut self, layer: usize, pos: usize, experts: &[usize], weights: &[f32], _probs: &[f32]) {
        if self.error.is_some() {
            return;
        }
        let Some(l) = self.moe_layers.iter().position(|&x| x == layer) else { return };
        let r = Record { p: self.pass, t: pos, l, e: experts.to_vec(), w: weights.to_vec() };
        if let Some(w) = self.w.as_mut()
            && let Err(e) =
                serde_json::to_writer(&mut *w, &r).map_err(std::io::Error::from).and_then(|_| w.write_all(b"\n"))
        {
            self.error = Some(e);
        }
    }
}

impl Drop for RoutingLog {
    fn drop(&mut self) {
        if self.w.is_some() {
            self.w.take();
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A routing trace read back: the header and the records in order.
pub fn read(path: &Path) -> Result<(Header, Vec<Record>), String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = BufReader::new(f).lines();
    let first = lines
        .next()
        .ok_or_else(|| format!("{}: empty file", path.display()))?
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let h: Header = serde_json::from_str(&first)
        .map_err(|e| format!("{}: line 1: not a moescope routing trace header ({e})", path.display()))?;
    if h.moescope_routing != 1 {
        return Err(format!("{}: routing trace version {} is not supported", path.display(), h.moescope_routing));
    }
    let mut recs = Vec::new();
    for (i, line) in lines.enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(&line).map_err(|e| format!("{}: line {}: {e}", path.display(), i + 2))?;
        if r.l >= h.moe_layers.len() || r.e.iter().any(|&e| e >= h.num_experts) {
            return Err(format!("{}: line {}: layer or expert out of range", path.display(), i + 2));
        }
        recs.push(r);
    }
    Ok((h, recs))
}
