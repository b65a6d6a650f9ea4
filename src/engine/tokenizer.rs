//! The model's tokenizer (HuggingFace `tokenizers`, from the tokenizer.json embedded in the
//! package) and streaming detokenization that never splits a UTF-8 character.

use std::str::FromStr;

use crate::contained::contained;
use tokenizers::Tokenizer;

pub struct Tok {
    inner: Tokenizer,
}

impl Tok {
    /// Load a tokenizer.json; padding and truncation are switched off (an LLM prompt is
    /// neither padded nor cut).
    pub fn from_json(json: &str) -> Result<Tok, String> {
        // the tokenizers crate panics on some malformed files rather than returning an error
        contained("the tokenizers library failed", || {
            let mut inner = Tokenizer::from_str(json).map_err(|e| e.to_string())?;
            inner.with_padding(None);
            inner.with_truncation(None).map_err(|e| e.to_string())?;
            Ok(Tok { inner })
        })
    }

    /// Token ids of `text`, special tokens in the text recognized, the tokenizer's own
    /// post-processing applied (as `tokenizer(text)` does in Python).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        contained("the tokenizers library failed", || {
            Ok(self.inner.encode(text, true).map_err(|e| e.to_string())?.get_ids().to_vec())
        })
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, String> {
        contained("the tokenizers library failed", || self.inner.decode(ids, skip_special).map_err(|e| e.to_string()))
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The ids it can give: its largest id + 1 (two names may share an id, as o200k_harmony's
    /// `<|endofprompt|>` and `<|reserved_200018|>` do, so this is not a count of names).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1)
    }
}

/// Turns a stream of token ids into text pieces. A piece is released only when the text decoded
/// so far does not end in an incomplete UTF-8 sequence (shown by the decoder as U+FFFD), so a
/// character split over several byte-level tokens is printed whole, once.
pub struct StreamDecoder<'a> {
    tok: &'a Tok,
    ids: Vec<u32>,
    /// Start of the window decoded each time (keeps the cost per token bounded).
    prev: usize,
    /// Tokens of the window already released as text.
    cur: usize,
    skip_special: bool,
    /// Special tokens shown although `skip_special` (a tool call's markers).
    kept: Vec<u32>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tok, skip_special: bool) -> StreamDecoder<'a> {
        StreamDecoder { tok, ids: Vec::new(), prev: 0, cur: 0, skip_special, kept: Vec::new() }
    }

    /// Special tokens skipped except `kept`.
    pub fn keeping(tok: &'a Tok, kept: Vec<u32>) -> StreamDecoder<'a> {
        StreamDecoder { kept, ..StreamDecoder::new(tok, true) }
    }

    /// The text of `ids`: the runs between kept tokens decoded as the tokenizer does, each kept
    /// token as its own text (byte-level decoders join runs that way too).
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        if !self.skip_special || self.kept.is_empty() {
            return self.tok.decode(ids, self.skip_special);
        }
        let mut out = String::new();
        for run in ids.split_inclusive(|i| self.kept.contains(i)) {
            match run.split_last() {
                Some((last, rest)) if self.kept.contains(last) => {
                    out.push_str(&self.tok.decode(rest, true)?);
                    out.push_str(&self.tok.decode(&[*last], false)?);
                }
                _ => out.push_str(&self.tok.decode(run, true)?),
            }
        }
        Ok(out)
    }

    /// Add one token; returns the new text, if any can be shown yet.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, String> {
        self.ids.push(id);
        let before = self.decode(&self.ids[self.prev..self.cur])?;
        let now = self.decode(&self.ids[self.prev..])?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.is_char_boundary(before.len()) {
            let piece = now[before.len()..].to_string();
            self.prev = self.cur;
            self.cur = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }

    /// Whatever is still held back (an incomplete character at the very end is shown as
    /// U+FFFD, as a full decode would).
    pub fn flush(&mut self) -> Result<Option<String>, String> {
        let before = self.decode(&self.ids[self.prev..self.cur])?;
        let now = self.decode(&self.ids[self.prev..])?;
        self.prev = self.ids.len();
        self.cur = self.ids.len();
        if now.len() > before.len() && now.is_char_boundary(before.len()) {
            Ok(Some(now[before.len()..].to_string()))
        } else {
            Ok(None)
        }
    }
}
