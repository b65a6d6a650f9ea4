//! What a forward pass reports as it goes, to whoever watches: routing for the heatmap, the
//! routing log and the tests; hidden states for debugging.

/// Every method has a no-op default.
pub trait Observer {
    /// A forward pass begins (a prompt chunk or one decode token).
    fn begin_pass(&mut self) {}
    /// Token `t` of the batch (position `pos`) in MoE layer `layer` picked `experts` (rank
    /// order) with routing `weights`; `probs` is the softmax over all experts.
    fn routing(&mut self, _layer: usize, _pos: usize, _experts: &[usize], _weights: &[f32], _probs: &[f32]) {}
    /// Hidden states `[T, H]` after stage `i` (0 = embeddings, l + 1 = after layer l,
    /// L + 1 = after the final norm).
    fn hidden(&mut self, _i: usize, _x: &[f32]) {}
}

/// Watches nothing.
pub struct NoObserver;
impl Observer for NoObserver {}

/// Two observers as one: each sees every call, the first before the second.
pub struct Tee<A, B>(pub A, pub B);

impl<A: Observer, B: Observer> Observer for Tee<A, B> {
    fn begin_pass(&mut self) {
        self.0.begin_pass();
        self.1.begin_pass();
    }

    fn routing(&mut self, layer: usize, pos: usize, experts: &[usize], weights: &[f32], probs: &[f32]) {
        self.0.routing(layer, pos, experts, weights, probs);
        self.1.routing(layer, pos, experts, weights, probs);
    }

    fn hidden(&mut self, i: usize, x: &[f32]) {
        self.0.hidden(i, x);
        self.1.hidden(i, x);
    }
}

impl<O: Observer + ?Sized> Observer for &mut O {
    fn begin_pass(&mut self) {
        (**self).begin_pass();
    }

    fn routing(&mut self, layer: usize, pos: usize, experts: &[usize], weights: &[f32], probs: &[f32]) {
        (**self).routing(layer, pos, experts, weights, probs);
    }

    fn hidden(&mut self, i: usize, x: &[f32]) {
        (**self).hidden(i, x);
    }
}

impl<O: Observer> Observer for Option<O> {
    fn begin_pass(&mut self) {
        if let Some(o) = self {
            o.begin_pass();
        }
    }

    fn routing(&mut self, layer: usize, pos: usize, experts: &[usize], weights: &[f32], probs: &[f32]) {
        if let Some(o) = self {
            o.routing(layer, pos, experts, weights, probs);
        }
    }

    fn hidden(&mut self, i: usize, x: &[f32]) {
        if let Some(o) = self {
            o.hidden(i, x);
        }
    }
}
