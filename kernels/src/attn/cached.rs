//! A KV cache's keys or values in whichever element type it keeps them ([`Cached`]), and the
//! folds over them: one match on the types, then the generic fold for that pair.

use std::ops::Range;

use super::{Bf16, F16, KvElem, Scoring, State, Values};
use crate::Isa;

/// Keys (transposed blocks) or values (rows) as a cache keeps them.
#[derive(Debug, Clone, Copy)]
pub enum Cached<'a> {
    F32(&'a [f32]),
    Bf16(&'a [Bf16]),
    F16(&'a [F16]),
}

impl Cached<'_> {
    pub fn len(&self) -> usize {
        match self {
            Cached::F32(x) => x.len(),
            Cached::Bf16(x) => x.len(),
            Cached::F16(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `range` widened to f32 into `out` (cleared first).
    pub fn widen_into(&self, range: Range<usize>, out: &mut Vec<f32>) {
        out.clear();
        match self {
            Cached::F32(x) => out.extend_from_slice(&x[range]),
            Cached::Bf16(x) => out.extend(x[range].iter().map(|e| e.to_f32())),
            Cached::F16(x) => out.extend(x[range].iter().map(|e| e.to_f32())),
        }
    }
}

/// `f` called with the keys and values as their element types (values `None`: the keys'
/// prefix, [`Values::KeyPrefix`]).
macro_rules! with_types {
    ($keys:expr, $vals:expr, |$k:ident, $v:ident| $body:expr) => {
        match $keys {
            Cached::F32($k) => with_types!(@v $vals, $k, $v, $body),
            Cached::Bf16($k) => with_types!(@v $vals, $k, $v, $body),
            Cached::F16($k) => with_types!(@v $vals, $k, $v, $body),
        }
    };
    (@v $vals:expr, $k:ident, $v:ident, $body:expr) => {
        match $vals {
            None => {
                let $v: Values<'_, f32> = Values::KeyPrefix;
                $body
            }
            Some(Cached::F32(x)) => {
                let $v = Values::Rows(x);
                $body
            }
            Some(Cached::Bf16(x)) => {
                let $v = Values::Rows(x);
                $body
            }
            Some(Cached::F16(x)) => {
                let $v = Values::Rows(x);
                $body
            }
        }
    };
}

/// [`super::fold_keyed`] over a cache's keys and values (`vals` `None`: the keys' prefix).
#[allow(clippy::too_many_arguments)]
pub fn fold_cached(
    isa: Isa,
    (q, hk): (&[f32], usize),
    ends: &[usize],
    keys: Cached<'_>,
    vals: Option<Cached<'_>>,
    range: Range<usize>,
    sc: Scoring,
    st: &mut State,
) {
    with_types!(keys, vals, |k, v| super::fold_keyed(isa, (q, hk), ends, k, v, range, sc, st))
}

/// [`super::attend_keyed`] over a cache's keys and values (`vals` `None`: the keys' prefix).
#[allow(clippy::too_many_arguments)]
pub fn attend_cached(
    isa: Isa,
    (q, hk): (&[f32], usize),
    ends: &[usize],
    keys: Cached<'_>,
    vals: Option<Cached<'_>>,
    sc: Scoring,
    sinks: &[f32],
    states: (&mut State, &mut State),
    out: &mut [f32],
) {
    with_types!(keys, vals, |k, v| super::attend_keyed(isa, (q, hk), ends, k, v, sc, sinks, states, out))
}
