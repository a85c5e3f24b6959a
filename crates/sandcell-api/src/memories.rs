//! Memories: short texts a sandbox (`/v1/sandboxes/{id}/memories`) or its owner
//! (`/v1/memories`) keeps, found again by ranked search: full-text (bm25), fused with the
//! similarity of embeddings when the daemon has an embedding model ([`Ranking`]). A sandbox
//! made from a snapshot starts with the memories its origin had when the snapshot was taken.
//! `…/memories/infer` hands a text to the configured model, which extracts the facts to
//! remember in the background: an [`InferJob`] says how far it got.
//!
//! The request types carry their rules ([`MemoryText`], [`Category`], [`MemoryQuery`], and
//! [`Tags`] for metadata), so a request that breaks one is refused, naming the field, before
//! any handler runs; the rules themselves are in [`crate::rules`].

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

use crate::rules::{ValidationError, check_category, check_memory_text, check_query};
use crate::values::Tags;

/// The category of a memory added without one.
pub const DEFAULT_CATEGORY: &str = "general";
/// Memories one scope (a sandbox, or an owner's own) may hold.
pub const MAX_MEMORIES: u64 = 10_000;
/// Results of a search that asks for no `limit`.
pub const DEFAULT_SEARCH_LIMIT: u32 = 10;
/// The most results one search returns.
pub const MAX_SEARCH_LIMIT: u32 = 100;
/// Memories in a listing page that asks for no `limit`.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
/// The largest listing page.
pub const MAX_LIST_LIMIT: u32 = 1000;
/// The most facts one infer job adds (a model's longer list is cut, and the job says so).
pub const MAX_INFER_FACTS: usize = 50;

/// Defines a string newtype checked by `$check` when made and when deserialized.
macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident, $check:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Checks `value` and keeps it.
            pub fn new(value: impl Into<String>) -> Result<Self, ValidationError> {
                let value = value.into();
                $check(&value)?;
                Ok(Self(value))
            }

            /// The value as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The value, given back.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = ValidationError;
            fn try_from(value: &str) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

checked_string!(
    /// What a memory remembers: not blank, at most [`crate::rules::MAX_MEMORY_TEXT`] bytes.
    MemoryText,
    check_memory_text
);

checked_string!(
    /// A memory's category: 1 to [`crate::rules::MAX_CATEGORY`] of lowercase letters,
    /// digits, `-`, `_`, `.`.
    Category,
    check_category
);

checked_string!(
    /// What to search memories for: not blank, at most [`crate::rules::MAX_QUERY`] bytes;
    /// its words are looked for (any punctuation or search syntax in it is not syntax).
    MemoryQuery,
    check_query
);

/// `POST /v1/sandboxes/{id}/memories`, `POST /v1/memories`: something to remember.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AddMemory {
    /// What to remember: not blank, at most 64 KiB, no NUL.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub text: MemoryText,
    /// A category to filter by later (default `general`): lowercase letters, digits, `-`,
    /// `_`, `.`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[a-z0-9_.-]{1,64}$"))]
    pub category: Option<Category>,
    /// Metadata (at most 64 entries), kept and shown with it.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub metadata: Tags,
}

impl AddMemory {
    /// A memory of `text` in the default category, without metadata.
    pub fn text(text: MemoryText) -> Self {
        Self {
            text,
            category: None,
            metadata: Tags::default(),
        }
    }
}

/// `POST /v1/sandboxes/{id}/memories/infer`, `POST /v1/memories/infer`: a text the
/// configured model reads in the background, adding each fact it finds as a memory (of this
/// category and metadata, plus `source: infer`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InferMemories {
    /// The text to extract facts from: not blank, at most 64 KiB, no NUL.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub text: MemoryText,
    /// The category of the memories it adds (default `general`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[a-z0-9_.-]{1,64}$"))]
    pub category: Option<Category>,
    /// Metadata of the memories it adds (at most 63 entries: `source` is set to `infer`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub metadata: Tags,
}

impl InferMemories {
    /// Facts from `text`, in the default category, without metadata.
    pub fn text(text: MemoryText) -> Self {
        Self {
            text,
            category: None,
            metadata: Tags::default(),
        }
    }
}

impl From<AddMemory> for InferMemories {
    /// The same fields: the text to extract from, and the category and metadata of what is
    /// added.
    fn from(a: AddMemory) -> Self {
        Self {
            text: a.text,
            category: a.category,
            metadata: a.metadata,
        }
    }
}

/// Where an infer job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum InferStatus {
    /// Accepted, not started.
    Queued,
    /// The model is being asked, or its facts added.
    Running,
    /// Done: `memories` lists what it added (possibly nothing: no fact found).
    Succeeded,
    /// Ended without finishing: `error` says why (memories added before that stay, listed).
    Failed,
}

impl InferStatus {
    /// The wire name (`queued`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    /// The status of its wire name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Queued, Self::Running, Self::Succeeded, Self::Failed]
            .into_iter()
            .find(|x| x.as_str() == s)
    }

    /// Whether it has ended (`succeeded` or `failed`).
    pub fn is_done(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// A job extracting memories from a text with a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InferJob {
    /// Its id (`inf-…`).
    pub id: String,
    /// Where it is.
    pub status: InferStatus,
    /// Whose memories it adds: a sandbox's, or its owner's.
    pub scope: MemoryScope,
    /// The sandbox, for a sandbox's memories.
    pub sandbox_id: Option<String>,
    /// The model asked (`provider/model`).
    pub model: String,
    /// The category of the memories it adds.
    pub category: String,
    /// The ids of the memories it added, in the model's order.
    pub memories: Vec<String>,
    /// Why it failed (absent unless `failed`); `interrupted: …` when the process running it
    /// stopped first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it was accepted (RFC 3339).
    pub created_at: String,
    /// When its status last changed (RFC 3339).
    pub updated_at: String,
}

/// Infer jobs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InferJobList {
    /// The jobs.
    pub jobs: Vec<InferJob>,
    /// The next page: pass it as `cursor` (absent on the last page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET …/memories/infer?limit=&cursor=`: a page of a scope's infer jobs, newest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ListInferJobs {
    /// At most this many (1 to 1000; default 100).
    pub limit: Option<u32>,
    /// Where to go on: the previous page's `next_cursor`.
    pub cursor: Option<String>,
}

/// How a search ranked its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Ranking {
    /// Full-text (bm25) and embedding similarity, fused by reciprocal rank: a memory found by
    /// either is in the results.
    Hybrid,
    /// Full-text only: no embedding model is configured, or (with a `warning`) the
    /// embeddings endpoint failed.
    Fts,
}

/// How one search result was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    /// By the query's words only.
    Fts,
    /// By embedding similarity only (it shares no word with the query).
    Semantic,
    /// By both.
    Both,
}

/// `GET …/memories/search?q=&limit=&category=`: which memories to look for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SearchMemories {
    /// The words to look for; memories matching more of them, and rarer ones, come first.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub query: MemoryQuery,
    /// At most this many results (1 to 100; default 10).
    pub limit: Option<u32>,
    /// Only memories of this category.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[a-z0-9_.-]{1,64}$"))]
    pub category: Option<Category>,
}

impl SearchMemories {
    /// A search for `query` with the default limit, in every category.
    pub fn new(query: MemoryQuery) -> Self {
        Self {
            query,
            limit: None,
            category: None,
        }
    }
}

/// `GET …/memories?limit=&cursor=&category=`: a page of a scope's memories, newest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ListMemories {
    /// At most this many (1 to 1000; default 100).
    pub limit: Option<u32>,
    /// Where to go on: the previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Only memories of this category.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[a-z0-9_.-]{1,64}$"))]
    pub category: Option<Category>,
}

/// Whose a memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    /// One sandbox's (`sandbox_id` says which); forks of it inherit it.
    Sandbox,
    /// Its owner's, whatever the sandbox.
    Owner,
}

/// A memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Memory {
    /// Its id (`mem-…`).
    pub id: String,
    /// A sandbox's, or its owner's.
    pub scope: MemoryScope,
    /// The sandbox, for a sandbox's memory.
    pub sandbox_id: Option<String>,
    /// What is remembered.
    pub text: String,
    /// Its category.
    pub category: String,
    /// Its metadata.
    pub metadata: BTreeMap<String, String>,
    /// When it was remembered (RFC 3339; a fork's copy keeps its original's time).
    pub created_at: String,
    /// In search results: how well it matched, higher is better, comparable only within one
    /// search: bm25 negated when the search's `ranking` is `fts`, the reciprocal-rank-fusion
    /// score when `hybrid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// In search results: whether the words, the embedding, or both found it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_by: Option<MatchedBy>,
    /// In hybrid search results found by their embedding: its cosine similarity to the
    /// query's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f64>,
    /// On the answer to an add: what did not go as configured (the embeddings endpoint
    /// failed, so it is stored without an embedding until a hybrid search embeds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Memories: a listing page (newest first) or search results (best first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryList {
    /// The memories.
    pub memories: Vec<Memory>,
    /// A listing's next page: pass it as `cursor` (absent on the last page and in search
    /// results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// In search results: how they were ranked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranking: Option<Ranking>,
    /// In search results: what kept the search from ranking as configured (the embeddings
    /// endpoint failed, so `ranking` is `fts`), or what it left out (memories not embedded
    /// yet, matched by words only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_refuse_what_their_rules_refuse_naming_the_field() {
        let ok: AddMemory = serde_json::from_str(
            r#"{"text": "likes tea", "category": "prefs", "metadata": {"k": "v"}}"#,
        )
        .unwrap();
        assert_eq!(
            (ok.text.as_str(), ok.category.as_deref()),
            ("likes tea", Some("prefs"))
        );
        for (body, says) in [
            (r#"{"text": ""}"#.to_string(), "text must not be empty"),
            (
                format!(r#"{{"text": "{}"}}"#, "x".repeat(64 * 1024 + 1)),
                "over the 64 KiB limit",
            ),
            (
                r#"{"text": "a", "category": "Bad Category"}"#.to_string(),
                "category \"Bad Category\" must be",
            ),
            (r#"{"text": "a", "extra": 1}"#.to_string(), "extra"),
            (r#"{"category": "a"}"#.to_string(), "text"),
        ] {
            let err = serde_json::from_str::<AddMemory>(&body).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        let many: BTreeMap<String, String> =
            (0..=64).map(|i| (i.to_string(), String::new())).collect();
        let body = serde_json::json!({"text": "a", "metadata": many});
        assert!(serde_json::from_value::<AddMemory>(body).is_err());
        assert!(serde_json::from_str::<SearchMemories>(r#"{"query": " "}"#).is_err());
        assert!(MemoryQuery::new("\"NEAR( OR").is_ok());
    }

    #[test]
    fn a_memory_shows_its_score_only_in_search_results() {
        let m = Memory {
            id: "mem-0123456789abcdef".into(),
            scope: MemoryScope::Owner,
            sandbox_id: None,
            text: "t".into(),
            category: DEFAULT_CATEGORY.into(),
            metadata: BTreeMap::new(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            score: None,
            matched_by: None,
            similarity: None,
            warning: None,
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["scope"], "owner");
        assert!(v.get("score").is_none());
        let back: Memory = serde_json::from_value(v).unwrap();
        assert_eq!(back, m);
        let hit = Memory {
            score: Some(0.03),
            matched_by: Some(MatchedBy::Semantic),
            similarity: Some(0.8),
            ..m
        };
        let v = serde_json::to_value(&hit).unwrap();
        assert_eq!(
            (&v["matched_by"], &v["similarity"]),
            (&serde_json::json!("semantic"), &serde_json::json!(0.8))
        );
        let list = MemoryList {
            memories: vec![hit],
            next_cursor: None,
            ranking: Some(Ranking::Fts),
            warning: Some("w".into()),
        };
        let v = serde_json::to_value(&list).unwrap();
        assert_eq!(
            (&v["ranking"], &v["warning"]),
            (&serde_json::json!("fts"), &serde_json::json!("w"))
        );
    }

    #[test]
    fn infer_requests_have_the_add_rules_and_statuses_their_wire_names() {
        let ok: InferMemories =
            serde_json::from_str(r#"{"text": "I moved to Lisbon", "category": "facts"}"#).unwrap();
        assert_eq!(ok.category.as_deref(), Some("facts"));
        for body in [
            r#"{"text": " "}"#,
            r#"{"text": "a", "category": "No"}"#,
            r#"{"text": "a", "infer": true}"#,
        ] {
            assert!(
                serde_json::from_str::<InferMemories>(body).is_err(),
                "{body}"
            );
        }
        for s in [
            InferStatus::Queued,
            InferStatus::Running,
            InferStatus::Succeeded,
            InferStatus::Failed,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(InferStatus::parse(s.as_str()), Some(s));
        }
        assert!(InferStatus::Failed.is_done() && !InferStatus::Running.is_done());
        assert_eq!(InferStatus::parse("done"), None);
    }
}
