//! Which experts a MoE layer routes given the route of the layer two before it, learnt online
//! from the routes seen: the guess two layers ahead when the routes come from a trace (which
//! gives candidates for the next layer only) and no hidden state is there to apply a router to.
//!
//! Offline on the trained routing traces (traces/routing-*.jsonl.gz, decode tokens), a table
//! learnt on the tuning trace recalled 0.37 of the held-out trace's routes two layers ahead,
//! against 0.80 for the next layer's router one layer ahead: weak, so its reads are left to the
//! read rule (a guess that is rarely right is read only where the disk idles anyway).

/// Co-occurrence counts of (expert at layer l, expert at layer l + 2) in one token, per l.
/// Layers wrap: the layer two before layer 0 is the next-to-last layer of the previous token.
#[derive(Debug, Clone)]
pub struct CoActivation {
    n_layers: usize,
    num_experts: usize,
    /// `[l][e][e2]`: tokens in which layer l routed e and layer l + 2 routed e2.
    pairs: Vec<f32>,
    /// `[l][e]`: tokens in which layer l routed e and layer l + 2 was then seen.
    seen: Vec<f32>,
    /// Per layer: its last route and the pass it was in.
    last: Vec<Option<(u64, Vec<usize>)>>,
}

impl CoActivation {
    /// None for fewer than 3 layers (two ahead would be the same layer or the one before).
    pub fn new(n_layers: usize, num_experts: usize) -> Option<CoActivation> {
        (n_layers >= 3).then(|| CoActivation {
            n_layers,
            num_experts,
            pairs: vec![0.0; n_layers * num_experts * num_experts],
            seen: vec![0.0; n_layers * num_experts],
            last: vec![None; n_layers],
        })
    }

    /// The layer two before `li` in pass `pass`, and its pass.
    fn two_before(&self, pass: u64, li: usize) -> Option<(u64, usize)> {
        if li >= 2 { Some((pass, li - 2)) } else { pass.checked_sub(1).map(|p| (p, li + self.n_layers - 2)) }
    }

    /// Layer `li` routed `route` in pass `pass`: count it against the route two layers before
    /// (when that was seen in the pass before it), and remember it.
    pub fn observe(&mut self, pass: u64, li: usize, route: &[usize]) {
        let (ne, nl) = (self.num_experts, self.n_layers);
        if li >= nl || route.iter().any(|&e| e >= ne) {
            return;
        }
        if let Some((sp, sl)) = self.two_before(pass, li)
            && let Some((p, src)) = &self.last[sl]
            && *p == sp
        {
            for &e in src {
                self.seen[sl * ne + e] += 1.0;
                let row = &mut self.pairs[(sl * ne + e) * ne..(sl * ne + e + 1) * ne];
                for &e2 in route {
                    row[e2] += 1.0;
                }
            }
        }
        self.last[li] = Some((pass, route.to_vec()));
    }

    /// The `n` experts most likely at the layer two after `li`, given `li`'s route in `pass`:
    /// by the summed chance P(e2 | e) over the route's experts e, ties to the lower id. Empty
    /// until that route and some of its experts' followers have been seen.
    pub fn predict(&self, pass: u64, li: usize, n: usize) -> Vec<usize> {
        let ne = self.num_experts;
        let Some(Some((p, route))) = self.last.get(li) else { return Vec::new() };
        if *p != pass {
            return Vec::new();
        }
        let mut score = vec![0f32; ne];
        let mut any = false;
        for &e in route {
            let seen = self.seen[li * ne + e];
            if seen > 0.0 {
                any = true;
                let row = &self.pairs[(li * ne + e) * ne..(li * ne + e + 1) * ne];
                for (s, &c) in score.iter_mut().zip(row) {
                    *s += c / seen;
                }
            }
        }
        if !any {
            return Vec::new();
        }
        let mut order: Vec<usize> = (0..ne).filter(|&e| score[e] > 0.0).collect();
        order.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
        order.truncate(n);
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_which_experts_follow_two_layers_later_across_tokens() {
        // 4 layers of 8 experts: layer l + 2 routes (route of l) + 1, wrapping into the next
        // token for layers 2 and 3
        let mut c = CoActivation::new(4, 8).expect("4 layers");
        let route = |t: u64, l: usize| -> Vec<usize> {
            let base = ((t as usize) * 3 + l) % 8;
            vec![base, (base + 4) % 8]
        };
        // a brute-force oracle: layer l's route determines layer l + 2's exactly
        for t in 1..=40u64 {
            for l in 0..4 {
                c.observe(t, l, &route(t, l));
            }
        }
        for l in 0..4 {
            let (t2, l2) = if l + 2 < 4 { (40, l + 2) } else { (41, l + 2 - 4) };
            let mut want = route(t2, l2);
            want.sort();
            let mut got = c.predict(40, l, 2);
            got.sort();
            assert_eq!(got, want, "layer {l}");
        }
        // a route it has not seen in this pass predicts nothing
        assert!(c.predict(39, 0, 2).is_empty());
        assert!(CoActivation::new(2, 8).is_none());
    }
}
