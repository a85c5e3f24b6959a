//! `POST /v1/embeddings` (OpenAI protocol): deterministic vectors, so hybrid-search tests can
//! say which texts are close.
//!
//! A text's vector is a hashed bag of its words: each word (a run of letters and digits,
//! lowercased) that is not a stop word is replaced by the first word of its synonym group,
//! if it is in one, hashed (FNV-1a) to one of `dims` dimensions and counted there; the
//! vector is then scaled to length 1. Texts sharing words (or synonyms of them) point the
//! same way; texts sharing none are orthogonal (cosine 0), barring a hash collision.

use serde_json::{Value, json};

use super::Fault;

/// Words too common to say anything about a text; they are left out of its vector.
pub const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "do", "does", "for", "from", "has", "have",
    "in", "is", "it", "its", "my", "of", "on", "or", "our", "so", "that", "the", "their", "this",
    "to", "was", "we", "what", "when", "where", "which", "who", "with", "you", "your",
];

/// How the server answers `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsScript {
    /// The vectors' length (default 64).
    pub dims: usize,
    /// Groups of words that count as the same word (e.g. `["car", "automobile"]`).
    pub synonyms: Vec<Vec<String>>,
    /// Every embeddings request fails so while set (the chat turns are untouched).
    pub fault: Option<Fault>,
}

impl Default for EmbeddingsScript {
    fn default() -> Self {
        Self {
            dims: 64,
            synonyms: Vec::new(),
            fault: None,
        }
    }
}

impl EmbeddingsScript {
    /// Adds a group of words that count as one.
    pub fn synonyms<S: Into<String>>(mut self, words: impl IntoIterator<Item = S>) -> Self {
        self.synonyms
            .push(words.into_iter().map(|w| w.into().to_lowercase()).collect());
        self
    }

    /// The word `w` (lowercase) stands for: its group's first word, else itself.
    fn canonical<'a>(&'a self, w: &'a str) -> &'a str {
        self.synonyms
            .iter()
            .find(|g| g.iter().any(|s| s == w))
            .and_then(|g| g.first())
            .map_or(w, String::as_str)
    }

    /// The vector of `text` (see the module docs); all zeros for a text of stop words only.
    pub fn vector(&self, text: &str) -> Vec<f32> {
        let dims = self.dims.max(1);
        let mut v = vec![0f32; dims];
        for word in text.split(|c: char| !c.is_alphanumeric()) {
            if word.is_empty() {
                continue;
            }
            let lower = word.to_lowercase();
            if STOP_WORDS.contains(&lower.as_str()) {
                continue;
            }
            let slot = fnv1a(self.canonical(&lower).as_bytes()) % dims as u64;
            v[usize::try_from(slot).unwrap_or(0)] += 1.0;
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            for x in &mut v {
                *x /= norm;
            }
        }
        v
    }

    /// The answer to a request body `{"model", "input": text | [texts]}`, or the protocol's
    /// 400 message.
    pub(crate) fn answer(&self, body: &Value) -> Result<Value, String> {
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .ok_or("you must provide a model parameter")?;
        let inputs: Vec<&str> = match body.get("input") {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .map(|i| i.as_str().ok_or("'input' items must be strings"))
                .collect::<Result<_, _>>()?,
            _ => return Err("'input' must be a string or a non-empty list of strings".into()),
        };
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": self.vector(t)}))
            .collect();
        let tokens: usize = inputs.iter().map(|t| t.split_whitespace().count()).sum();
        Ok(json!({
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
    }
}

/// FNV-1a, 64 bits: a fixed hash, so vectors are the same in every process.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn synonyms_are_close_and_unrelated_texts_are_not() {
        let e = EmbeddingsScript::default().synonyms(["automobile", "car", "vehicle"]);
        let a = e.vector("The automobile needs new tyres");
        let b = e.vector("car tyres");
        let c = e.vector("Lunch is at noon");
        assert!(cosine(&a, &b) > 0.7, "{}", cosine(&a, &b));
        assert!(cosine(&a, &c).abs() < 1e-6);
        let n: f32 = a.iter().map(|x| x * x).sum();
        assert!((n - 1.0).abs() < 1e-5);
        assert_eq!(e.vector("the of and"), vec![0.0; 64]);
        assert_eq!(e.vector("Car"), e.vector("vehicle"));
    }

    #[test]
    fn answers_one_vector_per_input_in_order() {
        let e = EmbeddingsScript::default();
        let v = e
            .answer(&json!({"model": "m", "input": ["a b", "c"]}))
            .unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 2);
        assert_eq!(v["data"][1]["index"], 1);
        assert_eq!(v["usage"]["prompt_tokens"], 3);
        assert!(e.answer(&json!({"input": ["a"]})).is_err());
        assert!(e.answer(&json!({"model": "m", "input": []})).is_err());
        assert_eq!(
            e.answer(&json!({"model": "m", "input": "x"})).unwrap()["data"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }
}
