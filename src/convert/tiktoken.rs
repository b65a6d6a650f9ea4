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

/// The tokens of a tiktoken model file (`tiktoken.model`, what tiktoken's `load_tiktoken_bpe`
/// reads; Kimi-K2 ships one): a line per token, `BASE64 RANK`, ranks 0, 1, .. in order.
pub fn parse_tiktoken_model(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |what: &str| format!("line {}: {what}", i + 1);
        let (b64, rank) = line.split_once(' ').ok_or_else(|| bad("expected `BASE64 RANK`"))?;
        if rank.trim().parse::<usize>().ok() != Some(out.len()) {
            return Err(bad(&format!("rank {rank:?} where {} was due (ranks in order from 0)", out.len())));
        }
        let tok = base64_decode(b64).ok_or_else(|| bad("the token is not base64"))?;
        if tok.is_empty() {
            return Err(bad("empty token"));
        }
        out.push(tok);
    }
    Ok(out)
}

/// `ranks` (index = rank) as a tiktoken model file, [`parse_tiktoken_model`]'s input: what the
/// tests and the fuzz seeds write for a Kimi-style checkpoint.
pub fn tiktoken_model_text(ranks: &[&[u8]]) -> String {
    ranks.iter().enumerate().map(|(i, t)| format!("{} {i}\n", base64_encode(t))).collect()
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with `=` padding.
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let v = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() { BASE64[(v >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// Standard base64 (RFC 4648 alphabet, `=` padding optional); `None` on any other character.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let body = s.trim_end_matches('=').as_bytes();
    if body.len() % 4 == 1 || s.len() - body.len() > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = acc << 6 | digit(c)?;
        }
        // a chunk of k characters carries k - 1 whole bytes, left-aligned in its 6k bits
        let bits = 6 * chunk.len();
        for b in 0..chunk.len() - 1 {
            out.push((acc >> (bits - 8 * (b + 1))) as u8);
        }
    }
    Some(out)
}

/// Kimi's special tokens (its `tokenization_kimi.py`): 256 ids from the ranks' end (further,
/// when tokenizer_config.json's `added_tokens_decoder` names a later id), each named there or
/// `<|reserved_token_ID|>`.
pub fn kimi_specials(n_ranks: u32, named: &std::collections::BTreeMap<u32, String>) -> Vec<(String, u32)> {
    let end = named.keys().next_back().map_or(0, |&id| id + 1).max(n_ranks + 256);
    (n_ranks..end)
        .map(|id| (named.get(&id).cloned().unwrap_or_else(|| format!("<|reserved_token_{id}|>")), id))
        .collect()
}

/// The tokenizer.json of `ranks`/// The tokenizer.json of `ranks` (index = id), the `specials` (content, id) matched before the
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648s() {
        // RFC 4648 section 10's test vectors
        for (plain, enc) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE=")]
        {
            assert_eq!(base64_decode(enc).as_deref(), Some(plain.as_bytes()), "{enc}");
        }
        assert_eq!(base64_decode("Zm9vYmFy").as_deref(), Some(&b"foobar"[..]));
        for (plain, enc) in [("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("fooba", "Zm9vYmE=")] {
            assert_eq!(base64_encode(plain.as_bytes()), enc);
        }
        assert_eq!(base64_decode("/+8="), Some(vec![0xff, 0xef]));
        for bad in ["Z", "Zm9v!", "Zg===", "Zm 9"] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn tiktoken_model_lines_are_ranks_in_order() {
        assert_eq!(
            parse_tiktoken_model("IQ== 0\nIg== 1\n\naGk= 2\n").unwrap(),
            vec![b"!".to_vec(), b"\"".to_vec(), b"hi".to_vec()]
        );
        assert!(parse_tiktoken_model("IQ== 0\nIg== 2\n").unwrap_err().contains("line 2"));
        assert!(parse_tiktoken_model("IQ==0\n").unwrap_err().contains("line 1"));
        assert!(parse_tiktoken_model("I*== 0\n").unwrap_err().contains("base64"));
        let ranks: Vec<Vec<u8>> =
            (0..=255u8).map(|b| vec![b, b.wrapping_mul(7), 255 - b][..1 + b as usize % 3].to_vec()).collect();
        let refs: Vec<&[u8]> = ranks.iter().map(Vec::as_slice).collect();
        assert_eq!(parse_tiktoken_model(&tiktoken_model_text(&refs)).unwrap(), ranks);
    }

    #[test]
    fn kimi_specials_fill_reserved_names() {
        let named = [(10, "[BOS]".to_string()), (12, "<|im_end|>".to_string())].into_iter().collect();
        let s = kimi_specials(10, &named);
        assert_eq!(s.len(), 256);
        assert_eq!(s[0], ("[BOS]".to_string(), 10));
        assert_eq!(s[1], ("<|reserved_token_11|>".to_string(), 11));
        assert_eq!(s[2], ("<|im_end|>".to_string(), 12));
        let late = [(300, "[PAD]".to_string())].into_iter().collect();
        assert_eq!(kimi_specials(10, &late).last(), Some(&("[PAD]".to_string(), 300)));
    }
}
