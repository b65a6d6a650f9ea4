//! How a step's sequences share the routed experts: each pass's distinct (layer, expert) pairs,
//! each read once for every token that chose it, against the tokens' choices (tokens x top-k a
//! layer). B sequences decoding together read fewer experts than B alone when they choose the
//! same ones; `/metrics` and the trace show the ratio.

use crate::model::Observer;

#[derive(Debug, Default)]
pub struct ExpertReads {
    /// Bit (layer, expert) of the pass so far, grown as layers and experts appear.
    seen: Vec<u64>,
    experts: usize,
    /// This pass's distinct experts and choices.
    pub distinct: u64,
    pub choices: u64,
}

impl ExpertReads {
    /// `experts` routed experts a layer.
    pub fn new(experts: usize) -> ExpertReads {
        ExpertReads { experts: experts.max(1), ..ExpertReads::default() }
    }
}

impl Observer for ExpertReads {
    fn begin_pass(&mut self) {
        self.seen.fill(0);
        (self.distinct, self.choices) = (0, 0);
    }

    fn routing(&mut self, layer: usize, _pos: usize, experts: &[usize], _weights: &[f32], _probs: &[f32]) {
        for &e in experts {
            let bit = layer * self.experts + e.min(self.experts - 1);
            if self.seen.len() <= bit / 64 {
                self.seen.resize(bit / 64 + 1, 0);
            }
            let (w, m) = (&mut self.seen[bit / 64], 1u64 << (bit % 64));
            if *w & m == 0 {
                *w |= m;
                self.distinct += 1;
            }
            self.choices += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_layers_distinct_experts_once_a_pass() {
        let mut r = ExpertReads::new(128);
        r.begin_pass();
        // two tokens on layer 0 sharing expert 5; layer 3 one token
        r.routing(0, 0, &[5, 7], &[], &[]);
        r.routing(0, 1, &[5, 100], &[], &[]);
        r.routing(3, 0, &[5, 127], &[], &[]);
        assert_eq!((r.distinct, r.choices), (5, 6));
        r.begin_pass();
        r.routing(0, 0, &[5], &[], &[]);
        assert_eq!((r.distinct, r.choices), (1, 1));
    }
}
