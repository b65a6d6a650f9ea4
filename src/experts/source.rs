//! Streamed experts as the MoE block's [`ExpertSource`]: the pool's protocol (pass numbers,
//! the predictor's hooks, pins and their release, trace flows) lives here and nowhere in the
//! model.

use super::Experts;
use crate::model::{ExpertQuery, ExpertSource, ModelError, ReadyFn};
use crate::package::ExpertMats;
use crate::trace;

impl ExpertSource for Experts {
    fn begin_pass(&self) {
        self.cache.begin_pass();
    }

    fn resident(&self, moe_layer: usize, candidates: &[usize]) -> Vec<bool> {
        self.cache.resident_among(moe_layer, candidates)
    }

    /// The experts already resident first, the rest as their reads land. One token's pass
    /// first scores the prediction made for this layer and predicts the next layer from its
    /// guess at that layer's router input, so its reads overlap this layer's compute.
    fn for_each_ready(&self, q: &ExpertQuery<'_>, each: &mut ReadyFn<'_>) -> Result<(), ModelError> {
        let pass = self.cache.pass();
        if q.tokens == 1 {
            self.predictor.observe(pass, q.moe_layer, q.ahead.ranked);
            let mut x = Vec::with_capacity(q.ahead.input.norm.len());
            q.ahead.input.lookahead(0, &mut x);
            self.predictor.submit(pass, q.moe_layer, x, q.ahead.predicted);
        }
        let mut req = self.cache.request(q.moe_layer, q.used);
        loop {
            let batch = req.ready_batch()?;
            if batch.is_empty() {
                return Ok(());
            }
            for b in &batch {
                trace::flow_end(b.flow);
            }
            let ids: Vec<usize> = batch.iter().map(|b| b.expert).collect();
            let res = batch
                .iter()
                .map(|b| self.pkg.expert_view(q.moe_layer, b.bytes()))
                .collect::<Result<Vec<ExpertMats<'_>>, _>>()
                .map_err(ModelError::from)
                .and_then(|mats| each(&ids, &mats));
            // the batch is given back whatever happened, so no pin outlives the layer
            for b in batch {
                req.release(b);
            }
            res?;
        }
    }
}
