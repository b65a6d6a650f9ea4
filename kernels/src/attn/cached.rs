//! A KV cache's keys or values in whichever element type it keeps them ([`Cached`]), and the
//! folds over them: one match on the types, then the generic fold for that pair.

use std::ops::Range;

use super::{Bf16, F16, KvElem, KvRead, Q8Keys, Q8Rows, Scoring, State, Values};
use crate::Isa;

/// Keys (transposed blocks) or values (rows) as a cache keeps them.
#[derive(Debug, Clone, Copy)]
pub enum Cached<'a> {
    F32(&'a [f32]),
    Bf16(&'a [Bf16]),
    F16(&'a [F16]),
    /// q8_0 keys (their scales laid out for transposed blocks)
    Q8Keys(Q8Keys<'a>),
    /// q8_0 values (a scale per 32 values of a row)
    Q8Rows(Q8Rows<'a>),
}

impl Cached<'_> {
    pub fn len(&self) -> usize {
        match self {
            Cached::F32(x) => x.len(),
            Cached::Bf16(x) => x.len(),
            Cached::F16(x) => x.len(),
            Cached::Q8Keys(x) => x.len(),
            Cached::Q8Rows(x) => x.len(),
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
            Cached::Q8Keys(x) => out.extend(range.map(|i| x.get(i))),
            Cached::Q8Rows(x) => out.extend(range.map(|i| x.get(i))),
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
            Cached::Q8Keys($k) => with_types!(@v $vals, $k, $v, $body),
            Cached::Q8Rows(_) => unreachable!("q8_0 values given as keys"),
        }
    };
    (@v $vals:expr, $k:ident, $v:ident, $body:expr) => {
        match $vals {
            None => {
                let $v: Values<&[f32]> = Values::KeyPrefix;
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
            Some(Cached::Q8Rows(x)) => {
                let $v = Values::Rows(x);
                $body
            }
            Some(Cached::Q8Keys(_)) => unreachable!("q8_0 keys given as values"),
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
