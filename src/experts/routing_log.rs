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
//!
//! Traces recorded outside the engine (`tests/reference/train_routing.py`) may add `ph`
//! (`"prefill"` or `"decode"`), and the predictor's candidates for the next MoE layer made from
//! this layer's input: `c` (experts, most probable first) and `cs` (their probabilities); their
//! header then says how many candidates a record has (`candidates`). A trace may be gzipped,
//! or in xz (read whole into memory, up to [`MAX_XZ`] bytes unpacked).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::Observer;
use crate::model::route_replay::{RouteReplay, TraceRoute};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub moescope_routing: u32,
    pub model: String,
    pub moe_layers: Vec<usize>,
    pub num_experts: usize,
    pub top_k: usize,
    pub bytes_per_expert: u64,
    /// Predictor candidates per record (`c`), when the trace carries them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub p: u64,
    pub t: usize,
    pub l: usize,
    pub e: Vec<usize>,
    pub w: Vec<f32>,
    /// "prefill" or "decode", where the recorder said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ph: Option<String>,
    /// The predictor's candidates for the next MoE layer (from this layer's input), most
    /// probable first, and their probabilities.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub c: Vec<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cs: Vec<f32>,
}

impl Record {
    /// A route without the recorder's extras.
    pub fn new(p: u64, t: usize, l: usize, e: Vec<usize>, w: Vec<f32>) -> Record {
        Record { p, t, l, e, w, ph: None, c: Vec::new(), cs: Vec::new() }
    }
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
        crate::out_file::check_destination(path)?;
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
        let r = Record::new(self.pass, pos, l, experts.to_vec(), weights.to_vec());
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

/// The longest line a trace may hold: a record of 512 experts with candidates is a few KB (a
/// path to a device without line ends, such as /dev/zero, grew one line until memory ran out).
const MAX_LINE: u64 = 1 << 24;

/// The most bytes an xz trace may unpack to (it is read whole; a larger trace can be plain or
/// gzipped, which are read a line at a time).
pub const MAX_XZ: usize = 1 << 30;

/// A routing trace read back (plain, gzipped or xz): the header and the records in order, each
/// checked against the header.
pub fn read(path: &Path) -> Result<(Header, Vec<Record>), String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut f = BufReader::new(File::open(path).map_err(|e| at(&e))?);
    let start = f.fill_buf().map_err(|e| at(&e))?;
    let (gz, xz) = (start.starts_with(&[0x1f, 0x8b]), start.starts_with(&crate::packed::XZ_MAGIC));
    let mut reader: Box<dyn BufRead> = if gz {
        Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(f)))
    } else if xz {
        let packed = crate::bounded_read::read_file(path, MAX_XZ as u64).map_err(|e| at(&e))?;
        Box::new(std::io::Cursor::new(crate::packed::xz_decompress(&packed, MAX_XZ).map_err(|e| at(&e))?))
    } else {
        Box::new(f)
    };
    let mut next_line = move || crate::bounded_read::read_line(&mut reader, MAX_LINE).transpose();
    let first = next_line().ok_or_else(|| at(&"empty file"))?.map_err(|e| at(&e))?;
    let h: Header = serde_json::from_str(&first)
        .map_err(|e| format!("{}: line 1: not a moescope routing trace header ({e})", path.display()))?;
    if h.moescope_routing != 1 {
        return Err(format!("{}: routing trace version {} is not supported", path.display(), h.moescope_routing));
    }
    if h.moe_layers.is_empty() || h.num_experts == 0 || h.top_k == 0 || h.top_k > h.num_experts {
        return Err(format!(
            "{}: header: {} MoE layers, {} experts, top-{}: nothing to route",
            path.display(),
            h.moe_layers.len(),
            h.num_experts,
            h.top_k
        ));
    }
    let mut recs = Vec::new();
    for (i, line) in std::iter::from_fn(next_line).enumerate() {
        let line = line.map_err(|e| at(&e))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(&line).map_err(|e| format!("{}: line {}: {e}", path.display(), i + 2))?;
        check_record(&h, &r).map_err(|e| format!("{}: line {}: {e}", path.display(), i + 2))?;
        recs.push(r);
    }
    Ok((h, recs))
}

/// A trace read back, as routes for the model to follow (`--route-from`); `name` for messages.
pub fn replay(name: &str, h: &Header, recs: Vec<Record>) -> Result<RouteReplay, String> {
    let routes = recs.into_iter().map(|r| TraceRoute {
        key: (r.p, r.t),
        layer: r.l,
        experts: r.e,
        weights: r.w,
        candidates: r.c,
    });
    RouteReplay::new(name, h.moe_layers.len(), h.num_experts, h.top_k, routes)
}

fn check_record(h: &Header, r: &Record) -> Result<(), String> {
    if r.l >= h.moe_layers.len() {
        return Err(format!("MoE layer {} out of range (the header has {})", r.l, h.moe_layers.len()));
    }
    if let Some(&e) = r.e.iter().chain(&r.c).find(|&&e| e >= h.num_experts) {
        return Err(format!("expert {e} out of range (the header has {})", h.num_experts));
    }
    if r.e.len() != r.w.len() || r.e.len() > h.top_k {
        return Err(format!("{} experts with {} weights for top-{}", r.e.len(), r.w.len(), h.top_k));
    }
    if r.c.len() != r.cs.len() {
        return Err(format!("{} candidates with {} scores", r.c.len(), r.cs.len()));
    }
    if r.w.iter().chain(&r.cs).any(|w| !w.is_finite()) {
        return Err("a weight or score is not finite".into());
    }
    Ok(())
}
