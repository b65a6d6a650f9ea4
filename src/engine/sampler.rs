//! Choosing the next token from logits: greedy, or sampling with temperature, top-k, top-p,
//! min-p and a repetition penalty, from a seeded generator (same seed, same output).
//!
//! Order, as llama.cpp's default chain: repetition penalty on the raw logits, then top-k,
//! temperature, softmax, top-p, min-p, and a draw. Temperature 0 is greedy (after the penalty).

pub use crate::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off: drop tokens whose probability is below `min_p` times the top one's.
    pub min_p: f32,
    /// 1 = off: divide a positive logit of a recently seen token by this (multiply a negative).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.7,
            top_k: 20,
            top_p: 0.95,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerParams {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("--temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("--top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("--min-p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(format!("--repeat-penalty must be > 0, got {}", self.repeat_penalty));
        }
        Ok(())
    }
}

/// What OpenAI's API adds to the sampler: a bias per token id, and penalties that lower a logit
/// by `presence` once a token has appeared and by `frequency` for each time it has (both over
/// the last `repeat_last_n` tokens, as llama.cpp counts them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Adjustments {
    pub logit_bias: Vec<(u32, f32)>,
    pub presence: f32,
    pub frequency: f32,
}

pub struct Sampler {
    pub params: SamplerParams,
    adjust: Adjustments,
    rng: Rng,
    /// (id, logit) scratch, reused across tokens.
    cand: Vec<(u32, f32)>,
    /// the ids bias and penalties change, and their adjusted logits ([`Sampler::adjust`])
    touched: Vec<(u32, f32)>,
    /// the penalties' window of recent tokens, sorted
    recent: Vec<u32>,
    /// `cand`'s probabilities, scratch as `cand`
    probs: Vec<f64>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Sampler {
        Sampler {
            params,
            adjust: Adjustments::default(),
            rng: Rng::new(params.seed),
            cand: Vec::new(),
            touched: Vec::new(),
            recent: Vec::new(),
            probs: Vec::new(),
        }
    }

    pub fn with_adjustments(mut self, adjust: Adjustments) -> Sampler {
        self.adjust = adjust;
        self
    }

    /// The next token, given the raw logits and the tokens so far (for the penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.adjust(logits, history);
        if self.params.temperature == 0.0 {
            // greedy reads the row in place: a copy of 150k (id, logit) pairs a token cost more
            // than the scan (a server samples several rows a step)
            return argmax(logits, &self.touched);
        }
        let keep = self.distribution(logits);
        let total: f64 = self.probs[..keep].iter().sum();
        self.draw(keep, total, None)
    }

    /// The next token where a draft proposed `draft` (speculative decoding, a draft that is
    /// certain: prompt lookup's, or a draft model's greedy choice): greedy takes the row's own
    /// choice; sampling accepts the draft with the probability `p(draft)` the row gives it
    /// (min(1, p/q) with q = 1), else draws from the row with the draft taken out and the rest
    /// renormalised (the residual max(0, p - q)): either way a token comes out with exactly the
    /// row's probability (Leviathan et al., 2023), whatever the draft.
    pub fn sample_draft(&mut self, logits: &[f32], history: &[u32], draft: u32) -> u32 {
        self.adjust(logits, history);
        if self.params.temperature == 0.0 {
            return argmax(logits, &self.touched);
        }
        let keep = self.distribution(logits);
        let total: f64 = self.probs[..keep].iter().sum();
        let at = self.cand[..keep].iter().position(|c| c.0 == draft);
        let p = at.map_or(0.0, |j| self.probs[j] / total);
        if self.rng.next_f64() < p {
            return draft;
        }
        // what the draft leaves: rejecting it is possible only when p < 1, so `rest` > 0
        let rest = total - at.map_or(0.0, |j| self.probs[j]);
        self.draw(keep, rest, at)
    }

    /// The candidates (`cand`, highest first) and their probabilities (`probs`) after top-k,
    /// temperature and softmax; the number top-p and min-p keep. `adjust` has run.
    fn distribution(&mut self, logits: &[f32]) -> usize {
        let p = self.params;
        self.cand.clear();
        self.cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        for &(id, l) in &self.touched {
            self.cand[id as usize].1 = l;
        }
        // highest first; ties to the lower id, so the order never depends on the sort
        self.cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.truncate(p.top_k);
        }
        let m = self.cand[0].1;
        self.probs.clear();
        self.probs.extend(self.cand.iter().map(|c| (((c.1 - m) / p.temperature) as f64).exp()));
        let sum: f64 = self.probs.iter().sum();
        self.probs.iter_mut().for_each(|x| *x /= sum);
        let mut keep = self.probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, q) in self.probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = self.probs[0] * p.min_p as f64;
            keep = keep.min(self.probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        keep
    }

    /// One draw from the first `keep` candidates, whose probabilities sum to `total` once
    /// candidate `skip` (if any) is left out.
    fn draw(&mut self, keep: usize, total: f64, skip: Option<usize>) -> u32 {
        let mut r = self.rng.next_f64() * total;
        let mut last = keep - 1;
        for (i, &q) in self.probs[..keep].iter().enumerate() {
            if Some(i) == skip {
                continue;
            }
            last = i;
            r -= q;
            if r < 0.0 {
                return self.cand[i].0;
            }
        }
        self.cand[last].0
    }
}

impl Sampler {
    /// Into `touched`: the ids that logit bias and the penalties change (within the row, each
    /// once, by id) and their adjusted logits: the bias, then presence and frequency, then the
    /// repetition penalty, the steps each logit takes in llama.cpp's chain.
    fn adjust(&mut self, logits: &[f32], history: &[u32]) {
        let (a, p) = (&self.adjust, self.params);
        self.touched.clear();
        let window = if p.repeat_last_n > 0 { &history[history.len().saturating_sub(p.repeat_last_n)..] } else { &[] };
        let penalties = a.presence != 0.0 || a.frequency != 0.0;
        let repeat = p.repeat_penalty != 1.0;
        // the window sorted: a token's count is the length of its run
        self.recent.clear();
        if penalties || repeat {
            self.recent.extend_from_slice(window);
            self.recent.sort_unstable();
        }
        let ids = a.logit_bias.iter().map(|&(id, _)| id).chain(self.recent.iter().copied());
        self.touched.extend(ids.filter(|&id| (id as usize) < logits.len()).map(|id| (id, logits[id as usize])));
        self.touched.sort_unstable_by_key(|&(id, _)| id);
        self.touched.dedup_by_key(|&mut (id, _)| id);
        for (id, l) in self.touched.iter_mut() {
            for &(_, b) in a.logit_bias.iter().filter(|(b_id, _)| b_id == id) {
                *l += b;
            }
            let seen = self.recent.partition_point(|r| r <= id) - self.recent.partition_point(|r| r < id);
            if seen == 0 {
                continue;
            }
            if penalties {
                *l -= a.presence + a.frequency * seen as f32;
            }
            if repeat {
                *l = if *l > 0.0 { *l / p.repeat_penalty } else { *l * p.repeat_penalty };
            }
        }
    }
}

/// The first of the highest logits, `touched`'s (sorted by id) replacing the row's own.
fn argmax(logits: &[f32], touched: &[(u32, f32)]) -> u32 {
    let Some(&first) = logits.first() else { return 0 };
    let at0 = touched.first().filter(|t| t.0 == 0).map_or(first, |t| t.1);
    let (mut best, mut best_l) = (0, at0);
    // the row between the touched ids as it is, each touched id's value in its place
    let mut from = 1;
    for &(id, l) in touched.iter().filter(|&&(id, _)| id >= 1).chain(std::iter::once(&(logits.len() as u32, f32::NAN)))
    {
        if let Some((i, x)) = first_max(&logits[from.min(id as usize)..id as usize])
            && x > best_l
        {
            (best, best_l) = (from + i, x);
        }
        if l > best_l {
            (best, best_l) = (id as usize, l);
        }
        from = id as usize + 1;
    }
    best as u32
}

/// The first index of a slice's maximum and the maximum (NaN never wins): the maximum over 16
/// lanes (vector code), then a scan for it.
fn first_max(xs: &[f32]) -> Option<(usize, f32)> {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = xs.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = m.max(x);
        }
    }
    let m = lanes.iter().chain(rest).fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    xs.iter().position(|&x| x == m).map(|i| (i, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplerParams {
        SamplerParams {
            temperature: t,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 7,
        }
    }

    /// Chi-squared of `n` draws' `counts` against probabilities `p` (cells with p = 0 must be
    /// empty).
    fn chi2(counts: &[usize], p: &[f64], n: usize) -> f64 {
        counts
            .iter()
            .zip(p)
            .map(|(&c, &q)| {
                if q == 0.0 {
                    assert_eq!(c, 0, "a token of probability 0 was drawn");
                    0.0
                } else {
                    (c as f64 - n as f64 * q).powi(2) / (n as f64 * q)
                }
            })
            .sum()
    }

    #[test]
    fn a_draft_accepted_or_resampled_leaves_the_rows_distribution() {
        // the target: softmax(l / T) over what top-k keeps, computed here in f64
        let logits = [2.0f32, 1.0, 0.5, 0.0, -1.0, 1.5];
        let t = 0.8;
        for (top_k, drafts) in [(0, [0u32, 3, 4]), (4, [5, 1, 4])] {
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let kept = if top_k == 0 { logits.len() } else { top_k };
            let mut want = vec![0.0f64; logits.len()];
            for &i in &order[..kept] {
                want[i] = ((logits[i] - logits[order[0]]) as f64 / t).exp();
            }
            let z: f64 = want.iter().sum();
            want.iter_mut().for_each(|w| *w /= z);
            for draft in drafts {
                let n = 20_000;
                let mut s = Sampler::new(SamplerParams { top_k, seed: 11 + draft as u64, ..params(t as f32) });
                let mut counts = vec![0usize; logits.len()];
                for _ in 0..n {
                    counts[s.sample_draft(&logits, &[], draft) as usize] += 1;
                }
                // 5 degrees of freedom at most: 20.5 is the 0.1% tail
                let x = chi2(&counts, &want, n);
                assert!(x < 20.5, "top-k {top_k}, draft {draft}: chi2 {x:.1}, counts {counts:?}, want {want:?}");
            }
        }
    }

    #[test]
    fn greedy_takes_the_rows_choice_whatever_the_draft() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample_draft(&[0.1, 2.0, -1.0], &[], 2), 1);
        assert_eq!(s.sample_draft(&[0.1, 2.0, -1.0], &[], 1), 1);
    }

    #[test]
    fn greedy_is_argmax_first_of_ties() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample(&[0.1, 2.0, -1.0, 2.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let mut a = Sampler::new(params(1.0));
        let mut b = Sampler::new(params(1.0));
        let da: Vec<u32> = (0..100).map(|_| a.sample(&logits, &[])).collect();
        let db: Vec<u32> = (0..100).map(|_| b.sample(&logits, &[])).collect();
        assert_eq!(da, db);
        assert!(da.iter().any(|&x| x != da[0]), "sampling at temperature 1 should vary");
    }

    #[test]
    fn draws_follow_the_softmax() {
        // brute force: frequencies of 40k draws against exp(l) / sum
        let logits = [0.0f32, 1.0, 2.0, -1.0];
        let mut s = Sampler::new(params(1.0));
        let mut n = [0usize; 4];
        for _ in 0..40_000 {
            n[s.sample(&logits, &[]) as usize] += 1;
        }
        let z: f64 = logits.iter().map(|l| (*l as f64).exp()).sum();
        for i in 0..4 {
            let p = (logits[i] as f64).exp() / z;
            let f = n[i] as f64 / 40_000.0;
            assert!((f - p).abs() < 0.01, "token {i}: {f} vs {p}");
        }
    }

    #[test]
    fn filters_cut_what_they_should() {
        let logits = [3.0f32, 2.9, 0.0, -5.0];
        // top-k 1 is greedy
        let mut s = Sampler::new(SamplerParams { top_k: 1, ..params(5.0) });
        assert!((0..200).all(|_| s.sample(&logits, &[]) == 0));
        // top-p: p(0) ~ 0.50, p(1) ~ 0.46: 0.9 keeps both, never 2 or 3
        let mut s = Sampler::new(SamplerParams { top_p: 0.9, ..params(1.0) });
        assert!((0..2000).all(|_| s.sample(&logits, &[]) < 2));
        // min-p 0.5: token 2 has p/p0 = e^-3 < 0.5
        let mut s = Sampler::new(SamplerParams { min_p: 0.5, ..params(1.0) });
        assert!((0..2000).all(|_| s.sample(&logits, &[]) < 2));
    }

    #[test]
    fn repetition_penalty_moves_greedy_choice() {
        let mut s = Sampler::new(SamplerParams { repeat_penalty: 2.0, ..params(0.0) });
        // 2.0 / 2 = 1.0 < 1.5
        assert_eq!(s.sample(&[2.0, 1.5], &[0]), 1);
        // a negative logit is pushed further down
        assert_eq!(s.sample(&[-1.0, -1.5], &[0]), 1);
    }

    #[test]
    fn bias_and_penalties_move_greedy_choice() {
        let adj = |logit_bias, presence, frequency| Adjustments { logit_bias, presence, frequency };
        // +1 on token 1 beats token 0 by 0.5
        let mut s = Sampler::new(params(0.0)).with_adjustments(adj(vec![(1, 1.0), (99, 5.0)], 0.0, 0.0));
        assert_eq!(s.sample(&[2.0, 1.5], &[]), 1);
        // presence 0.4 once: 2.0 - 0.4 = 1.6 > 1.5; frequency 0.2 twice on top: 1.2 < 1.5
        let mut s = Sampler::new(params(0.0)).with_adjustments(adj(vec![], 0.4, 0.0));
        assert_eq!(s.sample(&[2.0, 1.5], &[0, 0]), 0);
        let mut s = Sampler::new(params(0.0)).with_adjustments(adj(vec![], 0.4, 0.2));
        assert_eq!(s.sample(&[2.0, 1.5], &[0, 0]), 1);
        // only the last repeat_last_n tokens count
        let mut s =
            Sampler::new(SamplerParams { repeat_last_n: 1, ..params(0.0) }).with_adjustments(adj(vec![], 0.4, 0.2));
        assert_eq!(s.sample(&[2.0, 1.5], &[0, 1]), 0);
    }

    /// The whole row adjusted one logit at a time, llama.cpp's chain written out (the oracle).
    fn adjusted_row(logits: &[f32], history: &[u32], p: &SamplerParams, a: &Adjustments) -> Vec<f32> {
        let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
        let window = if p.repeat_last_n == 0 { &[][..] } else { window };
        let mut row = logits.to_vec();
        for &(id, b) in &a.logit_bias {
            if let Some(l) = row.get_mut(id as usize) {
                *l += b;
            }
        }
        for (id, l) in row.iter_mut().enumerate() {
            let n = window.iter().filter(|&&t| t as usize == id).count();
            if n > 0 && (a.presence != 0.0 || a.frequency != 0.0) {
                *l -= a.presence + a.frequency * n as f32;
            }
            if n > 0 && p.repeat_penalty != 1.0 {
                *l = if *l > 0.0 { *l / p.repeat_penalty } else { *l * p.repeat_penalty };
            }
        }
        row
    }

    #[test]
    fn greedy_is_the_first_highest_of_the_adjusted_row() {
        let mut rng = Rng::new(11);
        let mut pick = |n: usize| (rng.next_f64() * n as f64) as usize;
        for case in 0..400 {
            let vocab = 1 + pick(60);
            // few distinct values: ties everywhere, and a bias or penalty often makes one; now and then
            // a NaN (never chosen past the first id) or an infinity
            let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
            let logits: Vec<f32> =
                (0..vocab).map(|_| if pick(40) == 0 { special[pick(3)] } else { pick(5) as f32 * 0.5 - 1.0 }).collect();
            let history: Vec<u32> = (0..pick(20)).map(|_| pick(vocab + 3) as u32).collect();
            let bias: Vec<(u32, f32)> =
                (0..pick(4)).map(|_| (pick(vocab + 2) as u32, pick(5) as f32 * 0.5 - 1.0)).collect();
            let a = Adjustments { logit_bias: bias, presence: pick(3) as f32 * 0.5, frequency: pick(3) as f32 * 0.25 };
            let p = SamplerParams { repeat_penalty: [1.0, 2.0][case % 2], repeat_last_n: pick(12), ..params(0.0) };
            let row = adjusted_row(&logits, &history, &p, &a);
            let want = (1..vocab).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32;
            let mut s = Sampler::new(p).with_adjustments(a.clone());
            assert_eq!(s.sample(&logits, &history), want, "case {case}: {row:?}");
            // the sampling path's row: top-k 1 at a temperature takes its first highest too (its
            // sort puts a NaN first: rows without one)
            if row.iter().any(|l| l.is_nan()) {
                continue;
            }
            let mut s = Sampler::new(SamplerParams { temperature: 1.0, top_k: 1, ..p }).with_adjustments(a);
            assert_eq!(s.sample(&logits, &history), want, "case {case}, top-k 1");
        }
    }
}
