//! A tokenizer.json from tiktoken's BPE ranks, as transformers' `TikTokenConverter` makes it
//! (gpt-oss's o200k_harmony is o200k_base's ranks plus special tokens): each rank's bytes a
//! token of that id; as merges, every split of a token into two tokens, ordered by the token's
//! rank, then the left part's, then the right's; `ignore_merges`, since tiktoken takes a piece
//! that is a token whole.
//!
//! Rank files here are compact (`ranks.bin`, tests/reference/make_harmony_tokenizer.py): per
//! rank in order, one byte of length, then the token's bytes.

use std::collections::HashMap;

use super::byte_level_bpe::{Parts, byte_chars, to_chars, tokenizer_json};

/// The tokens of a `ranks.bin` (index = rank).
pub fn parse_ranks(bin: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bin.len() {
        let n = bin[at] as usize;
        let tok = bin.get(at + 1..at + 1 + n).filter(|t| !t.is_empty());
        let tok =
            tok.ok_or_else(|| format!("ranks: token {} at offset {at} is empty or runs past the end", out.len()))?;
        out.push(tok);
        at += 1 + n;
    }
    Ok(out)
}

/// The tokenizer.json of `ranks` (index = id), the `specials` (content, id) matched before the
/// split, and the split regex. The specials' ids must follow the ranks' without a gap, in
/// order: the tokenizers library numbers added tokens as it reads them.
pub fn tokenizer_from_ranks(
    ranks: &[&[u8]],
    specials: &[(String, u32)],
    split: &'static str,
) -> Result<String, String> {
    if specials.iter().enumerate().any(|(i, (_, id))| *id as usize != ranks.len() + i) {
        return Err(format!("special tokens must take ids {}.. in order", ranks.len()));
    }
    let rank: HashMap<&[u8], usize> = ranks.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    if rank.len() != ranks.len() {
        return Err("ranks: a token appears twice".into());
    }
    let chars = byte_chars();
    let mut vocab = serde_json::Map::with_capacity(ranks.len());
    let mut merges = Vec::new();
    let mut local: Vec<(usize, usize)> = Vec::new();
    for (id, tok) in ranks.iter().enumerate() {
        vocab.insert(to_chars(&chars, tok), id.into());
        local.clear();
        for i in 1..tok.len() {
            if let (Some(&l), Some(&r)) = (rank.get(&tok[..i]), rank.get(&tok[i..])) {
                local.push((l, r));
            }
        }
        local.sort_unstable();
        merges.extend(
            local.iter().map(|&(l, r)| serde_json::json!([to_chars(&chars, ranks[l]), to_chars(&chars, ranks[r])])),
        );
    }
    let added = specials.iter().map(|(c, id)| (*id, c.clone(), true)).collect();
    Ok(tokenizer_json(Parts { vocab, merges, added, split, nfc: false, ignore_merges: true }))
}

/// o200k_harmony's special tokens (tiktoken's `o200k_harmony`): `<|startoftext|>` 199998,
/// `<|endoftext|>` 199999, the harmony markers between 200002 and 200012, and a
/// `<|reserved_N|>` for every other id up to 201087. (tiktoken's table also keeps o200k_base's
/// `<|endofprompt|>` as a second name of 200018; a tokenizer.json gives each id one name, and
/// the tokenizers library numbers added tokens in order, so they are listed by id, one each.)
pub fn harmony_specials() -> Vec<(String, u32)> {
    let named: [(u32, &str); 9] = [
        (199_998, "<|startoftext|>"),
        (199_999, "<|endoftext|>"),
        (200_002, "<|return|>"),
        (200_003, "<|constrain|>"),
        (200_005, "<|channel|>"),
        (200_006, "<|start|>"),
        (200_007, "<|end|>"),
        (200_008, "<|message|>"),
        (200_012, "<|call|>"),
    ];
    (199_998..=201_087)
        .map(|id| match named.iter().find(|(n, _)| *n == id) {
            Some((_, name)) => (name.to_string(), id),
            None => (format!("<|reserved_{id}|>"), id),
        })
        .collect()
}
